"""Continued pre-training (`--config.init_from`): sources, step 0, resume, bad input.

The source is a small random `transformers.BertForPreTraining` saved with
`save_pretrained(safe_serialization=True)` and a vocab.txt trained on the toy corpus.
"""

import glob
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bert_jax import default_config
from bert_jax.data import dataset, input_pipeline
from bert_jax.io import checkpointing, convert
from bert_jax.commands import convert as convert_cli
from bert_jax import settings as settings_lib
from bert_jax.train import init_from
from bert_jax.errors import ConfigError  # noqa: E402
from bert_jax.data.tokenizer import Tokenizer  # noqa: E402
from bert_jax.trainer import make_steps, train_and_evaluate  # noqa: E402
import soak_kill  # noqa: E402

pytestmark = pytest.mark.slow  # trains or starts processes: the full suite, not the fast tier

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOY = os.path.join(ROOT, "data", "corpus.txt")
SEQ, PREDS, BATCH = 32, 5, 16
# A config file for train.py: the shipped defaults, a small run (no model shape fields:
# the source decides them).
CONFIG_FILE = '''
from bert_jax import default_config
def get_config():
  c = default_config.get_config()
  c.data.corpus = {corpus!r}
  c.data.dupe_factor = 2
  c.data.max_eval_examples = 64
  c.model.dtype = "float32"
  c.train.batch_size = {batch}
  c.train.num_steps = 8
  c.train.learning_rate = 1e-3
  c.train.warmup_steps = 2
  c.train.phase_fractions, c.train.seq_lens, c.train.max_predictions = (1.0,), ({seq},), ({preds},)
  c.log_every = c.eval_every = c.checkpoint_every = 4
  c.eval_batches = 1
  c.progress_bar = False
  c.compile_cache_dir = ""
  return c
'''


def toy_texts():
  with open(TOY, encoding="utf-8") as f:
    return [part for line in f for part in line.strip().split("\t") if part]


