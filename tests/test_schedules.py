"""Learning-rate schedules (bert_jax.train.schedules): each against its closed form at
chosen steps, the settings' checks, and a WSD run extended on resume without a jump."""

import json
import math
import os
import shutil

import numpy as np
import pytest

from bert_jax.errors import ConfigError
from bert_jax.settings import OptimizerSettings
from bert_jax.train import schedules

LR, WARM, N = 2e-4, 10, 100
STEPS = (0, 3, 10, 11, 37, 79, 80, 81, 90, 99, 100, 130)


def _lr(schedule, **kw):
  s = OptimizerSettings(learning_rate=LR, warmup_steps=WARM, num_steps=N, schedule=schedule, **kw)
  f = schedules.make(s)
  return np.array([float(f(t)) for t in STEPS])


def _warm(t):
  return LR * t / WARM


def _close(got, want):
  np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-12)


def test_linear_is_the_reference_decay_measured_from_step_0():
  _close(_lr("linear"), [_warm(t) if t < WARM else LR * max(0.0, 1 - t / N) for t in STEPS])


def test_cosine_is_half_a_cosine_from_the_warmups_end_to_min_lr():
  lo = 0.1 * LR

  def want(t):
    if t < WARM:
      return _warm(t)
    x = min(1.0, (t - WARM) / (N - WARM))
    return lo + (LR - lo) * 0.5 * (1 + math.cos(math.pi * x))
  _close(_lr("cosine", min_lr_ratio=0.1), [want(t) for t in STEPS])


@pytest.mark.parametrize("shape, f", [
    ("linear", lambda x: 1 - x),
    ("cosine", lambda x: 0.5 * (1 + math.cos(math.pi * x))),
    ("sqrt", lambda x: 1 - math.sqrt(x)),
])
def test_wsd_holds_the_peak_then_decays_over_the_last_fraction(shape, f):
  lo, start = 0.05 * LR, 80  # decay_fraction 0.2 of 100 steps

  def want(t):
    if t < WARM:
      return _warm(t)
    if t < start:
      return LR
    return lo + (LR - lo) * f(min(1.0, (t - start) / (N - start)))
  _close(_lr("wsd", decay_fraction=0.2, decay_shape=shape, min_lr_ratio=0.05),
         [want(t) for t in STEPS])


def test_inverse_sqrt_peaks_at_the_warmups_end_then_falls_as_one_over_sqrt_step():
  _close(_lr("inverse_sqrt"), [_warm(t) if t < WARM else LR * math.sqrt(WARM / t)
                               for t in STEPS])


def test_every_schedule_reaches_the_peak_exactly_at_the_end_of_warmup():
  for name in ("cosine", "wsd", "inverse_sqrt"):
    assert _lr(name)[STEPS.index(WARM)] == pytest.approx(LR), name


def test_raising_num_steps_leaves_a_wsd_schedule_unchanged_before_its_decay():
  short = OptimizerSettings(learning_rate=LR, warmup_steps=WARM, num_steps=N, schedule="wsd")
  long = OptimizerSettings(learning_rate=LR, warmup_steps=WARM, num_steps=3 * N, schedule="wsd")
  a, b = schedules.make(short), schedules.make(long)
  stable = schedules.decay_start(N, 0.1)
  assert [float(a(t)) for t in range(stable)] == [float(b(t)) for t in range(stable)]
  assert float(b(stable)) == pytest.approx(LR) and float(a(stable + 1)) < 0.99 * LR  # still stable


@pytest.mark.parametrize("fields, field", [
    ({"schedule": "step"}, "train.schedule"),
    ({"schedule": "wsd", "decay_shape": "exp"}, "train.decay_shape"),
    ({"schedule": "wsd", "decay_fraction": 0.0}, "train.decay_fraction"),
    ({"schedule": "wsd", "decay_fraction": 0.95}, "train.decay_fraction"),  # before warm-up ends
    ({"schedule": "wsd", "decay_fraction": 0.004}, "train.decay_fraction"),  # 0 decay steps
    ({"schedule": "cosine", "min_lr_ratio": 1.0}, "train.min_lr_ratio"),
    ({"schedule": "inverse_sqrt", "warmup_steps": 0}, "train.warmup_steps"),
])
def test_a_bad_schedule_setting_is_one_line_naming_the_field(fields, field):
  with pytest.raises(ConfigError) as e:
    OptimizerSettings(**{"learning_rate": LR, "warmup_steps": WARM, "num_steps": N, **fields})
  assert f"--config.{field}" in str(e.value) and "\n" not in str(e.value)


def _rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    rows = [json.loads(line) for line in f]
  return {r["step"]: r for r in rows if r["split"] == "train"}


