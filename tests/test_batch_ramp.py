"""Batch-size warm-up (`config.train.batch_ramp`, data/batch_ramp.py).

Each step's global batch and where its examples start are pure functions of the
step, so the ramp reads the same stream as a fixed batch, in the same order, and a
run killed anywhere on the ramp resumes to the same arrays.
"""

import os
import random
import subprocess
import sys

import numpy as np
import pytest

from bert_jax import settings
from bert_jax.data import input_pipeline
from bert_jax.data.batch_ramp import BatchRamp
from bert_jax.errors import ConfigError
import soak_kill

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_stages_are_rounded_multiples_of_the_unit_then_the_target():
  ramp = BatchRamp(start=16, target=64, steps=8, stages=3, unit=8)
  # Stage i: 16 + 48 * i / 3 = 16, 32, 48 over steps round(8 i / 3) = 0, 3, 5, then 64.
  assert [ramp.size(s) for s in range(10)] == [16, 16, 16, 32, 32, 48, 48, 48, 64, 64]
  assert ramp.sizes() == [16, 32, 48, 64]
  # 8 + 56 i / 5 = 8, 19.2, 30.4, 41.6, 52.8: rounded down to multiples of 8.
  assert BatchRamp(8, 64, 100, 5, unit=8).sizes() == [8, 16, 24, 40, 48, 64]


def test_examples_before_a_step_are_the_sizes_before_it():
  ramp = BatchRamp(start=8, target=40, steps=11, stages=4, unit=8)
  sums = np.cumsum([0] + [ramp.size(s) for s in range(30)])
  assert [ramp.examples_before(s) for s in range(31)] == sums.tolist()


def test_a_start_that_does_not_shard_is_one_line():
  with pytest.raises(ConfigError, match=r"batch_ramp.start=12: expected a multiple of 8"):
    BatchRamp(start=12, target=64, steps=8, stages=2, unit=8)


@pytest.mark.parametrize("fields,field", [({"start": 64}, "start"), ({"start": -8}, "start"),
                                          ({"start": 16, "steps": 0}, "steps"),
                                          ({"start": 16, "steps": 10, "stages": 0}, "stages")])
def test_bad_settings_are_one_line(fields, field):
  from bert_jax import default_config  # pylint: disable=import-outside-toplevel
  config = default_config.get_config()
  config.train.batch_size = 64
  config.train.batch_ramp.update({"steps": 10, **fields})
  with pytest.raises(ConfigError, match=rf"--config.train.batch_ramp.{field}="):
    settings.from_config(config)


SOURCE = [{"input_ids": np.full(4, i), "segment_ids": np.zeros(4), "input_mask": np.ones(4),
           "next_sentence_label": np.int32(0)} for i in range(50)]


def _ids(it, n):
  return [next(it).input_ids_BxL[:, 0].tolist() for _ in range(n)]


def test_the_ramp_reads_the_fixed_batch_stream_in_order_across_epochs():
  ramp = BatchRamp(start=4, target=12, steps=6, stages=2, unit=4)
  ramped = _ids(input_pipeline.TrainIterator(SOURCE, 12, seed=3, ramp=ramp, prefetch=0), 10)
  assert [len(b) for b in ramped] == [4, 4, 4, 8, 8, 8, 12, 12, 12, 12]
  fixed = _ids(input_pipeline.TrainIterator(SOURCE, 4, seed=3, prefetch=0), 21)
  assert sum(ramped, []) == sum(fixed, [])  # 84 examples: into the second epoch of 50


def test_hosts_read_disjoint_halves_of_each_ramped_batch():
  ramp = BatchRamp(start=4, target=12, steps=6, stages=2, unit=4)
  one = _ids(input_pipeline.TrainIterator(SOURCE, 12, seed=0, ramp=ramp, prefetch=0), 8)
  hosts = [_ids(input_pipeline.TrainIterator(SOURCE, 12, seed=0, process_index=p,
                                             process_count=2, ramp=ramp, prefetch=2), 8)
           for p in (0, 1)]
  assert [a + b for a, b in zip(*hosts)] == one


def test_a_later_phase_starts_its_stream_at_its_own_first_step():
  # Phase 1 from step 5 on: its batch 0 is step 5's size; resuming at batch 2 continues.
  ramp = BatchRamp(start=4, target=12, steps=6, stages=2, unit=4)
  whole = _ids(input_pipeline.TrainIterator(SOURCE, 12, seed=1, ramp=ramp, first_step=5,
                                            prefetch=0), 5)
  assert [len(b) for b in whole] == [8, 12, 12, 12, 12]
  resumed = _ids(input_pipeline.TrainIterator(SOURCE, 12, seed=1, ramp=ramp, first_step=5,
                                              start_batch=2, prefetch=0), 3)
  assert resumed == whole[2:]


def test_the_ramp_is_refused_with_streams():
  with pytest.raises(ConfigError, match="batch_ramp with host-local parts or"):
    input_pipeline.TrainIterator(SOURCE, 12, seed=0, streams=2, parts=[(0, 25), (1, 25)],
                                 ramp=BatchRamp(4, 12, 6, 2, 4))


# --- the whole run: two phases, the ramp across the boundary, kill -9 anywhere ---

STEPS = 16  # phases [0, 8) and [8, 16); the ramp 8 -> 16 -> 24 over steps 0..12


def _args(workdir: str, cache: str) -> list[str]:
  return soak_kill.tiny_args(workdir, cache, STEPS, 2, keep_checkpoints=soak_kill.KEEP_ALL, **{
      "train.batch_size": 32, "train.batch_ramp.start": 8, "train.batch_ramp.steps": 12,
      "train.batch_ramp.stages": 3})


def _run(workdir: str, cache: str, **kw) -> subprocess.Popen:
  return subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"),
                           *_args(workdir, cache)], env=soak_kill.subprocess_env(), text=True,
                          **kw)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  base = tmp_path_factory.mktemp("ramp_reference")
  workdir = str(base / "run")
  proc = _run(workdir, str(base / "prepared"), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  out, err = proc.communicate(timeout=600)
  assert proc.returncode == 0, err[-3000:]
  return workdir, out


@pytest.mark.slow
def test_a_ramped_run_reports_the_sequences_of_its_steps(reference):
  workdir, _ = reference
  assert sorted(soak_kill.train_rows(workdir)) == list(range(1, STEPS + 1))
  rows = {r["step"]: r for r in soak_kill.read_metrics(workdir)
          if r.get("split") == "train" and "sequences_per_sec" in r}
  # Rates of step 2 (size 8) against step 14 (size 32): sequences per step follow the ramp.
  per_step = {s: rows[s]["sequences_per_sec"] / rows[s]["steps_per_sec"] for s in (2, 14)}
  assert per_step == {2: pytest.approx(8), 14: pytest.approx(32)}, per_step


@pytest.mark.slow
def test_kill_9_anywhere_on_the_ramp_resumes_exactly(reference, tmp_path):
  workdir, _ = reference
  rng = random.Random(random.randrange(2**31))
  killed = str(tmp_path / "killed")
  soak_kill.kill_after_steps(  # inside each phase, on the ramp
      lambda: _run(killed, str(tmp_path / "prepared"), stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL), killed, (rng.randint(3, 7), rng.randint(9, 13)))
  proc = _run(killed, str(tmp_path / "prepared"), stdout=subprocess.DEVNULL,
              stderr=subprocess.PIPE)
  _, err = proc.communicate(timeout=600)
  assert proc.returncode == 0, err[-3000:]
  diffs = soak_kill.differences(workdir, killed)
  assert not diffs, diffs
