"""Checkpoint import/export (bert_jax.io.convert) without torch or TensorFlow.

HF-named state dicts are written here by hand, following transformers' BERT
names, so the mapping is checked against an independent spelling of them.
"""

import json
import os
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from bert_jax.io import checkpointing, convert, hf_weights, sources
from bert_jax.commands import convert as convert_cli
from bert_jax.settings.model import ModelConfig
from bert_jax.errors import ConfigError

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
VOCAB = SPECIALS + ["the", "cat", "sat", "on", "mat", "##s", "dog", "ran", ".", ",", "a",
                    "big", "red", "ball", "was", "here"]  # 21 tokens
V, D, F, LAYERS, HEADS = len(VOCAB), 8, 12, 2, 2
HF_CONFIG = {"architectures": ["BertForPreTraining"], "model_type": "bert",
             "vocab_size": V, "hidden_size": D, "num_hidden_layers": LAYERS,
             "num_attention_heads": HEADS, "intermediate_size": F, "hidden_act": "gelu",
             "max_position_embeddings": 16, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
             "initializer_range": 0.02, "hidden_dropout_prob": 0.1,
             "attention_probs_dropout_prob": 0.1}


def hf_state(seed=0, heads=True, prefix="bert."):
  """A random state dict with transformers' BertForPreTraining names and shapes."""
  rs = np.random.RandomState(seed)
  shapes = {"embeddings.word_embeddings.weight": (V, D),
            "embeddings.position_embeddings.weight": (16, D),
            "embeddings.token_type_embeddings.weight": (2, D),
            "embeddings.LayerNorm.weight": (D,), "embeddings.LayerNorm.bias": (D,),
            "pooler.dense.weight": (D, D), "pooler.dense.bias": (D,)}
  for i in range(LAYERS):
    p = f"encoder.layer.{i}."
    for n in ("query", "key", "value"):
      shapes[p + f"attention.self.{n}.weight"] = (D, D)
      shapes[p + f"attention.self.{n}.bias"] = (D,)
    shapes.update({p + "attention.output.dense.weight": (D, D),
                   p + "attention.output.dense.bias": (D,),
                   p + "attention.output.LayerNorm.weight": (D,),
                   p + "attention.output.LayerNorm.bias": (D,),
                   p + "intermediate.dense.weight": (F, D), p + "intermediate.dense.bias": (F,),
                   p + "output.dense.weight": (D, F), p + "output.dense.bias": (D,),
                   p + "output.LayerNorm.weight": (D,), p + "output.LayerNorm.bias": (D,)})
  state = {prefix + k: rs.randn(*s).astype(np.float32) for k, s in shapes.items()}
  if heads:
    state.update({k: rs.randn(*s).astype(np.float32) for k, s in {
        "cls.predictions.transform.dense.weight": (D, D),
        "cls.predictions.transform.dense.bias": (D,),
        "cls.predictions.transform.LayerNorm.weight": (D,),
        "cls.predictions.transform.LayerNorm.bias": (D,),
        "cls.predictions.bias": (V,), "cls.seq_relationship.weight": (2, D),
        "cls.seq_relationship.bias": (2,)}.items()})
  return state


def write_hf_dir(path, state=None, config=None, tokenizer_config=None, vocab=VOCAB):
  path.mkdir(parents=True, exist_ok=True)
  if state is not None:
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
  if config is not False:
    (path / "config.json").write_text(json.dumps(config or HF_CONFIG))
  if tokenizer_config is not None:
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
  if vocab is not None:
    (path / "vocab.txt").write_text("".join(t + "\n" for t in vocab))
  return str(path)


def tiny_config(**kw):
  return ModelConfig(vocab_size=V, hidden_size=D, num_layers=LAYERS, num_heads=HEADS,
                    intermediate_size=F, max_position_embeddings=16, **kw)


def assert_states_equal(a, b):
  assert sorted(a) == sorted(b)
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)


# --- pure mappings -------------------------------------------------------------


def test_hf_state_survives_import_and_export_bit_exactly():
  state = hf_state()
  params, report = hf_weights.hf_state_to_params(state, tiny_config(), source="test")
  assert set(report.groups.values()) == {"imported"}
  assert_states_equal(hf_weights.params_to_hf_state(params, tiny_config()), state)


