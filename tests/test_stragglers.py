"""A slow host on a pod is named (train/stragglers.py)."""

import json
import os
import sys

import numpy as np
import pytest

from bert_jax.train import stragglers
import multiprocess_runs as multiprocess
import tiny_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_process_waiting_for_its_input_is_named():
  times = np.array([[0.10, 0.001], [0.10, 0.060], [0.10, 0.002], [0.10, 0.001]])
  p, line = stragglers.slowest(times, factor=3.0)
  assert p == 1 and line.startswith("warning: straggler: process 1 waited 60.0 ms a step")


def test_small_waits_and_even_waits_name_nobody():
  tiny = np.array([[0.10, 0.0001], [0.10, 0.009]])  # 90x the median, but 9% of a step
  even = np.array([[0.10, 0.050], [0.10, 0.060], [0.10, 0.055]])  # all wait alike
  assert stragglers.slowest(tiny, 3.0) is None and stragglers.slowest(even, 3.0) is None


# Process 1's input pipeline sleeps 150 ms before every batch: the straggler.
SLOW_INPUT = """
import runpy, sys, time
from bert_jax.data import input_pipeline
if "--process_id=1" in sys.argv:
  original = input_pipeline.TrainIterator.__next__
  def slow(self):
    time.sleep(0.15)
    return original(self)
  input_pipeline.TrainIterator.__next__ = slow
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.slow
def test_a_slow_process_in_a_two_process_run_is_named(tmp_path):
  address = f"127.0.0.1:{multiprocess.free_port()}"
  workdir = str(tmp_path / "run")
  flags = tiny_run.flags(**{"train.num_steps": 12, "log_every": 4, "eval_every": 1000,
                            "eval_batches": 1, "checkpoint_every": 1000, "probe.tasks": (),
                            "train.seq_lens": (32,), "train.max_predictions": (5,),
                            "model.num_layers": 1})
  runs = {f"p{i}": ([sys.executable, "-c", SLOW_INPUT, os.path.join(ROOT, "train.py"),
                     "--config", os.path.join(ROOT, "configs", "tiny.py"),
                     f"--workdir={workdir}", *flags, f"--coordinator_address={address}",
                     "--num_processes=2", f"--process_id={i}"], 4) for i in range(2)}
  env = os.environ.get("BERT_JAX_MALLOC")
  os.environ["BERT_JAX_MALLOC"] = "system"  # no exec: the patch must stay in the process
  try:
    multiprocess.launch_retrying(runs, str(tmp_path / "logs"), None, ROOT, [workdir])
  finally:
    if env is None:
      os.environ.pop("BERT_JAX_MALLOC")
    else:
      os.environ["BERT_JAX_MALLOC"] = env
  with open(tmp_path / "logs" / "p0.err", encoding="utf-8") as f:
    named = [l for l in f if "straggler" in l]
  assert named and named[0].startswith("warning: straggler: process 1 waited "), named
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    rows = [json.loads(l) for l in f if '"train"' in l]
  assert [r["slowest_process"] for r in rows if "slowest_process" in r][-1] == 1
  assert rows[-1]["data_wait_max_s"] > 0.1 > rows[-1]["data_wait_median_s"]
