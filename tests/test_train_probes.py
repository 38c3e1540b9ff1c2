"""Linear probes inside pre-training (`config.probe.tasks`) and `num_steps=0` with init_from.

A run with probes logs `probe/<task>/<metric>` at every evaluation (console,
metrics.jsonl, TensorBoard, the plot), and a run resumed from a checkpoint
logs the same probe rows as the uninterrupted run: the probe reads the
parameters and nothing else.
"""

import glob
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from bert_jax.errors import TaskError
from bert_jax.io import checkpointing
from bert_jax.trainer import train_and_evaluate
import soak_kill

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 12
# Probes at every 4 steps (evals) and at the end; a subset keeps each probe quick.
PROBE = {"probe.tasks": ("word_order",), "probe.max_examples": 60, "eval_every": 4,
         "keep_checkpoints": soak_kill.KEEP_ALL}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
  return tmp_path_factory.mktemp("train_probes")


def _config(base, steps=STEPS, **extra):
  return soak_kill.tiny_config(str(base / "prepared"), steps, **{**PROBE, **extra})


def _rows(workdir, split):
  return [r for r in soak_kill.read_metrics(workdir) if r["split"] == split]


@pytest.fixture(scope="module")
def reference(base):
  workdir = str(base / "reference")
  train_and_evaluate(_config(base), workdir)
  return workdir


def test_the_probe_is_logged_at_every_eval_and_at_the_end(reference, capfd):
  probe_rows = _rows(reference, "probe")
  assert [r["step"] for r in probe_rows] == [4, 8, 12]
  for r in probe_rows:
    assert 0.0 <= r["word_order/accuracy"] <= 1.0 and r["word_order/num_eval"] == 60
  events = glob.glob(os.path.join(reference, "tensorboard", "events.*"))
  assert events and any(b"probe/word_order/accuracy" in open(e, "rb").read() for e in events)


def test_the_console_and_the_summary_show_the_probe(base):
  workdir = str(base / "console")
  proc = subprocess.run(
      [sys.executable, os.path.join(ROOT, "train.py"),
       *soak_kill.tiny_args(workdir, str(base / "prepared"), 8,
                            **{**PROBE, "probe.tasks": "('word_order',)"})],
      env=soak_kill.subprocess_env(), capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-2000:]
  lines = proc.stdout.splitlines()
  assert any(l.startswith("probe @ 4: word_order accuracy ") and " ± " in l for l in lines)
  assert any(l.startswith("throughput:") and "probes " in l for l in lines)


def test_a_resumed_run_logs_the_same_probe_rows(base, reference):
  workdir = str(base / "resumed")
  shutil.copytree(reference, workdir)
  for step in soak_kill.complete_steps(workdir):
    if step > 4:
      shutil.rmtree(os.path.join(workdir, "checkpoints", str(step)))
  train_and_evaluate(_config(base), workdir)
  assert _rows(workdir, "probe") == _rows(reference, "probe")
  assert soak_kill.differences(reference, workdir) == []


def test_an_unknown_probe_task_is_one_line_and_writes_nothing(base):
  workdir = base / "bad_task"
  with pytest.raises(TaskError, match="no_such_task") as e:
    train_and_evaluate(_config(base, **{"probe.tasks": ("no_such_task",)}), str(workdir))
  assert "\n" not in str(e.value) and not workdir.exists()


def test_num_steps_0_with_init_from_evaluates_and_probes_the_source(base, reference):
  workdir = str(base / "evaluate_source")
  ev = train_and_evaluate(_config(base, steps=0, init_from=reference), workdir)
  assert 0.0 <= ev["mlm_accuracy"] <= 1.0
  assert soak_kill.complete_steps(workdir) == [0]
  assert [r["step"] for r in _rows(workdir, "probe")] == [0]
  assert [r["step"] for r in _rows(workdir, "train")] == []
  source, _ = checkpointing.restore_params(reference)
  params, meta = checkpointing.restore_params(workdir)
  assert meta["step"] == 0
  vocab = meta["model_config"]["vocab_size"]  # rows past it pad the table (not imported)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(source), jax.tree.leaves(params),
                          strict=True):
    if "word_embeddings" in jax.tree_util.keystr(path):
      a, b = a[:vocab], b[:vocab]
    np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))
  # The source's probe equals the reference run's last probe: the same parameters.
  assert (_rows(workdir, "probe")[0]["word_order/accuracy"]
          == _rows(reference, "probe")[-1]["word_order/accuracy"])


def test_num_steps_0_without_init_from_is_refused(base):
  from bert_jax.errors import ConfigError
  with pytest.raises(ConfigError, match=r"train.num_steps=0.*only with --config.init_from"):
    train_and_evaluate(_config(base, steps=0), str(base / "zero"))
