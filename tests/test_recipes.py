"""Issue 57: configs/modernbert_base.py is ModernBERT's published three-stage recipe, step
for step: each stage's tokens, length, batch, RoPE base, masking rate and learning-rate
segment against the table (arXiv 2412.13663; the issue's stage table)."""

import numpy as np
import pytest

from bert_jax import settings
from bert_jax.train import schedules
from configs import modernbert_base

# stage: (tokens, length, sequences per step, global RoPE base)
TABLE = {"pre-train": (1.7e12, 1024, 4608, 10_000.0),
         "extension": (250e9, 8192, 576, 160_000.0),
         "decay": (50e9, 8192, 576, 160_000.0)}
LR, EXTENSION_LR, DECAY_TO = 8e-4, 3e-4, 0.001


@pytest.fixture(scope="module")
def s():
  return settings.from_config(modernbert_base.get_config())


def test_each_stage_trains_its_tokens_at_its_length_batch_and_base(s):
  assert len(s.train.phases) == len(TABLE)
  for ph, (name, (tokens, length, batch, theta)) in zip(s.train.phases, TABLE.items()):
    steps = ph.end - ph.start
    assert (ph.seq_len, s.train.batch_of(ph), ph.rope_theta) == (length, batch, theta), name
    assert abs(steps * length * batch - tokens) <= length * batch / 2, name  # nearest step
    assert ph.mask_prob_at(ph.start, s.masking.mask_prob) == 0.3, name
    assert ph.max_predictions >= 0.3 * length, name
  assert s.masking.eval_mask_prob == 0.15
  assert s.model.local_rope_theta == 10_000.0


def test_the_batch_warms_up_from_768_to_4608_over_50b_tokens_of_the_first_stage(s):
  ramp = s.train.ramp
  assert ramp.start == 768 and s.train.batch_of(s.train.phases[0]) == 4608
  assert abs(ramp.steps * 1024 * (768 + 4608) / 2 - 50e9) < 1024 * 4608
  assert ramp.steps < s.train.phases[0].end


def test_the_learning_rate_is_each_stages_segment_at_every_step(s):
  p0, p1, p2 = s.train.phases
  warmup = s.optimizer.warmup_steps
  assert abs(warmup * 1024 * 4608 - 3e9) < 1024 * 4608  # a 3B-token warm-up
  lr = schedules.make(s.optimizer)
  steps = np.arange(0, p2.end + 1, dtype=np.int64)
  got = np.asarray(lr(steps))
  t = np.clip((steps - p2.start) / (p2.end - p2.start), 0, 1)
  want = np.where(steps < p0.end, LR, np.where(
      steps < p1.end, EXTENSION_LR,
      EXTENSION_LR + (EXTENSION_LR * DECAY_TO - EXTENSION_LR) * np.sqrt(t)))
  want = np.where(steps < warmup, want * steps / warmup, want)
  # float32 steps: within its rounding of the stage rate (3e-4 x 2^-23 x a few)
  np.testing.assert_allclose(got[:-1], want[:-1], rtol=2e-6, atol=1e-10)
  assert abs(got[p2.end - 1] - EXTENSION_LR * DECAY_TO) < EXTENSION_LR * 0.01


def _stages(s):
  return [(ph.end - ph.start, ph.seq_len, s.train.batch_of(ph), ph.rope_theta,
           ph.mask_prob_at(ph.start, s.masking.mask_prob)) for ph in s.train.phases]


def _lr_at_stage_ends(s):
  lr = schedules.make(s.optimizer)
  return [float(lr(np.int64(ph.end - 1))) for ph in s.train.phases]


def test_ettin_150m_is_the_issues_stage_table():
  from configs import ettin_150m
  s = settings.from_config(ettin_150m.get_config())
  for (steps, length, batch, theta, mask), tokens, want in zip(
      _stages(s), (1.7e12, 250e9, 50e9),
      ((1024, 10_000.0, 0.3), (8192, 160_000.0, 0.3), (8192, 160_000.0, 0.15))):
    assert abs(steps * length * batch - tokens) <= length * batch / 2
    assert (length, theta, mask) == want
  pre, ext, decay = _lr_at_stage_ends(s)
  assert pre == pytest.approx(8e-4)  # WSD's stable part: constant after the warm-up
  assert ext == pytest.approx(0.5 * 8e-4, rel=0.02)  # 1-sqrt to 0.5x over the extension
  assert decay == pytest.approx(0.0, abs=8e-4 * 0.05)  # 1-sqrt from 0.5x to 0
  assert s.masking.eval_mask_prob == 0.15


def test_mmbert_base_is_the_issues_stage_table_with_languages_joining():
  from configs import mmbert_base
  c = mmbert_base.get_config()
  c.data.sources = ("first60=a.jsonl", "next50=b.jsonl", "rest=c.jsonl")
  s = settings.from_config(c)
  for (steps, length, batch, theta, mask), tokens, want in zip(
      _stages(s), (2.0e12, 600e9, 100e9),
      ((1024, 10_000.0, 0.3), (8192, 160_000.0, 0.15), (8192, 160_000.0, 0.05))):
    assert abs(steps * length * batch - tokens) <= length * batch / 2
    assert (length, theta, mask) == want
  assert [s.data.phase_mix(i) for i in range(3)] == [
      ((1.0, 0.0, 0.0), 0.7), ((1.0, 1.0, 0.0), 0.5), ((1.0, 1.0, 1.0), 0.3)]
  pre, ext, decay = _lr_at_stage_ends(s)
  assert pre == ext == pytest.approx(8e-4)
  assert decay == pytest.approx(0.02 * 8e-4, rel=0.05)
  # Every stage has room for evaluation's 15% (the 5% stage too).
  assert all(ph.max_predictions >= 0.15 * ph.seq_len for ph in s.train.phases)
  c.data.sources = ("one=a.jsonl",)
  with pytest.raises(Exception, match="data.phase_weights"):
    settings.from_config(c)


@pytest.mark.parametrize("name, masks", [("ettin_tiny", (0.3, 0.3, 0.15)),
                                         ("mmbert_tiny", (0.3, 0.15, 0.05))])
def test_the_tiny_recipes_have_the_stages_of_their_base(name, masks):
  import importlib
  s = settings.from_config(importlib.import_module(f"configs.{name}").get_config())
  assert [m for *_, m in _stages(s)] == list(masks)
  assert [ph.seq_len for ph in s.train.phases] == [64, 128, 128]
  assert all(ph.max_predictions >= 0.15 * ph.seq_len for ph in s.train.phases)