def test_attention_kernels_are_split_into_heads_like_hf_reshapes():
  state = hf_state()
  params, _ = hf_weights.hf_state_to_params(state, tiny_config(), source="test")
  q = params["bert"]["layer_0"]["attention"]["query"]["kernel"]  # [D, H, K]
  w = state["bert.encoder.layer.0.attention.self.query.weight"]  # [out, in]
  # HF: x @ W.T, then view(..., H, K): output feature h*K + k is head h, slot k.
  np.testing.assert_array_equal(q[:, 1, 2], w[1 * (D // HEADS) + 2, :])


def test_bertmodel_names_import_the_same_encoder_as_pretraining_names():
  with_prefix, _ = hf_weights.hf_state_to_params(hf_state(), tiny_config(), source="t")
  bare = hf_state(heads=False, prefix="")
  without, report = hf_weights.hf_state_to_params(bare, tiny_config(), source="t")
  assert report.groups == {"encoder": "imported", "pooler": "imported",
                           "mlm": "initialised", "nsp": "initialised"}
  enc = hf_weights.params_to_hf_state(with_prefix, tiny_config())
  enc2 = hf_weights.params_to_hf_state(without, tiny_config())
  for k in enc:
    if k.startswith("bert."):
      np.testing.assert_array_equal(enc[k], enc2[k], err_msg=k)


def test_legacy_layernorm_gamma_beta_names_are_accepted():
  state = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias",
                                                                    "LayerNorm.beta"): v
           for k, v in hf_state().items()}
  params, _ = hf_weights.hf_state_to_params(state, tiny_config(), source="t")
  assert_states_equal(hf_weights.params_to_hf_state(params, tiny_config()), hf_state())


def tf_variables(state):
  """google-research/bert names for a HF state: kernels [in, out], LayerNorm gamma/beta."""
  out = {"global_step": np.int64(7)}
  for name, x in state.items():
    tf = name.replace("encoder.layer.", "encoder/layer_").replace(".", "/")
    tf = tf.replace("/LayerNorm/weight", "/LayerNorm/gamma").replace("/LayerNorm/bias",
                                                                     "/LayerNorm/beta")
    if tf.endswith("_embeddings/weight"):
      tf = tf[:-len("/weight")]
    elif name == "cls.predictions.bias":
      tf = "cls/predictions/output_bias"
    elif name.startswith("cls.seq_relationship."):
      tf = "cls/seq_relationship/output_" + ("weights" if name.endswith("weight") else "bias")
    elif tf.endswith("/weight") and x.ndim == 2:
      tf, x = tf[:-len("weight")] + "kernel", x.T
    out[tf] = x
    out[tf + "/adam_m"] = np.zeros_like(x)
    out[tf + "/adam_v"] = np.zeros_like(x)
  return out


def test_tf_variable_names_map_to_hf_names():
  state = hf_state()
  tf = tf_variables(state)
  assert "bert/encoder/layer_1/attention/self/query/kernel" in tf  # the test's own spelling
  assert "cls/seq_relationship/output_weights" in tf
  assert_states_equal(hf_weights.tf_to_hf(tf), state)


# --- settings taken from the source ---------------------------------------------


@pytest.mark.parametrize("act,approximate", [("gelu", False), ("gelu_new", True),
                                             ("gelu_pytorch_tanh", True)])
def test_activation_maps_to_exact_or_tanh_gelu(act, approximate):
  config = hf_weights.bert_config_from_hf({**HF_CONFIG, "hidden_act": act}, "config.json")
  assert config.gelu_approximate is approximate


def test_config_settings_come_from_the_source():
  hf = {**HF_CONFIG, "layer_norm_eps": 1e-7, "initializer_range": 0.05, "type_vocab_size": 4,
        "max_position_embeddings": 40, "hidden_dropout_prob": 0.2}
  c = hf_weights.bert_config_from_hf(hf, "config.json")
  assert (c.layer_norm_eps, c.initializer_range, c.type_vocab_size,
          c.max_position_embeddings, c.dropout_rate) == (1e-7, 0.05, 4, 40, 0.2)
  assert (c.dtype, c.vocab_pad_multiple) == ("float32", 1)
  back = hf_weights.hf_config_from_bert(c)
  assert {k: back[k] for k in hf if k != "architectures"} == {
      k: v for k, v in hf.items() if k != "architectures"}


# --- the CLI: import ------------------------------------------------------------


def test_import_writes_a_checkpoint_that_restore_params_reads(tmp_path, capsys):
  state = hf_state()
  hf_dir = write_hf_dir(tmp_path / "hf", state, tokenizer_config={"do_lower_case": False})
  assert convert_cli.main(["from-hf", hf_dir, str(tmp_path / "out")]) == 0
  params, meta = checkpointing.restore_params(str(tmp_path / "out"))
  assert meta["vocab"] == VOCAB and meta["lowercase"] is False and meta["step"] == 0
  assert meta["source"] == f"huggingface:{hf_dir}"
  assert meta["heads"] == {"encoder": "imported", "pooler": "imported", "mlm": "imported",
                           "nsp": "imported"}
  config = ModelConfig.from_dict(meta["model_config"])
  assert config == hf_weights.bert_config_from_hf(HF_CONFIG, "x")
  assert_states_equal(hf_weights.params_to_hf_state(params, config), state)
  assert "imported huggingface:" in capsys.readouterr().out


def test_missing_pooler_and_heads_are_initialised_and_reported(tmp_path, capsys):
  state = {k: v for k, v in hf_state(heads=False, prefix="").items()
           if not k.startswith("pooler.")}
  hf_dir = write_hf_dir(tmp_path / "hf", state)
  assert convert_cli.main(["from-hf", hf_dir, str(tmp_path / "out")]) == 0
  out = capsys.readouterr().out
  assert "pooler: initialised" in out and "MLM head (cls.predictions.*): initialised" in out
  params, meta = checkpointing.restore_params(str(tmp_path / "out"))
  assert meta["heads"]["pooler"] == "initialised"
  kernel = np.asarray(params["bert"]["pooler"]["kernel"])
  assert kernel.std() > 0 and np.abs(kernel).max() <= 2 * 0.02 + 1e-6  # truncated normal


def test_no_heads_ignores_the_sources_heads(tmp_path):
  state = hf_state()
  hf_dir = write_hf_dir(tmp_path / "hf", state)
  assert convert_cli.main(["from-hf", hf_dir, str(tmp_path / "out"), "--no-heads"]) == 0
  params, meta = checkpointing.restore_params(str(tmp_path / "out"))
  assert meta["heads"]["mlm"] == meta["heads"]["nsp"] == "initialised"
  assert not np.allclose(params["nsp"]["bias"], state["cls.seq_relationship.bias"])


@pytest.mark.parametrize("tok_config,name,expected", [
    ({"do_lower_case": False}, "hf", False),
    (None, "bert-base-cased", False),
    (None, "bert-base-uncased", True),
    (None, "model", True),
])
def test_lowercase_comes_from_tokenizer_config_else_the_name(tmp_path, tok_config, name,
                                                             expected):
  hf_dir = write_hf_dir(tmp_path / name, tokenizer_config=tok_config)
  assert sources.resolve_lowercase(hf_dir, HF_CONFIG, None)[0] is expected


# --- the CLI: export ------------------------------------------------------------


def test_import_export_import_is_lossless(tmp_path):
  hf_dir = write_hf_dir(tmp_path / "hf", hf_state())
  assert convert_cli.main(["from-hf", hf_dir, str(tmp_path / "a")]) == 0
  assert convert_cli.main(["to-hf", str(tmp_path / "a"), str(tmp_path / "hf2")]) == 0
  assert convert_cli.main(["from-hf", str(tmp_path / "hf2"), str(tmp_path / "b")]) == 0
  pa, ma = checkpointing.restore_params(str(tmp_path / "a"))
  pb, mb = checkpointing.restore_params(str(tmp_path / "b"))
  for x, y in zip(*(jax_leaves(p) for p in (pa, pb))):
    np.testing.assert_array_equal(x, y)
  assert (ma["model_config"], ma["vocab"], ma["lowercase"]) == (
      mb["model_config"], mb["vocab"], mb["lowercase"])


def jax_leaves(tree):
  import jax
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_export_of_a_training_workdir_cuts_the_padded_vocabulary(tmp_path):
  import jax
  config = tiny_config(vocab_pad_multiple=8)  # 21 -> 24 rows
  params, _ = hf_weights.hf_state_to_params(hf_state(), config, source="t")
  params["bert"]["embeddings"]["word_embeddings"]["embedding"][V:] = 1.0  # must be cut
  params["mlm_bias"][V:] = 1.0
  mngr = checkpointing.manager(str(tmp_path / "run" / "checkpoints"), async_save=False)
  checkpointing.save(mngr, 12, params, {"mu": jax.tree.map(np.zeros_like, params)},
                     {"step": 12, "model_config": config.to_dict(), "vocab": VOCAB,
                      "lowercase": True, "data_position": 5})
  mngr.close()
  assert convert_cli.main(["to-hf", str(tmp_path / "run"), str(tmp_path / "hf")]) == 0
  state = load_file(str(tmp_path / "hf" / "model.safetensors"))
  word = params["bert"]["embeddings"]["word_embeddings"]["embedding"]
  assert word.shape[0] == 24
  np.testing.assert_array_equal(state["bert.embeddings.word_embeddings.weight"], word[:V])
  np.testing.assert_array_equal(state["cls.predictions.bias"], params["mlm_bias"][:V])
  hf_config = json.loads((tmp_path / "hf" / "config.json").read_text())
  assert hf_config["vocab_size"] == V
  tok_config = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
  assert tok_config["do_lower_case"] is True
  assert (tmp_path / "hf" / "vocab.txt").read_text().split("\n")[:-1] == VOCAB


# --- bad input --------------------------------------------------------------------


def _bad_cases(tmp_path):
  good = hf_state()
  wrong_shape = dict(good)
  wrong_shape["bert.encoder.layer.1.intermediate.dense.weight"] = np.zeros((F + 1, D), np.float32)
  extra_layer = dict(good)
  extra_layer["bert.encoder.layer.2.output.dense.bias"] = np.zeros(D, np.float32)
  missing = {k: v for k, v in good.items() if "layer.1.attention.self.key.bias" not in k}
  return {
      "no-dir": (str(tmp_path / "nope"), "no such directory"),
      "no-config": (write_hf_dir(tmp_path / "a", good, config=False), "config.json: no such file"),
      "no-weights": (write_hf_dir(tmp_path / "b", None), "no weights"),
      "no-vocab": (write_hf_dir(tmp_path / "c", good, vocab=None), "no vocab.txt and no tokenizer.json"),
      "config-not-json": (_write(write_hf_dir(tmp_path / "d", good), "config.json", "{oops"),
                          "config.json: not valid JSON"),
      "config-missing-field": (write_hf_dir(tmp_path / "e", good, config={
          k: v for k, v in HF_CONFIG.items() if k != "num_attention_heads"}),
          "config.json: missing field 'num_attention_heads'"),
      "bad-activation": (write_hf_dir(tmp_path / "f", good, config={
          **HF_CONFIG, "hidden_act": "relu"}), "hidden_act 'relu' is not supported"),
      "shape-mismatch": (write_hf_dir(tmp_path / "g", wrong_shape),
                         "model.safetensors: tensor 'bert.encoder.layer.1.intermediate.dense."
                         f"weight' has shape ({F + 1}, {D}); the config expects ({F}, {D})"),
      "unexpected-tensor": (write_hf_dir(tmp_path / "h", extra_layer),
                            "unexpected tensor 'bert.encoder.layer.2.output.dense.bias'"),
      "missing-tensor": (write_hf_dir(tmp_path / "i", missing),
                         "missing tensor 'bert.encoder.layer.1.attention.self.key.bias'"),
      "vocab-size": (write_hf_dir(tmp_path / "j", good, vocab=VOCAB[:-1]),
                     f"vocab.txt has {V - 1} tokens but"),
      "not-bert": (write_hf_dir(tmp_path / "k", good, config={**HF_CONFIG,
                                                               "model_type": "roberta"}),
                   "model_type is 'roberta'; expected 'bert' or 'modernbert'"),
      "corrupt-weights": (_write(write_hf_dir(tmp_path / "l", None), "model.safetensors",
                                 "garbage"), "model.safetensors: cannot read safetensors"),
  }


def _write(directory, name, text):
  with open(os.path.join(directory, name), "w") as f:
    f.write(text)
  return directory


BAD = ["no-dir", "no-config", "no-weights", "no-vocab", "config-not-json",
       "config-missing-field", "bad-activation", "shape-mismatch", "unexpected-tensor",
       "missing-tensor", "vocab-size", "not-bert", "corrupt-weights"]


@pytest.mark.parametrize("case", BAD)
def test_bad_source_is_one_line_error_and_writes_nothing(tmp_path, capsys, case):
  source, message = _bad_cases(tmp_path)[case]
  out_dir = tmp_path / "out"
  assert convert_cli.main(["from-hf", source, str(out_dir)]) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: ") and err.count("\n") == 1, err
  assert message in err
  assert not out_dir.exists()
  assert not [p for p in os.listdir(tmp_path) if p.startswith(".out")]


def test_non_empty_output_is_refused_and_kept_unless_overwrite(tmp_path, capsys):
  hf_dir = write_hf_dir(tmp_path / "hf", hf_state())
  out_dir = tmp_path / "out"
  out_dir.mkdir()
  (out_dir / "keep.txt").write_text("mine")
  assert convert_cli.main(["from-hf", hf_dir, str(out_dir)]) == 2
  assert "exists and is not empty; pass --overwrite" in capsys.readouterr().err
  assert (out_dir / "keep.txt").read_text() == "mine"
  assert convert_cli.main(["from-hf", hf_dir, str(out_dir), "--overwrite"]) == 0
  assert not (out_dir / "keep.txt").exists()
  assert checkpointing.restore_params(str(out_dir))[1]["step"] == 0


def test_an_output_that_is_inside_or_holds_what_is_read_is_refused_and_nothing_changes(
    tmp_path, capsys):
  """`to-hf RUN RUN --overwrite` once replaced a run's checkpoints with the export; the
  same for an import written over its source, and for finetune --save."""
  hf_dir = write_hf_dir(tmp_path / "src", hf_state())
  run = str(tmp_path / "run")
  assert convert_cli.main(["from-hf", hf_dir, run]) == 0
  capsys.readouterr()
  files = lambda: sorted(os.path.relpath(os.path.join(d, f), tmp_path)
                         for d, _, fs in os.walk(tmp_path) for f in fs)
  before = files()
  cases = [(["to-hf", run, run], f"OUT_HF_DIR {run} is CKPT {run}"),
           (["to-hf", run, run + "/checkpoints"], "is inside CKPT"),
           (["to-hf", run + "/checkpoints/0", run], "holds CKPT"),
           (["to-hf", run, str(tmp_path)], "holds CKPT"),
           (["to-hf", run, os.path.join(run, "..", "run")], "is CKPT"),
           (["from-hf", hf_dir, hf_dir], "is the source"),
           (["from-hf", hf_dir, str(tmp_path)], "holds the source")]
  for args, message in cases:
    assert convert_cli.main(args + ["--overwrite"]) == 2, args
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err, (args, err)
    assert "nothing was written" in err
    assert files() == before, args
  # The library refuses it too, before reading (a bucket's case: test_gcs).
  with pytest.raises(ConfigError, match="is inside the checkpoint"):
    convert.export_hf(run, run + "/hf", overwrite=True)
  from bert_jax.commands import finetune as finetune_cli
  assert finetune_cli.main(["--checkpoint", run, "--task", str(tmp_path / "nope"),
                            "--save", run + "/checkpoints", "--overwrite"]) == 2
  assert "--save " + run + "/checkpoints is inside --checkpoint" in capsys.readouterr().err
  assert files() == before


def test_export_errors_are_one_line_and_keep_the_output(tmp_path, capsys):
  assert convert_cli.main(["to-hf", str(tmp_path / "nothing"), str(tmp_path / "hf")]) == 2
  assert "no such directory" in capsys.readouterr().err and not (tmp_path / "hf").exists()
  hf_dir = write_hf_dir(tmp_path / "src", hf_state())
  assert convert_cli.main(["from-hf", hf_dir, str(tmp_path / "ckpt")]) == 0
  (tmp_path / "hf").mkdir()
  (tmp_path / "hf" / "config.json").write_text("mine")
  assert convert_cli.main(["to-hf", str(tmp_path / "ckpt"), str(tmp_path / "hf")]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "exists and is not empty; pass --overwrite" in err
  assert (tmp_path / "hf" / "config.json").read_text() == "mine"


def test_failure_while_writing_leaves_no_output(tmp_path, monkeypatch):
  hf_dir = write_hf_dir(tmp_path / "hf", hf_state())

  def half_written(directory, step, params, meta):
    os.makedirs(os.path.join(directory, "checkpoints", "0"))
    raise OSError("disk full")

  monkeypatch.setattr(checkpointing, "save_params", half_written)
  with pytest.raises(OSError):
    convert_cli.main(["from-hf", hf_dir, str(tmp_path / "out")])
  assert sorted(os.listdir(tmp_path)) == ["hf"]


def test_pytorch_bin_without_torch_is_a_clear_error(tmp_path, capsys, monkeypatch):
  hf_dir = write_hf_dir(tmp_path / "hf")
  (tmp_path / "hf" / "pytorch_model.bin").write_bytes(b"not read")
  monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
  assert convert_cli.main(["from-hf", hf_dir, str(tmp_path / "out")]) == 2
  err = capsys.readouterr().err
  assert "pytorch_model.bin: reading pytorch_model.bin needs torch" in err
  assert not (tmp_path / "out").exists()


def test_pytorch_bin_is_loaded_weights_only(tmp_path):
  torch = pytest.importorskip("torch")
  state = hf_state()
  hf_dir = write_hf_dir(tmp_path / "hf")
  torch.save({k: torch.from_numpy(v) for k, v in state.items()},
             str(tmp_path / "hf" / "pytorch_model.bin"))
  assert convert_cli.main(["from-hf", hf_dir, str(tmp_path / "out")]) == 0
  params, meta = checkpointing.restore_params(str(tmp_path / "out"))
  assert_states_equal(hf_weights.params_to_hf_state(
      params, ModelConfig.from_dict(meta["model_config"])), state)


def test_from_tf_without_tensorflow_says_so(tmp_path, capsys, monkeypatch):
  tf_dir = tmp_path / "tf"
  write_hf_dir(tf_dir, config=False)
  (tf_dir / "bert_config.json").write_text(json.dumps(HF_CONFIG))
  (tf_dir / "bert_model.ckpt.index").write_bytes(b"")
  monkeypatch.setitem(sys.modules, "tensorflow", None)
  assert convert_cli.main(["from-tf", str(tf_dir), str(tmp_path / "out")]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "needs TensorFlow, which is not installed" in err
  assert "bert_model.ckpt" in err and not (tmp_path / "out").exists()


def test_from_tf_reads_a_real_tensorflow_checkpoint(tmp_path):
  tf = pytest.importorskip("tensorflow")
  state = hf_state()
  variables = tf_variables(state)
  tf_dir = tmp_path / "uncased_L-2_H-8"
  write_hf_dir(tf_dir, config=False)
  (tf_dir / "bert_config.json").write_text(json.dumps(
      {k: v for k, v in HF_CONFIG.items() if k not in ("architectures", "model_type")}))
  names = sorted(variables)
  tf.raw_ops.SaveV2(prefix=str(tf_dir / "bert_model.ckpt"), tensor_names=names,
                    shape_and_slices=[""] * len(names),
                    tensors=[tf.constant(variables[n]) for n in names])
  assert convert_cli.main(["from-tf", str(tf_dir), str(tmp_path / "out")]) == 0
  params, meta = checkpointing.restore_params(str(tmp_path / "out"))
  assert meta["lowercase"] is True and meta["source"].startswith("tensorflow:")
  assert_states_equal(hf_weights.params_to_hf_state(
      params, ModelConfig.from_dict(meta["model_config"])), state)


def test_import_of_weights_with_nan_or_inf_warns_once_naming_the_tensors(tmp_path, capsys):
  state = hf_state()
  state["bert.encoder.layer.1.output.dense.weight"][0, 0] = np.nan
  state["cls.predictions.bias"][3] = -np.inf
  hf_dir = write_hf_dir(tmp_path / "hf", state)
  assert convert_cli.main(["from-hf", hf_dir, str(tmp_path / "out")]) == 0
  err = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
  assert len(err) == 1 and err[0].startswith("warning:"), err
  assert "model.safetensors" in err[0] and "2 tensor(s)" in err[0]
  assert "bert.encoder.layer.1.output.dense.weight" in err[0] and "cls.predictions.bias" in err[0]
  params, meta = checkpointing.restore_params(str(tmp_path / "out"))  # imported as they are
  assert_states_equal(hf_weights.params_to_hf_state(
      params, ModelConfig.from_dict(meta["model_config"])), state)
  assert hf_weights.non_finite_tensors(hf_state()) == []
  assert hf_weights.non_finite_tensors({"b": np.array([1.0, np.inf]), "a": np.array([np.nan]),
                                     "i": np.array([1, 2])}) == ["a", "b"]
