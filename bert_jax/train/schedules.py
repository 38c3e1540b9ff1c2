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

from bert_jax.settings.optimizer import SCHEDULES, wsd_decay_start as decay_start

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
}
assert set(BUILDERS) == set(SCHEDULES), (sorted(BUILDERS), SCHEDULES)