@pytest.mark.slow
def test_a_wsd_run_extended_from_its_stable_phase_continues_as_the_longer_run(tmp_path):
  """A 16-step WSD run's checkpoint at step 8 (stable), resumed with num_steps=32: every
  train row (learning rate included) is the fresh 32-step run's."""
  import soak_kill
  from bert_jax.trainer import train_and_evaluate
  cache = str(tmp_path / "prepared")
  wsd = {"train.schedule": "wsd", "train.decay_fraction": 0.25, "train.warmup_steps": 2}
  short, extended, fresh = (str(tmp_path / n) for n in ("short", "extended", "fresh"))
  train_and_evaluate(soak_kill.tiny_config(cache, 16, **wsd), short)
  shutil.copytree(short, extended)
  for step in soak_kill.complete_steps(extended):
    if step > 8:
      shutil.rmtree(os.path.join(extended, "checkpoints", str(step)))
  train_and_evaluate(soak_kill.tiny_config(cache, 32, **wsd), extended)
  train_and_evaluate(soak_kill.tiny_config(cache, 32, **wsd), fresh)
  got, want, ended = _rows(extended), _rows(fresh), _rows(short)
  assert sorted(got) == sorted(want) == list(range(1, 33))
  for step in want:
    assert got[step]["learning_rate"] == want[step]["learning_rate"], step
    assert got[step]["loss"] == want[step]["loss"], step
  # The short run decayed from step 12; the extended one, past its old decay, did not.
  peak = want[4]["learning_rate"]
  assert ended[14]["learning_rate"] < peak == got[14]["learning_rate"] == got[23]["learning_rate"]


# --- 'phases': one segment per phase (the stages of ModernBERT, Ettin, mmBERT) ---

BOUNDS = ((0, 60), (60, 90), (90, 100))


def _phases_lr(segments, steps=range(0, 105)):
  s = OptimizerSettings(learning_rate=LR, warmup_steps=WARM, num_steps=N, schedule="phases",
                        phase_lr=segments, phase_bounds=BOUNDS)
  f = schedules.make(s)
  return np.array([float(f(t)) for t in steps])


def test_phases_warm_up_hold_a_new_constant_then_decay_in_1_sqrt_at_every_step():
  # ModernBERT: warm-up then constant 8e-4 (here LR), constant 3e-4 in the extension,
  # then 1-sqrt down to 0.001 of it in the decay.
  got = _phases_lr(("constant", "constant@1e-4", "sqrt->0.001"))
  def want(t):
    if t < 60:
      return LR * min(1.0, t / WARM)
    if t < 90:
      return 1e-4
    r1 = 1e-4 * 0.001
    return 1e-4 + (r1 - 1e-4) * math.sqrt(min(1.0, (t - 90) / 10)) if t < 100 else r1
  _close(got, [want(t) for t in range(0, 105)])


@pytest.mark.parametrize("kind,shape", [
    ("linear", lambda t: t), ("cosine", lambda t: (1 - math.cos(math.pi * t)) / 2),
    ("sqrt", math.sqrt)])
def test_a_decay_goes_from_the_rate_its_phase_starts_at_to_its_share(kind, shape):
  # Ettin's extension: 1-sqrt to 0.5x, from the rate the first phase ends at.
  got = _phases_lr(("linear->0.5", f"{kind}->0.5", "constant"))
  first_end = LR * 0.5
  def want(t):
    if t < 60:  # the warm-up scales the segment's own rate
      return (LR + (first_end - LR) * t / 60) * min(1.0, t / WARM)
    if t < 90:
      return first_end + (first_end * 0.5 - first_end) * shape((t - 60) / 30)
    return first_end * 0.5
  _close(got, [want(t) for t in range(0, 105)])


@pytest.mark.parametrize("segments,says", [
    (("constant", "constant", "bogus"), "KIND"), (("constant->0.5",), "KIND"),
    (("sqrt",), "end ratio"), (("sqrt->2",), "[0, 1]"), (("constant@-1",), "KIND"),
    (("constant", "constant"), "3 segments, one per phase")])
def test_bad_segments_are_one_line_naming_phase_lr(segments, says):
  with pytest.raises(ConfigError, match="train.phase_lr") as e:
    OptimizerSettings(schedule="phases", phase_lr=segments, phase_bounds=BOUNDS)
  assert says in str(e.value) and "\n" not in str(e.value)


def test_phase_lr_without_the_phases_schedule_is_refused():
  with pytest.raises(ConfigError, match="schedule='phases'"):
    OptimizerSettings(schedule="linear", phase_lr=("constant",))
