"""The rest of `config.train`: the batch, its accumulation and warm-up, the phases of
sequence lengths, the NaN/inf limit and loss-spike rollback.
"""

from __future__ import annotations

import dataclasses

from bert_jax.errors import ConfigError
from bert_jax.settings.checks import fail, is_int, positive_int

MIN_SEQ_LEN = 8  # [CLS] a [SEP] b [SEP] plus room to mask something


@dataclasses.dataclass(frozen=True)
class SpikeSettings:
  """`config.train.spike_rollback`: roll back when the loss spikes (train/spikes)."""
  factor: float = 0.0  # 0: off
  patience: int = 3
  window: int = 100
  max_rollbacks: int = 3

  def __post_init__(self):
    if not (isinstance(self.factor, (int, float)) and (self.factor == 0 or self.factor > 1)):
      raise fail("train.spike_rollback.factor", self.factor, "0 (off) or a number > 1")
    for name in ("patience", "window", "max_rollbacks"):
      positive_int(f"train.spike_rollback.{name}", getattr(self, name))

@dataclasses.dataclass(frozen=True)
class BatchRampSettings:
  """`config.train.batch_ramp`: the global batch grows from `start` to train.batch_size
  over `steps` steps, in `stages` sizes (data/batch_ramp)."""
  start: int = 0  # the global batch at step 0; 0: off (train.batch_size throughout)
  steps: int = 0  # steps until train.batch_size
  stages: int = 4  # sizes before train.batch_size, each for steps / stages steps

  def __post_init__(self):
    if not is_int(self.start) or self.start < 0:
      raise fail("train.batch_ramp.start", self.start, "0 (off) or the first global batch")
    if not is_int(self.steps) or self.steps < 0 or (self.start and not self.steps):
      raise fail("train.batch_ramp.steps", self.steps, "a positive number of steps with "
                 "--config.train.batch_ramp.start")
    positive_int("train.batch_ramp.stages", self.stages)


@dataclasses.dataclass(frozen=True)
class Phase:
  """Steps [start, end) train at one sequence length."""
  index: int
  start: int  # first step (inclusive)
  end: int  # last step (exclusive)
  seq_len: int
  max_predictions: int
  rope_theta: float = 0.0  # the global layers' RoPE base in this phase (0: the model's)
  # The share of tokens masked: from mask_start at the phase's first step to mask_end at
  # its last, linearly (equal: constant; 0: config.masking.mask_prob).
  mask_start: float = 0.0
  mask_end: float = 0.0
  batch_size: int = 0  # the global batch of this phase (0: train.batch_size)
  # Adam's moments start afresh at this phase's first step (the schedule goes on).
  reset_optimizer: bool = False

  def mask_prob_at(self, step: int, default: float) -> float:
    """The masking rate of `step` (closed form; the train step computes the same)."""
    a, b = self.mask_start or default, self.mask_end or default
    if a == b or self.end - self.start <= 1:
      return a
    return a + (b - a) * min(max(step - self.start, 0), self.end - self.start - 1) / (
        self.end - self.start - 1)


@dataclasses.dataclass(frozen=True)
class TrainSettings:
  """The rest of `config.train`: batch, accumulation, phases, the NaN/inf limit."""
  batch_size: int
  grad_accum_steps: int
  max_consecutive_nonfinite: int
  phases: tuple[Phase, ...]
  spike: SpikeSettings = SpikeSettings()
  ramp: BatchRampSettings = BatchRampSettings()

  @property
  def num_steps(self) -> int:
    return self.phases[-1].end

  def batch_of(self, phase: Phase) -> int:
    """The global batch of `phase` (its own, else batch_size)."""
    return phase.batch_size or self.batch_size

  def batch_fields(self) -> list[tuple[int, str]]:
    """(global batch, the config field that set it) of every phase, each size once."""
    own = any(p.batch_size not in (0, self.batch_size) for p in self.phases)
    out = {}
    for ph in self.phases:
      field = f"train.phase_batch_sizes[{ph.index}]" if own else "train.batch_size"
      out.setdefault(self.batch_of(ph), field)
    return list(out.items())

  @property
  def batch_sizes(self) -> list[int]:
    """The distinct global batches of the phases, in order."""
    return list(dict.fromkeys(self.batch_of(ph) for ph in self.phases))

  @property
  def seq_lens(self) -> list[int]:
    return sorted({ph.seq_len for ph in self.phases})


