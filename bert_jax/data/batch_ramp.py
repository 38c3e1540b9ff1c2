"""Batch-size warm-up (`config.train.batch_ramp`): each step's global batch, and where its
examples start in the data stream.

The global batch grows from `start` to the target over `steps` steps in `stages`
sizes: stage i holds steps [round(i * steps / stages), round((i + 1) * steps / stages))
at start + (target - start) * i / stages, rounded down to a multiple of `unit` (the
data-parallel width times the gradient accumulation, so every size shards evenly);
from `steps` on, the target. Few sizes, so the step compiles a few times, once each.

Both are pure functions of the step, so the data position needs no new state: the
examples before step s are the sum of the sizes before it (`examples_before`), and a
run resumed at step s reads exactly the examples an uninterrupted run reads there. The
learning rate stays a function of the step, as without a ramp. No JAX.
"""

from __future__ import annotations

import dataclasses

from bert_jax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class BatchRamp:
  start: int
  target: int
  steps: int
  stages: int
  unit: int = 1

  def __post_init__(self):
    if self.start % self.unit or self.target % self.unit:
      raise ConfigError(f"--config.train.batch_ramp.start={self.start}: expected a multiple "
                        f"of {self.unit} (the data-parallel devices times the gradient "
                        f"accumulation steps), as --config.train.batch_size is")

  def bounds(self) -> list[tuple[int, int, int]]:
    """(first step, end step, global batch) of each stage, then the target from `steps` on
    (its end: None's stand-in, a step no run reaches)."""
    out, edge = [], lambda i: round(i * self.steps / self.stages)
    for i in range(self.stages):
      size = self.start + (self.target - self.start) * i // self.stages
      size = max(self.unit, size // self.unit * self.unit)
      if edge(i + 1) > edge(i):
        out.append((edge(i), edge(i + 1), size))
    return out + [(self.steps, 2**62, self.target)]

  def sizes(self) -> list[int]:
    """The distinct global batches, in order: what the step compiles for."""
    return list(dict.fromkeys(size for _, _, size in self.bounds()))

  def size(self, step: int) -> int:
    """The global batch of `step`."""
    for first, end, size in self.bounds():
      if first <= step < end:
        return size
    raise ValueError(f"step {step} < 0")

  def examples_before(self, step: int) -> int:
    """Examples of the global stream read by steps 0 .. step-1."""
    return sum(max(0, min(step, end) - first) * size for first, end, size in self.bounds())


def of(start: int, target: int, steps: int, stages: int, unit: int) -> BatchRamp | None:
  """The ramp of these settings; None when off (start 0): one size throughout."""
  return BatchRamp(start, target, steps, stages, unit) if start else None