def write_source(path, heads=True, seed=0, texts=None):
  """A random BertForPreTraining (hidden 32, 2 layers) as a HuggingFace directory."""
  tok = Tokenizer.train(texts or toy_texts(), 200, lowercase=True)
  cfg = transformers.BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                                num_attention_heads=2, intermediate_size=64,
                                max_position_embeddings=64, hidden_act="gelu")
  torch.manual_seed(seed)
  model = transformers.BertForPreTraining(cfg).eval()
  os.makedirs(path, exist_ok=True)
  model.save_pretrained(path, safe_serialization=True)
  tok.save(path)  # vocab.txt (+ our tokenizer_config.json, which HF ignores)
  os.remove(os.path.join(path, "tokenizer_config.json"))
  if not heads:
    state = {k: v for k, v in load_file(os.path.join(path, "model.safetensors")).items()
             if not k.startswith("cls.")}
    save_file(state, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
  return str(path)


def config(source, cache, steps=8, corpus=TOY, **fields):
  ns = {}
  exec(CONFIG_FILE.format(corpus=corpus, batch=BATCH, seq=SEQ, preds=PREDS), ns)  # pylint: disable=exec-used
  c = ns["get_config"]()
  c.init_from = source
  c.data.cache_dir = str(cache)
  c.train.num_steps = steps
  c.update_from_flattened_dict(fields)
  return c


def metrics(workdir):
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return [json.loads(l) for l in f if l.startswith("{")]


def params_at(workdir, step=None):
  params, meta = checkpointing.restore_params(str(workdir), step=step)
  return jax.device_get(params), meta


def assert_identical(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(x, y)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
  return tmp_path_factory.mktemp("init_from")


@pytest.fixture(scope="module")
def source(base):
  return write_source(str(base / "hf_source"))


@pytest.fixture(scope="module")
def run(base, source):
  """One continued run of 8 steps from the HF source."""
  workdir = str(base / "run")
  train_and_evaluate(config(source, base / "prepared"), workdir)
  return workdir


def test_step0_losses_equal_transformers_on_the_same_masked_batch(run, source, base):
  row = next(r for r in metrics(run) if r["split"] == "eval" and r["step"] == 0)
  c = config(source, base / "prepared")
  s = settings_lib.from_config(c)
  src = init_from.resolve(s)
  s = init_from.run_settings(s, src)
  tok = src.tokenizer
  steps = make_steps(s, tok.vocab_size, tok.special_ids())
  directory = glob.glob(str(base / "prepared" / "*"))[0]
  batch = next(iter(input_pipeline.eval_batches(dataset.open_split(directory, SEQ, "eval"),
                                                BATCH, 0, 1)))
  masked = jax.device_get(steps._mask(jax.random.fold_in(steps.eval_key, 0),  # pylint: disable=protected-access
                                      batch, PREDS))
  hf = transformers.BertForPreTraining.from_pretrained(source).eval()
  with torch.no_grad():
    out = hf(input_ids=torch.from_numpy(np.asarray(masked.ids_BxL)).long(),
             token_type_ids=torch.from_numpy(batch.segment_ids_BxL).long(),
             attention_mask=torch.from_numpy(batch.input_mask_BxL).long())
  logits = out.prediction_logits.numpy()
  pos, labels, w = (np.asarray(masked.positions_BxP), np.asarray(masked.labels_BxP),
                    np.asarray(masked.weights_BxP))
  picked = np.take_along_axis(logits, pos[..., None], axis=1).astype(np.float64)
  logp = picked - np.log(np.exp(picked - picked.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
      - picked.max(-1, keepdims=True)
  mlm = -(np.take_along_axis(logp, labels[..., None], -1)[..., 0] * w).sum() / w.sum()
  nsp_logits = out.seq_relationship_logits.numpy().astype(np.float64)
  nsp_logp = nsp_logits - np.log(np.exp(nsp_logits).sum(-1, keepdims=True))
  em = batch.example_mask_B.astype(np.float64)
  nsp = -(nsp_logp[np.arange(len(em)), batch.next_sentence_label_B] * em).sum() / em.sum()
  assert abs(row["mlm_loss"] - mlm) < 1e-4 and abs(row["nsp_loss"] - nsp) < 1e-4, (row, mlm, nsp)


def test_step0_checkpoint_exports_the_source_bit_for_bit(run, source, base):
  """"Zero training steps": the run's step-0 checkpoint is the imported source, untrained."""
  out = str(base / "export0")
  assert convert_cli.main(["to-hf", run, out, "--step", "0"]) == 0
  ours, theirs = load_file(os.path.join(out, "model.safetensors")), load_file(
      os.path.join(source, "model.safetensors"))
  for name, x in theirs.items():
    if name in ("cls.predictions.decoder.weight", "bert.embeddings.position_ids"):
      continue  # tied to the word embeddings / a buffer
    np.testing.assert_array_equal(ours[name], x, err_msg=name)
  assert open(os.path.join(out, "vocab.txt")).read() == open(os.path.join(source, "vocab.txt")).read()


def test_run_logs_step0_trains_and_exports(run, base):
  rows = metrics(run)
  evals = [r["step"] for r in rows if r["split"] == "eval"]
  assert evals[0] == 0 and evals[-1] == 8 and evals.count(0) == 1
  assert os.path.isfile(os.path.join(run, "training_curves.png"))
  out = str(base / "export8")
  assert convert_cli.main(["to-hf", run, out]) == 0
  transformers.BertForPreTraining.from_pretrained(out)


def test_rerun_resumes_and_says_init_from_was_not_used(run, source, base, capsys):
  train_and_evaluate(config(source, base / "prepared", steps=9), run)
  out = capsys.readouterr().out
  assert "was not used again" in out and "resumed from" in out
  assert [r["step"] for r in metrics(run) if r["split"] == "eval"].count(0) == 1


def test_init_from_a_workdir_and_a_convert_checkpoint(run, source, base):
  want, _ = params_at(run)  # the run's newest step
  new = str(base / "from_workdir")
  train_and_evaluate(config(run, base / "prepared", steps=1), new)
  assert_identical(params_at(new, 0)[0], want)
  ckpt = str(base / "converted")
  assert convert_cli.main(["from-hf", source, ckpt]) == 0
  new2 = str(base / "from_convert")
  train_and_evaluate(config(os.path.join(ckpt, "checkpoints", "0"), base / "prepared", steps=1),
                     new2)
  # convert writes the vocabulary unpadded; the run pads it to vocab_pad_multiple with zeros
  for x, y in zip(jax.tree.leaves(params_at(new2, 0)[0]), jax.tree.leaves(params_at(ckpt)[0]),
                  strict=True):
    np.testing.assert_array_equal(x[:len(y)], y)
    assert not np.any(x[len(y):])


def test_source_without_heads_initialises_and_reports_them(base, capsys):
  src = write_source(str(base / "no_heads"), heads=False)
  workdir = str(base / "no_heads_run")
  train_and_evaluate(config(src, base / "prepared", steps=1), workdir)
  out = capsys.readouterr().out
  assert "encoder imported" in out and "MLM head (cls.predictions.*) initialised" in out
  assert "NSP head (cls.seq_relationship.*) initialised (not in the source)" in out


def test_num_steps_0_of_a_source_without_heads_says_its_heads_are_random(base, capsys):
  # The source's evaluation (num_steps=0) reads the heads: of a model without them
  # (a sentence-embedding model) its MLM accuracy is of random weights, and says so.
  src = write_source(str(base / "no_heads0"), heads=False)
  train_and_evaluate(config(src, base / "prepared", steps=0), str(base / "no_heads0_run"))
  warnings = [l for l in capsys.readouterr().err.splitlines() if "freshly initialised" in l]
  assert warnings == [
      "warning: --config.init_from: the MLM head (cls.predictions.*) and the NSP head "
      "(cls.seq_relationship.*) of this evaluation were freshly initialised (not in the "
      "source), so their accuracies are of random weights, not of the source"]


def test_sigkill_and_rerun_equals_an_uninterrupted_continued_run(run, source, base):
  cfg_path = base / "cli_config.py"
  cfg_path.write_text(CONFIG_FILE.format(corpus=TOY, batch=BATCH, seq=SEQ, preds=PREDS))
  workdir = str(base / "killed")
  argv = [sys.executable, os.path.join(ROOT, "train.py"), "--config", str(cfg_path),
          "--workdir", workdir, f"--config.init_from={source}",
          f"--config.data.cache_dir={base / 'prepared'}"]
  env = soak_kill.subprocess_env()
  start = lambda: subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,  # noqa: E731
                                   stderr=subprocess.DEVNULL)
  assert soak_kill.kill_once(start, lambda proc: soak_kill.wait_for_step(proc, workdir, 5))
  done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  assert "was not used again" in done.stdout
  assert_identical(params_at(workdir)[0], params_at(run, 8)[0])  # run may have gone on to 9


def _nothing_written(workdir):
  return not os.path.exists(workdir)


@pytest.mark.parametrize("change, match", [
    (lambda c, b: setattr(c, "init_from", str(b / "missing")), "no such file or directory"),
    (lambda c, b: setattr(c, "init_from", str(b)), "not a recognised BERT source"),
    (lambda c, b: setattr(c.model, "hidden_size", 64),
     r"--config.model.hidden_size=64 contradicts .*hidden_size=32"),
    (lambda c, b: setattr(c.data, "vocab_file", os.path.join(c.init_from, "vocab.txt")),
     "--config.data.vocab_file=.* with --config.init_from"),
    (lambda c, b: setattr(c.data, "extend_vocab", -1), r"--config.data.extend_vocab=-1"),
    (lambda c, b: setattr(c.train, "seq_lens", (128,)), "above the 64 positions"),
])
def test_bad_input_is_one_error_line_and_writes_nothing(source, base, change, match):
  c = config(source, base / "bad_prepared")
  change(c, base)
  workdir = str(base / "bad_run")
  with pytest.raises(ConfigError, match=match) as e:
    train_and_evaluate(c, workdir)
  assert "\n" not in str(e.value)
  assert _nothing_written(workdir) and not os.path.exists(base / "bad_prepared")


@pytest.mark.parametrize("field, value", [("model.max_position_embeddings", 512),
                                          ("data.tokenizer", "bpe"),
                                          ("data.vocab_size", 30522)])
def test_a_flag_the_source_decides_is_refused_even_at_the_defaults_value(source, base, field,
                                                                         value):
  """--config.model.local_attention=128 (the default) once trained with the source's 32
  without a word; data.tokenizer and data.vocab_size were ignored silently."""
  c = config(source, base / "bad_prepared")
  c.update_from_flattened_dict({field: value})
  workdir = str(base / "bad_run")
  with pytest.raises(ConfigError, match=rf"--config.{field}={value!r} contradicts") as e:
    train_and_evaluate(c, workdir, explicit={field})
  assert "\n" not in str(e.value)
  assert _nothing_written(workdir) and not os.path.exists(base / "bad_prepared")


def test_a_config_files_vocabulary_settings_are_said_not_used(source, base, capsys):
  from bert_jax import settings
  c = config(source, base / "bad_prepared")
  c.update_from_flattened_dict({"data.vocab_size": 1000, "data.tokenizer": "bpe"})
  init_from.resolve(settings.from_config(c))
  assert ("init_from: the config's data.tokenizer='bpe' and data.vocab_size=1000 not used: "
          "the vocabulary is the source's (wordpiece, ") in capsys.readouterr().out


def test_cli_bad_init_from_and_non_integer_extend_vocab_exit_2(source, base):
  cfg_path = base / "cli_config_bad.py"
  cfg_path.write_text(CONFIG_FILE.format(corpus=TOY, batch=BATCH, seq=SEQ, preds=PREDS))
  workdir = base / "cli_bad"
  for flags in ([f"--config.init_from={base / 'nope'}"],
                [f"--config.init_from={source}", "--config.data.extend_vocab=1.5"],
                # The default's value, given as a flag: the command line says it was asked.
                [f"--config.init_from={source}", "--config.model.max_position_embeddings=512"]):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--config",
                           str(cfg_path), "--workdir", str(workdir), *flags],
                          capture_output=True, text=True, timeout=120,
                          env=soak_kill.subprocess_env())
    errors = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr
    assert not workdir.exists()


def test_tensorflow_source_without_tensorflow_is_one_line(base):
  tf_dir = base / "tf_source"
  tf_dir.mkdir()
  (tf_dir / "bert_config.json").write_text("{}")
  (tf_dir / "bert_model.ckpt.index").write_text("")
  try:
    import tensorflow  # noqa: F401  pylint: disable=unused-import,import-outside-toplevel
    pytest.skip("TensorFlow is installed")
  except ImportError:
    pass
  c = config(str(tf_dir), base / "tf_prepared")
  with pytest.raises(ConfigError, match="needs TensorFlow, which is not installed"):
    train_and_evaluate(c, str(base / "tf_run"))
