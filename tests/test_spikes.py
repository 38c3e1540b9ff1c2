"""Loss-spike rollback (config.train.spike_rollback, bert_jax/train/spikes.py).

The detector on its own: a spike triggers at its `patience`-th step, noise never does.
A run: a spike injected into the losses the detector sees (10x at steps 7-9, only while
the run has not rolled back: a function of the checkpointed state, as bad data would be
of the position) is rolled back to the newest checkpoint before it, the checkpoint
written during it is deleted, the batches since are skipped; the same run rolls back the
same way every time, and kill -9 at any point (between the rollback and the next
checkpoint too) resumes to the same arrays and rows.
"""

import os
import random
import subprocess
import sys

import numpy as np
import pytest

import soak_kill
from bert_jax.errors import ConfigError
from bert_jax.settings import SpikeSettings
from bert_jax.train.spikes import SpikeDetector

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _feed(detector, losses, start=1):
  return [(s, found) for s, loss in enumerate(losses, start)
          if (found := detector.observe(s, loss)) is not None]


def test_a_spike_triggers_at_its_patience_th_step_with_its_range():
  d = SpikeDetector(factor=3.0, patience=3, window=10)
  found = _feed(d, [5.0] * 20 + [40.0, 41.0, 42.0] + [5.0] * 5)
  assert len(found) == 1
  step, spike = found[0]
  assert (step, spike.first, spike.last, spike.loss, spike.mean) == (23, 21, 23, 42.0, 5.0)


def test_noise_and_short_bursts_do_not_trigger():
  rng = np.random.default_rng(0)
  noisy = list(6.0 * np.exp(rng.normal(0.0, 0.25, size=5000)))  # +-25%, heavy upper tail
  assert _feed(SpikeDetector(factor=3.0, patience=3, window=100), noisy) == []
  bursts = [5.0] * 50 + [40.0, 40.0, 5.0] * 20  # two in a row, never three
  assert _feed(SpikeDetector(factor=3.0, patience=3, window=10), bursts) == []


def test_nothing_is_judged_before_the_window_fills():
  assert _feed(SpikeDetector(factor=3.0, patience=1, window=10), [10.0, 1.0] + [50.0] * 5) == []


def test_spiking_steps_and_nonfinite_ones_do_not_move_the_mean():
  d = SpikeDetector(factor=3.0, patience=5, window=4)
  _feed(d, [2.0] * 4 + [100.0, float("nan"), 100.0])
  assert d.mean == 2.0 and d.seen == 4 and d.streak == 2 and d.first == 5


def test_the_state_round_trips_through_a_checkpoints_json():
  d = SpikeDetector(factor=3.0, patience=3, window=4)
  _feed(d, [2.0, 3.0, 4.0, 5.0, 50.0])
  e = SpikeDetector(factor=3.0, patience=3, window=4)
  e.load(d.state())
  assert e == d


@pytest.mark.parametrize("fields, field", [({"factor": 1.0}, "factor"),
                                           ({"patience": 0}, "patience"),
                                           ({"window": -1}, "window")])
def test_bad_settings_are_one_line(fields, field):
  with pytest.raises(ConfigError, match=f"train.spike_rollback.{field}"):
    SpikeSettings(**fields)


# --- a run ---

INJECT = """
import runpy, sys
from bert_jax.train import spikes
observe = spikes.SpikeDetector.observe

def injected(self, step, loss):  # bad batches at steps 7-9, until the run rolled back
  return observe(self, step, loss * 10 if self.rollbacks == 0 and 7 <= step <= 9 else loss)
spikes.SpikeDetector.observe = injected
sys.argv = ["train.py", *{args!r}]
runpy.run_path({train!r}, run_name="__main__")
"""
STEPS = 16


def _args(workdir: str, cache: str) -> list[str]:
  return soak_kill.tiny_args(workdir, cache, STEPS, keep_checkpoints=soak_kill.KEEP_ALL, **{
      "train.spike_rollback.factor": 3.0, "train.spike_rollback.patience": 3,
      "train.spike_rollback.window": 4})


def _popen(workdir: str, cache: str, **kw) -> subprocess.Popen:
  code = INJECT.format(args=_args(workdir, cache), train=os.path.join(ROOT, "train.py"))
  env = {**soak_kill.subprocess_env(), "BERT_JAX_MALLOC": "system"}  # no exec: keep the patch
  return subprocess.Popen([sys.executable, "-c", code], env=env, text=True, **kw)


def _run(workdir: str, cache: str) -> str:
  proc = _popen(workdir, cache, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  _, err = proc.communicate(timeout=600)
  assert proc.returncode == 0, err[-3000:]
  return err


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  base = tmp_path_factory.mktemp("spike_reference")
  workdir = str(base / "run")
  return workdir, _run(workdir, str(base / "prepared"))


@pytest.mark.slow
def test_an_injected_spike_is_rolled_back_to_the_checkpoint_before_it(reference):
  workdir, err = reference
  lines = [l for l in err.splitlines() if "loss spike" in l]
  assert len(lines) == 1, err[-3000:]
  assert lines[0].startswith("warning: loss spike at steps 7..9 (loss ")
  assert lines[0].endswith("rolled back to step 4, skipping the 5 batches of steps 5..9 "
                           "(rollback 1 of 3)"), lines[0]
  # Step 8's checkpoint, written inside the spike, was deleted and written again.
  assert soak_kill.complete_steps(workdir) == [4, 8, 12, 16]
  assert sorted(soak_kill.train_rows(workdir)) == list(range(1, STEPS + 1))


@pytest.mark.slow
def test_the_same_run_rolls_back_the_same_way_and_kill_9_anywhere_resumes_exactly(
    reference, tmp_path):
  workdir, _ = reference
  again = str(tmp_path / "again")
  _run(again, str(tmp_path / "prepared"))
  assert not soak_kill.differences(workdir, again)
  rng = random.Random(random.randrange(2**31))
  killed = str(tmp_path / "killed")
  soak_kill.kill_after_steps(  # around the rollback, then after it
      lambda: _popen(killed, str(tmp_path / "prepared"), stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL), killed, (rng.randint(8, 10), rng.randint(10, 14)))
  _run(killed, str(tmp_path / "prepared"))
  diffs = soak_kill.differences(workdir, killed)
  assert not diffs, diffs
