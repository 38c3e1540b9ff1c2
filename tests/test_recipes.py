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
