"""Fine-tuning on several processes: 2 processes x 4 simulated CPU devices give the results
of 1 process x 8 devices (the same global batches, split over the same 8 devices), and
only process 0 prints and writes (results.json, TensorBoard events, --save)."""

import glob
import json
import os
import sys

import jax
import numpy as np
import pytest

from bert_jax.data.tokenizer import SPECIAL_TOKENS
from bert_jax.io import checkpointing
from bert_jax.model.build import init_params
import multiprocess_runs as multiprocess
import tiny_run

pytestmark = pytest.mark.slow  # fine-tunes in subprocesses

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = "the cat dog sat on a mat and ran to house tree bird sang loud quiet".split()
VOCAB = list(SPECIAL_TOKENS) + WORDS
CONFIG = tiny_run.bert_config(len(VOCAB), num_layers=1)
FLAGS = ["--learning_rates", "3e-3", "--seeds", "0,1", "--epochs", "6", "--batch_size", "32",
         "--eval_batch_size", "32", "--no_progress"]


def _write_task(directory: str) -> str:
  """'yes' when 'cat' occurs in a random word string (test_finetune's task, smaller)."""
  others = [w for w in WORDS if w != "cat"]
  rs = np.random.RandomState(0)
  os.makedirs(directory)
  for split, n in (("train", 256), ("dev", 64)):
    with open(os.path.join(directory, f"{split}.tsv"), "w", encoding="utf-8") as f:
      f.write("label\ttext\n")
      for i in range(n):
        words = list(rs.choice(others, size=rs.randint(3, 12)))
        for _ in range(rs.randint(1, 4) if i % 2 else 0):
          words.insert(rs.randint(len(words) + 1), "cat")
        f.write(f"{'yes' if i % 2 else 'no'}\t{' '.join(words)}\n")
  return directory


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
  root = tmp_path_factory.mktemp("finetune_distributed")
  logs = str(root / "logs")
  os.makedirs(logs)
  ckpt = str(root / "pretrained")
  checkpointing.save_params(ckpt, 0, init_params(CONFIG, jax.random.key(0)),
                            {"model_config": CONFIG.to_dict(), "vocab": VOCAB, "lowercase": True})
  common = [sys.executable, "-m", "bert_jax.finetune", *FLAGS, "--checkpoint", ckpt,
            "--task", _write_task(str(root / "has_cat"))]
  address = f"127.0.0.1:{multiprocess.free_port()}"
  launches = {"one": {"one": ([*common, "--output_dir", str(root / "one"), "--save",
                               str(root / "one_saved")], 8)},
              "two": {f"two{i}": ([*common, "--output_dir", str(root / "two"), "--save",
                                   str(root / "two_saved"), "--coordinator_address", address,
                                   "--num_processes", "2", "--process_id", str(i)], 4)
                      for i in range(2)}}
  stdout = {}
  for name, commands in launches.items():
    stdout |= multiprocess.launch_retrying(commands, logs, None, ROOT,
                                           [str(root / name), str(root / f"{name}_saved")])
  results = {}
  for name in ("one", "two"):
    with open(root / name / "results.json") as f:
      results[name] = json.load(f)
  return {"root": root, "stdout": stdout, "results": results}


def test_two_processes_fine_tune_as_one(runs):
  one, two = runs["results"]["one"], runs["results"]["two"]
  assert one["devices"] == two["devices"] == 8
  assert [(r["learning_rate"], r["seed"]) for r in two["runs"]] == [
      (r["learning_rate"], r["seed"]) for r in one["runs"]] == [(3e-3, 0), (3e-3, 1)]
  for a, b in zip(one["runs"], two["runs"]):
    assert b["steps"] == a["steps"] and b["skipped_steps"] == a["skipped_steps"] == 0
    # The same batches on the same 8 devices: losses agree to float rounding.
    assert b["train_loss"] == pytest.approx(a["train_loss"], abs=1e-4)
    for e1, e2 in zip(a["per_epoch"], b["per_epoch"]):
      assert e2["dev"]["accuracy"] == pytest.approx(e1["dev"]["accuracy"], abs=1.0 / 64 + 1e-9)
  assert one["summary"]["best_learning_rate"] == two["summary"]["best_learning_rate"]
  # It learned the task: the comparison is not between two chance-level runs.
  assert max(r["metrics"]["dev"]["accuracy"] for r in two["runs"]) >= 0.8


def test_only_process_0_prints_and_writes(runs):
  root, stdout = runs["root"], runs["stdout"]
  assert "lr 0.003 seed 1: dev accuracy" in stdout["two0"]
  # Process 1 prints nothing of its own (gloo's connection lines are the library's).
  assert multiprocess.own_lines(stdout["two1"]) == []
  # One set of TensorBoard events per run (process 0's), and one saved checkpoint.
  events = glob.glob(str(root / "two" / "runs" / "*" / "tensorboard" / "events.*"))
  assert len(events) == 2, events
  saved = checkpointing.restore_params(str(root / "two_saved"))[0]
  reference = checkpointing.restore_params(str(root / "one_saved"))[0]
  for a, b in zip(jax.tree.leaves(reference), jax.tree.leaves(saved), strict=True):
    np.testing.assert_allclose(a, b, atol=1e-4)
