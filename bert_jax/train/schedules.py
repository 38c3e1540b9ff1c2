"""Learning-rate schedules (`config.train.schedule`), each a function of the step alone.

All warm up linearly from 0 to the peak `learning_rate` over `warmup_steps`, then:

  linear        the reference (google-research/bert): lr * (1 - s/N), the decay measured
                from step 0 and overridden by the warm-up (so it meets the warm-up line
                below the peak when warmup_steps > 0, as the reference's does)
  cosine        half a cosine from the peak at the warm-up's end to min_lr at N
                (optax.warmup_cosine_decay_schedule)
  wsd           warm-up, stable, decay (MiniCPM, arXiv 2404.06395; ModernBERT): the peak
                until the last `decay_fraction` of the steps, then down to min_lr in
                `decay_shape`: linear, cosine or sqrt (1 - sqrt(t), MiniCPM's)
  inverse_sqrt  the peak at the warm-up's end, then lr * sqrt(warmup / s) (Vaswani et
                al. 2017; T5's rsqrt), never reaching 0; it ignores N
  phases        a segment per phase (`phase_lr`), each from the rate the phase starts at
                (the previous one's last, or a rate of its own) to a share of it:
                constant, linear, cosine or sqrt (1 - sqrt(t)); the stages of ModernBERT,
                Ettin and mmBERT (constant, a new constant, a 1-sqrt decay). The warm-up
                scales the first steps: lr(s) * s / warmup

N is `num_steps`. A schedule is a pure function of the step, and the optimizer's
state counts the steps, so a resume continues it exactly. Raising `num_steps` on
resume moves N: with `wsd` a run still in its stable phase continues at the same
learning rate and decays later (extending a run is what WSD is for); `linear` and
`cosine` jump to their new curve.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax.numpy as jnp
import optax

from bert_jax.settings.optimizer import SCHEDULES, parse_segment, wsd_decay_start as decay_start

if TYPE_CHECKING:
  from bert_jax.settings import OptimizerSettings

def linear(lr: float, warmup: int, num_steps: int) -> optax.Schedule:
  """The reference: lr*s/warmup for s < warmup, else lr*(1 - s/num_steps)."""
  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    decay = lr * jnp.maximum(0.0, 1.0 - step / num_steps)
    if warmup <= 0:
      return decay
    return jnp.where(step < warmup, lr * step / warmup, decay)
  return schedule


def cosine(lr: float, warmup: int, num_steps: int, min_lr: float) -> optax.Schedule:
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=lr, warmup_steps=warmup, decay_steps=num_steps,
      end_value=min_lr)




def wsd(lr: float, warmup: int, num_steps: int, decay_fraction: float, shape: str,
        min_lr: float) -> optax.Schedule:
  start = decay_start(num_steps, decay_fraction)
  length = num_steps - start
  if shape == "linear":
    decay = optax.linear_schedule(lr, min_lr, length)
  elif shape == "cosine":
    decay = optax.cosine_decay_schedule(lr, length, alpha=min_lr / lr)
  else:  # sqrt: 1 - sqrt(t), t in [0, 1]
    def decay(count):
      t = jnp.clip(jnp.asarray(count, jnp.float32) / length, 0.0, 1.0)
      return min_lr + (lr - min_lr) * (1.0 - jnp.sqrt(t))
  return optax.join_schedules(
      [optax.linear_schedule(0.0, lr, warmup), optax.constant_schedule(lr), decay],
      boundaries=[warmup, start])


def inverse_sqrt(lr: float, warmup: int) -> optax.Schedule:
  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    return jnp.where(step < warmup, lr * step / warmup,
                     lr * jnp.sqrt(warmup / jnp.maximum(step, 1.0)))
  return schedule


def by_phase(lr: float, warmup: int, bounds: tuple, segments: tuple) -> optax.Schedule:
  """One segment per phase [start, end), each from its first rate r0 to r1 = ratio * r0
  at the phase's end: r0 + (r1 - r0) * shape(t), t = (s - start) / (end - start)."""
  parts, rate = [], lr
  for (start, end), text in zip(bounds, segments):
    kind, at, ratio = parse_segment(text)
    r0 = at if at is not None else rate
    rate = r0 * ratio
    parts.append((start, end, kind, r0, rate))

  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    out = jnp.float32(parts[-1][4])  # after the last phase: its last rate
    for start, end, kind, r0, r1 in reversed(parts):
      t = jnp.clip((step - start) / max(end - start, 1), 0.0, 1.0)
      shape = {"constant": jnp.zeros_like(t), "linear": t, "sqrt": jnp.sqrt(t),
               "cosine": (1.0 - jnp.cos(jnp.pi * t)) / 2.0}[kind]
      out = jnp.where(step < end, r0 + (r1 - r0) * shape, out)
    if warmup > 0:
      out = jnp.where(step < warmup, out * step / warmup, out)
    return out
  return schedule


def make(s: OptimizerSettings) -> optax.Schedule:
  """`s.schedule` as an optax schedule (the settings were checked when made)."""
  lr, warmup, n = s.learning_rate, s.warmup_steps, s.num_steps
  min_lr = s.min_lr_ratio * lr
  return BUILDERS[s.schedule](s, lr, warmup, n, min_lr)


# Each schedule settings/optimizer.SCHEDULES names, and how its settings build it (no
# fallback: a name without a builder fails here, at import, not as a linear schedule).
BUILDERS = {
    "linear": lambda s, lr, warmup, n, min_lr: linear(lr, warmup, n),
    "cosine": lambda s, lr, warmup, n, min_lr: cosine(lr, warmup, n, min_lr),
    "wsd": lambda s, lr, warmup, n, min_lr: wsd(lr, warmup, n, s.decay_fraction,
                                                 s.decay_shape, min_lr),
    "inverse_sqrt": lambda s, lr, warmup, n, min_lr: inverse_sqrt(lr, warmup),
    "phases": lambda s, lr, warmup, n, min_lr: by_phase(lr, warmup, s.phase_bounds, s.phase_lr),
}
assert set(BUILDERS) == set(SCHEDULES), (sorted(BUILDERS), SCHEDULES)
