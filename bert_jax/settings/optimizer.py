"""`config.train`'s optimizer and learning-rate schedule: the names a run may choose
(train/optim and train/schedules build them) and every check of their values.
"""

from __future__ import annotations

import dataclasses
import math

from bert_jax.settings.checks import fail, is_int, positive_int

# `config.train.optimizer`; optim.make_optimizer builds them. 'stable_adamw': AdamW with
# StableAdamW's per-tensor update clipping (ModernBERT's optimizer).
OPTIMIZERS = ("adamw", "lamb", "stable_adamw")
# `config.train.schedule` (train/schedules); 'phases': a segment per phase (`phase_lr`).
SCHEDULES = ("linear", "cosine", "wsd", "inverse_sqrt", "phases")
SEGMENTS = ("constant", "linear", "cosine", "sqrt")  # a phase's segment of the 'phases' schedule
DECAY_SHAPES = ("linear", "cosine", "sqrt")  # `config.train.decay_shape`, of a wsd schedule


def parse_segment(text: str) -> tuple[str, float | None, float]:
  """'KIND[@LR][->RATIO]' -> (kind, the rate it starts at or None, the share it ends at).

  'constant' holds the rate the phase starts at (the previous phase's last, or
  train.learning_rate); 'constant@3e-4' holds 3e-4. 'linear', 'cosine' and 'sqrt'
  (1 - sqrt(t)) decay from it to RATIO times it over the phase: 'sqrt->0.001'."""
  form = ("'KIND[@LR][->RATIO]' with KIND one of " + ", ".join(SEGMENTS)
          + ", e.g. 'constant', 'constant@3e-4', 'sqrt->0.001'")
  if not isinstance(text, str):
    raise ValueError(form)
  head, arrow, ratio_text = text.partition("->")
  kind, at, lr_text = head.partition("@")
  try:
    lr = float(lr_text) if at else None
    ratio = float(ratio_text) if arrow else 1.0
  except ValueError:
    raise ValueError(form) from None
  if (kind not in SEGMENTS or (kind == "constant") == bool(arrow)
      or (lr is not None and not (math.isfinite(lr) and lr > 0)) or not 0 <= ratio <= 1):
    raise ValueError(form + " (a decay names its end ratio in [0, 1]; a constant none)")
  return kind, lr, ratio


def wsd_decay_start(num_steps: int, decay_fraction: float) -> int:
  """The first step of a WSD schedule's decay (train/schedules, and settings' check)."""
  return num_steps - int(round(decay_fraction * num_steps))

@dataclasses.dataclass(frozen=True)
class OptimizerSettings:
  """What the optimizer reads (from `config.train`)."""
  learning_rate: float = 1e-4
  warmup_steps: int = 10_000
  num_steps: int = 1_000_000
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-6
  weight_decay: float = 0.01
  max_grad_norm: float = 1.0
  optimizer: str = "adamw"  # or "lamb"
  schedule: str = "linear"  # SCHEDULES
  decay_fraction: float = 0.1  # wsd: the final share of num_steps that decays
  decay_shape: str = "linear"  # wsd: DECAY_SHAPES
  min_lr_ratio: float = 0.0  # cosine, wsd: where the decay ends, as a share of the peak
  phase_lr: tuple = ()  # 'phases': one segment per phase (parse_segment)
  phase_bounds: tuple = ()  # 'phases': (start, end) of each phase, set with the phases
  # The decay of a moving average of the parameters kept in each phase (0: none there);
  # () = none. ema_spans: (start, end, decay) of each phase, set with the phases.
  phase_ema: tuple = ()
  ema_spans: tuple = ()

  def __post_init__(self):
    if self.optimizer not in OPTIMIZERS:
      raise fail("train.optimizer", self.optimizer, f"one of {', '.join(map(repr, OPTIMIZERS))}")
    positive_int("train.num_steps", self.num_steps)
    if not is_int(self.warmup_steps) or self.warmup_steps < 0:
      raise fail("train.warmup_steps", self.warmup_steps, "an integer >= 0")
    self._check_schedule()
    # NaN compares false everywhere, so every check is written to fail on it.
    if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
      raise fail("train.learning_rate", self.learning_rate, "a finite number > 0")
    for name in ("b1", "b2"):
      if not 0.0 <= getattr(self, name) < 1.0:
        raise fail(f"train.{name}", getattr(self, name), "0 <= value < 1")
    if not (math.isfinite(self.eps) and self.eps > 0):
      raise fail("train.eps", self.eps, "a finite number > 0")
    if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
      raise fail("train.weight_decay", self.weight_decay, "a finite number >= 0")
    for d in self.phase_ema:
      if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0.0 <= d < 1.0:
        raise fail("train.phase_ema", tuple(self.phase_ema), "() or one decay per phase, "
                   "0 <= decay < 1 (0: no average in that phase), e.g. '(0, 0, 0.999)'")
    if not (math.isfinite(self.max_grad_norm) and self.max_grad_norm >= 0):
      raise fail("train.max_grad_norm", self.max_grad_norm,
                  "a finite number >= 0 (0 = no clipping)")

  def _check_schedule(self) -> None:
    if self.schedule not in SCHEDULES:
      raise fail("train.schedule", self.schedule, f"one of {', '.join(map(repr, SCHEDULES))}")
    if bool(self.phase_lr) != (self.schedule == "phases"):
      raise fail("train.phase_lr", tuple(self.phase_lr), "a segment per phase with "
                 "--config.train.schedule='phases', and () with any other schedule")
    for segment in self.phase_lr:
      try:
        parse_segment(segment)
      except ValueError as e:
        raise fail("train.phase_lr", tuple(self.phase_lr), str(e)) from None
    if self.phase_bounds and len(self.phase_bounds) != len(self.phase_lr):
      raise fail("train.phase_lr", tuple(self.phase_lr), f"{len(self.phase_bounds)} segments, "
                 "one per phase")
    if self.decay_shape not in DECAY_SHAPES:
      raise fail("train.decay_shape", self.decay_shape,
                  f"one of {', '.join(map(repr, DECAY_SHAPES))}")
    if not (isinstance(self.decay_fraction, (int, float)) and 0.0 < self.decay_fraction <= 1.0):
      raise fail("train.decay_fraction", self.decay_fraction, "0 < fraction <= 1")
    if not (isinstance(self.min_lr_ratio, (int, float)) and 0.0 <= self.min_lr_ratio < 1.0):
      raise fail("train.min_lr_ratio", self.min_lr_ratio, "0 <= ratio < 1 (of the peak)")
    if self.schedule == "inverse_sqrt" and self.warmup_steps <= 0:
      raise fail("train.warmup_steps", self.warmup_steps, "> 0 with schedule='inverse_sqrt'")
    start = wsd_decay_start(self.num_steps, self.decay_fraction)
    if self.schedule == "wsd" and start < self.warmup_steps:
      raise fail("train.decay_fraction", self.decay_fraction, f"a share whose decay starts "
                  f"after the warm-up ({self.warmup_steps} of {self.num_steps} steps)")
    if self.schedule == "wsd" and start >= self.num_steps:
      raise fail("train.decay_fraction", self.decay_fraction, f"a share that decays over at "
                  f"least 1 of the {self.num_steps} steps (it rounds to 0 decay steps; at "
                  f"least {1 / self.num_steps:.3g})")
