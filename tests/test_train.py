"""End-to-end pre-training: toy corpus, exact resume, checkpoints, bad input."""

import os
import tiny_run
import subprocess
import sys

import jax
import numpy as np
import pytest

from bert_jax.data import input_pipeline
from bert_jax.io import checkpointing
from bert_jax.errors import BertJaxError, ConfigError, CorpusError
from bert_jax.trainer import train_and_evaluate

pytestmark = pytest.mark.slow  # trains or starts processes: the full suite, not the fast tier

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOY = os.path.join(ROOT, "data", "corpus.txt")


def _config(corpus=TOY, steps=8):
  return tiny_run.config(**{
      "data.corpus": corpus, "train.num_steps": steps, "train.seq_lens": (32,),
      "train.max_predictions": (5,), "log_every": 4, "eval_every": 4, "checkpoint_every": 4})


def _with_cache(config, tmp_path):
  config.data.cache_dir = str(tmp_path / "prepared")
  return config


def _params(workdir):
  params, meta = checkpointing.restore_params(workdir)
  return jax.device_get(params), meta


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
  """One short run on the tutorial's toy tab corpus, shared by read-only tests."""
  workdir = tmp_path_factory.mktemp("toy")
  c = _config()
  c.plot = True  # the default, which tiny_run turns off
  return str(workdir), train_and_evaluate(c, str(workdir))


def test_toy_tab_corpus_trains_and_writes_outputs(toy_run):
  workdir, ev = toy_run
  assert np.isfinite(ev["mlm_loss"]) and np.isfinite(ev["nsp_loss"])
  assert 0 <= ev["mlm_accuracy"] <= 1 and ev["nsp_accuracy"] > 0
  for name in ("training_curves.png", "metrics.jsonl", "tensorboard", "checkpoints/8"):
    assert os.path.exists(os.path.join(workdir, name)), name


def test_checkpoint_holds_params_vocab_and_model_config(toy_run):
  params, meta = _params(toy_run[0])
  assert meta["step"] == 8
  assert meta["vocab"][0] == "[PAD]" and "[MASK]" in meta["vocab"]
  assert meta["model_config"]["hidden_size"] == 32
  emb = params["bert"]["embeddings"]["word_embeddings"]["embedding"]
  assert emb.shape[0] >= len(meta["vocab"])


def test_params_restore_onto_one_device_whatever_training_used(toy_run):
  params, _ = checkpointing.restore_params(toy_run[0])  # trained on 8 simulated devices
  leaf = jax.tree.leaves(params)[0]
  assert len(leaf.sharding.device_set) == 1


class _Preempted(Exception):
  pass


def test_interrupted_run_resumes_to_identical_parameters(tmp_path, monkeypatch):
  # Shared prepared data: HF's WordPiece trainer is not deterministic across
  # processes (huggingface/tokenizers#1794), so runs compare on one vocabulary.
  config = lambda: _with_cache(_config(steps=12), tmp_path)
  straight = tmp_path / "straight"
  train_and_evaluate(config(), str(straight))
  assert not (straight / "training_curves.png").exists()  # tiny_run's --config.plot=False

  crashed = tmp_path / "crashed"
  real_next = input_pipeline.TrainIterator.__next__
  calls = {"n": 0}

  def next_then_crash(self):
    calls["n"] += 1
    if calls["n"] == 7:  # mid-way between the checkpoints at steps 4 and 8
      raise _Preempted()
    return real_next(self)

  monkeypatch.setattr(input_pipeline.TrainIterator, "__next__", next_then_crash)
  with pytest.raises(_Preempted):
    train_and_evaluate(config(), str(crashed))
  monkeypatch.setattr(input_pipeline.TrainIterator, "__next__", real_next)
  assert checkpointing.restore_params(str(crashed))[1]["step"] == 4
  train_and_evaluate(config(), str(crashed))

  a, meta_a = _params(str(straight))
  b, meta_b = _params(str(crashed))
  assert meta_a["step"] == meta_b["step"] == 12
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(x, y)


def test_resuming_with_another_model_size_is_a_clear_error(tmp_path):
  train_and_evaluate(_config(steps=4), str(tmp_path))
  c = _config(steps=8)
  c.model.hidden_size = 64
  with pytest.raises(BertJaxError, match="hidden_size=32.*64"):
    train_and_evaluate(c, str(tmp_path))


def _no_outputs(workdir):
  ckpt = os.path.join(workdir, "checkpoints")
  assert not os.path.exists(ckpt) or not os.listdir(ckpt)


@pytest.mark.parametrize("change, error, match", [
    (lambda c: setattr(c.model, "num_heads", 3), ConfigError, "hidden_size=32 is not divisible"),
    (lambda c: setattr(c.train, "seq_lens", (256,)), ConfigError, "max_position_embeddings"),
    (lambda c: setattr(c.train, "batch_size", 12), ConfigError, "batch_size=12"),
    (lambda c: setattr(c.train, "num_steps", 0), ConfigError, "num_steps"),
])
def test_impossible_config_fails_before_writing(tmp_path, change, error, match):
  c = _config()
  change(c)
  with pytest.raises(error, match=match):
    train_and_evaluate(c, str(tmp_path))
  assert not os.path.exists(tmp_path / "prepared")
  _no_outputs(str(tmp_path))


def _write(path, data: bytes):
  path.write_bytes(data)
  return str(path)


@pytest.mark.parametrize("make, match", [
    (lambda d: str(d / "missing.txt"), "missing.txt"),
    (lambda d: _write(d / "empty.txt", b"\n\n  \n"), "empty.txt"),
    (lambda d: _write(d / "latin1.txt", "caf\xe9 au lait.\n\nnext doc.\n".encode("latin-1")), "latin1.txt"),
    (lambda d: _write(d / "tiny.txt", b"one sentence only.\n"), "tiny.txt"),
    (lambda d: "tfds:no_such_dataset_xyz", "no_such_dataset_xyz"),
])
def test_bad_corpus_is_a_one_line_error_and_leaves_nothing(tmp_path, make, match):
  corpus = make(tmp_path)
  workdir = tmp_path / "work"
  with pytest.raises(CorpusError, match=match) as e:
    train_and_evaluate(_config(corpus=corpus), str(workdir))
  assert "\n" not in str(e.value)
  prepared = workdir / "prepared"
  assert not prepared.exists() or not any(prepared.iterdir())
  _no_outputs(str(workdir))


def test_cli_reports_bad_input_on_one_line_with_nonzero_exit(tmp_path):
  proc = subprocess.run(
      [sys.executable, os.path.join(ROOT, "train.py"), "--workdir", str(tmp_path / "w"),
       "--config.data.corpus", str(tmp_path / "nope.txt")],
      capture_output=True, text=True, timeout=120,
      env={**os.environ, "XLA_FLAGS": "", "TF_CPP_MIN_LOG_LEVEL": "3"})
  assert proc.returncode == 2
  errors = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
  assert len(errors) == 1 and "nope.txt" in errors[0]