def phases(fractions: tuple, seq_lens: tuple, max_predictions: tuple, num_steps: int,
           max_positions: int, rope_thetas: tuple = (),
           mask_probs: tuple = (), batch_sizes: tuple = (),
           batch_size: int = 0, steps: tuple = (), resets: tuple = ()) -> tuple[Phase, ...]:
  """Splits `num_steps` into phases by fraction (the last one ends at num_steps), or by
  `steps`, each phase's exact count (settings/budgets; their sum is num_steps)."""
  fractions, seq_lens, preds = tuple(fractions), tuple(seq_lens), tuple(max_predictions)
  thetas = _rope_thetas(tuple(rope_thetas), len(fractions))
  masks = _mask_probs(tuple(mask_probs), len(fractions))
  batches = batch_sizes_of(tuple(batch_sizes), len(fractions), batch_size)
  resets = tuple(resets) or (False,) * len(fractions)
  if len(resets) != len(fractions) or not all(isinstance(r, bool) for r in resets):
    raise fail("train.phase_reset_optimizer", resets, f"() or {len(fractions)} booleans, "
               "one per phase, e.g. '(False, False, True)'")
  if steps:  # budgets: the fractions follow from them (and are not read)
    fractions = tuple(s / sum(steps) for s in steps)
  if not (len(fractions) == len(seq_lens) == len(preds)) or not fractions:
    raise ConfigError("--config.train.phase_fractions, seq_lens and max_predictions: expected "
                      f"tuples of one equal length, got {fractions}, {seq_lens}, {preds}")
  if any(f <= 0 for f in fractions) or abs(sum(fractions) - 1.0) > 1e-6:
    raise fail("train.phase_fractions", fractions, "positive fractions summing to 1")
  for name, values in (("seq_lens", seq_lens), ("max_predictions", preds)):
    if not all(is_int(v) for v in values):
      raise fail(f"train.{name}", values, "integers, e.g. '(128,512)'")
  out, start, acc = [], 0, 0.0
  for i, (f, seq_len, p) in enumerate(zip(fractions, seq_lens, preds)):
    if seq_len > max_positions:
      raise ConfigError(f"--config.train.seq_lens[{i}]={seq_len} is above --config.model."
                        f"max_position_embeddings={max_positions}; expected at most that")
    if seq_len < MIN_SEQ_LEN or not 0 < p <= seq_len:
      raise ConfigError(f"--config.train.seq_lens[{i}]={seq_len}, max_predictions[{i}]={p}: "
                        f"expected seq_len >= {MIN_SEQ_LEN} and 0 < max_predictions <= seq_len")
    acc += f
    end = (start + int(steps[i]) if steps else
           num_steps if i == len(fractions) - 1 else int(round(acc * num_steps)))
    out.append(Phase(i, start, end, int(seq_len), int(p), thetas[i], *masks[i], batches[i],
                     resets[i]))
    start = end
  # num_steps=0 (an evaluation of a continued run's source) keeps an empty first phase.
  return tuple(ph for ph in out if ph.end > ph.start) or tuple(out[:1])


def batch_sizes_of(sizes: tuple, n: int, default: int) -> list[int]:
  """`config.train.phase_batch_sizes` as one global batch per phase (() = `default`)."""
  if not sizes:
    return [int(default)] * n
  if len(sizes) != n or not all(is_int(b) and b > 0 for b in sizes):
    raise fail("train.phase_batch_sizes", sizes, f"() or {n} positive integers, one global "
               "batch per phase, e.g. '(768, 576)'")
  return [int(b) for b in sizes]


def _mask_probs(masks: tuple, n: int) -> list[tuple[float, float]]:
  """`config.train.phase_mask_probs` as (start, end) per phase ((0, 0): masking.mask_prob).
  An entry is a rate (constant) or (start, end), a linear ramp over the phase."""
  if not masks:
    return [(0.0, 0.0)] * n
  rate = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1
  out = []
  for m in masks:
    pair = tuple(m) if isinstance(m, (tuple, list)) else (m, m)
    if len(pair) != 2 or not all(rate(v) for v in pair):
      out = []
      break
    out.append((float(pair[0]), float(pair[1])))
  if len(out) != n:
    raise fail("train.phase_mask_probs", masks, f"() or {n} entries, one per phase, each a "
               "rate in (0, 1) or a (start, end) ramp over the phase, e.g. '((0.3, 0.15), 0.05)'")
  return out


def _rope_thetas(thetas: tuple, n: int) -> tuple[float, ...]:
  """`config.train.phase_rope_thetas` as one float per phase (0.0: the model's)."""
  if not thetas:
    return (0.0,) * n
  if len(thetas) != n or not all(isinstance(t, (int, float)) and not isinstance(t, bool)
                                 and 0 < t < float("inf") for t in thetas):
    raise fail("train.phase_rope_thetas", thetas, f"() or {n} positive numbers, one per phase "
               "(the global layers' RoPE base, e.g. (10000, 160000))")
  return tuple(float(t) for t in thetas)
