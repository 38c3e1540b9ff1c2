"""A workdir that holds a run on another corpus or vocabulary is refused before anything is written."""

import hashlib
import json
import tiny_run
import os
import subprocess
import sys

import pytest

from bert_jax.errors import BertJaxError, ConfigError
from bert_jax.trainer import train_and_evaluate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOY = os.path.join(ROOT, "data", "corpus.txt")


def _config(**data):
  c = tiny_run.config(**{
      "data.dupe_factor": 1, "train.num_steps": 4, "train.warmup_steps": 1,
      "train.seq_lens": (32,), "train.max_predictions": (5,), "log_every": 4,
      "eval_every": 4, "checkpoint_every": 4, "eval_batches": 1})
  for k, v in data.items():
    setattr(c.data, k, v)
  return c


def snapshot(workdir: str) -> dict:
  """Every file and folder under the workdir, with the hash of each file."""
  out = {}
  for d, dirs, files in os.walk(workdir):
    for name in dirs:
      out[os.path.relpath(os.path.join(d, name), workdir)] = "dir"
    for name in files:
      path = os.path.join(d, name)
      with open(path, "rb") as f:
        out[os.path.relpath(path, workdir)] = hashlib.sha256(f.read()).hexdigest()
  return out


@pytest.fixture(scope="module")
def toy_workdir(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("toy"))
  train_and_evaluate(_config(), workdir)
  return workdir


@pytest.mark.slow
@pytest.mark.parametrize("data", [{"corpus": "builtin", "max_documents": 40},
                                  {"vocab_size": 512}],
                         ids=["another_corpus", "another_vocab_size"])
def test_another_corpus_or_vocabulary_is_one_line_and_writes_nothing(toy_workdir, data):
  before = snapshot(toy_workdir)
  with pytest.raises(ConfigError, match="holds a run on another corpus or vocabulary") as e:
    train_and_evaluate(_config(**data), toy_workdir)
  message = str(e.value)
  assert "\n" not in message and "use another --workdir" in message
  assert all(k in message for k in data), message  # names the fields that differ
  assert snapshot(toy_workdir) == before


def test_the_same_corpus_spelled_another_way_resumes(toy_workdir, monkeypatch):
  monkeypatch.chdir(ROOT)
  before = snapshot(toy_workdir)
  ev = train_and_evaluate(_config(corpus="./data/../data/corpus.txt"), toy_workdir)
  assert "mlm_accuracy" in ev  # the stored final eval: the run is complete
  assert snapshot(toy_workdir) == before


def test_cli_prints_one_error_line_and_exits_2(toy_workdir):
  before = snapshot(toy_workdir)
  flags = ["--config.model.hidden_size=32", "--config.model.intermediate_size=64",
           "--config.train.batch_size=16", "--config.train.num_steps=4",
           "--config.train.seq_lens=(32,)", "--config.train.max_predictions=(5,)",
           "--config.data.max_documents=40", "--config.progress_bar=False"]
  proc = subprocess.run(
      [sys.executable, os.path.join(ROOT, "train.py"), "--workdir", toy_workdir, *flags],
      capture_output=True, text=True, timeout=300, cwd=ROOT,
      env={**os.environ, "XLA_FLAGS": "", "TF_CPP_MIN_LOG_LEVEL": "3"})
  assert proc.returncode == 2, proc.stderr[-2000:]
  errors = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
  assert len(errors) == 1 and "another corpus or vocabulary" in errors[0], proc.stderr[-2000:]
  assert "corpus='builtin'" in errors[0] and "Preparing" not in proc.stdout + proc.stderr
  assert snapshot(toy_workdir) == before


def test_a_vocabulary_of_another_size_is_named_as_such_not_as_a_config_value():
  # Same data settings, another vocabulary (e.g. prepared/ deleted and WordPiece
  # trained again): the error names the two vocabularies, not "the config asks for".
  from bert_jax.errors import CheckpointError
  from bert_jax.settings.model import ModelConfig
  from bert_jax.train.resume import check_resume_compatible
  with pytest.raises(CheckpointError, match=r"vocabulary of 4096 tokens but this run's "
                                            r"prepared vocabulary has 885") as e:
    check_resume_compatible({"model_config": ModelConfig(4096).to_dict()}, ModelConfig(885),
                            "runs/tiny/checkpoints")
  assert "config asks for" not in str(e.value)


def test_a_vocab_file_is_compared_by_its_tokens_not_its_path(tmp_path, monkeypatch):
  from bert_jax import settings
  from bert_jax.train import resume
  tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat"]
  saved = _config(vocab_file=str(tmp_path / "there.txt"))
  meta = {"config": json.loads(saved.to_json()), "vocab": tokens}
  monkeypatch.setattr(resume.checkpointing, "newest_meta", lambda d: meta)

  def check(vocab):
    path = tmp_path / "here.txt"
    path.write_text("".join(t + "\n" for t in vocab), encoding="utf-8")
    resume.check_same_data(settings.from_config(_config(vocab_file=str(path))), "w")

  check(tokens)  # the same tokens in another file: resumes
  swapped = tokens[:5] + ["cat", "the", "sat"]
  with pytest.raises(ConfigError, match=r"holds a run with another vocabulary \(8 tokens, "
                                        r".*first difference at id 5: 'the' there, 'cat' here"):
    check(swapped)


@pytest.mark.parametrize("field, value", [("objective", "mlm"), ("train.optimizer", "lamb")])
def test_another_objective_or_optimizer_is_refused_before_preparing(toy_workdir, field, value):
  before = snapshot(toy_workdir)
  c = _config()
  *parents, name = field.split(".")
  node = c
  for p in parents:
    node = node[p]
  node[name] = value
  with pytest.raises(BertJaxError, match=f"--config.{field}={value!r}") as e:
    train_and_evaluate(c, toy_workdir)
  assert "\n" not in str(e.value)
  assert snapshot(toy_workdir) == before  # nothing prepared for the other objective
