"""The typed options a run may add to the recipe and to what it reports: loss-spike
rollback, a batch-size warm-up, probes during training, profiles.

`settings.from_config` builds them from the config, as every other setting; their
checks live here, beside the helpers every check of a config value shares (one
`error:` line naming `--config.<field>` and what was expected). No JAX.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from bert_jax.errors import ConfigError


def wsd_decay_start(num_steps: int, decay_fraction: float) -> int:
  """The first step of a WSD schedule's decay (train/schedules, and settings' check)."""
  return num_steps - int(round(decay_fraction * num_steps))


def fail(field: str, value: Any, expected: str) -> ConfigError:
  return ConfigError(f"--config.{field}={value!r}: expected {expected}")


def is_int(v: Any) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


def positive_int(field: str, v: Any) -> None:
  if not is_int(v) or v <= 0:
    raise fail(field, v, "a positive integer")


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


PROBE_POOLINGS = ("mean", "cls", "pooler")  # bert_jax.features.extract's, less per-token 'none'


@dataclasses.dataclass(frozen=True)
class ProbeSettings:
  """`config.probe`: linear probes (bert_jax.eval.probe) of the parameters at every eval."""
  tasks: tuple = ()
  layers: tuple = (-1,)
  pooling: str = "mean"
  max_examples: int = 0  # per split; 0 = all
  data_dir: str = ""

  def __post_init__(self):
    if (not isinstance(self.tasks, (tuple, list))
        or not all(isinstance(t, str) and t.strip() for t in self.tasks)):
      raise fail("probe.tasks", self.tasks, "a tuple of task names or directories, e.g. "
                  "\"('word_order',)\" (bert_jax.eval.tasks), or () for none")
    if (not isinstance(self.layers, (tuple, list)) or not self.layers
        or not all(is_int(x) for x in self.layers)):
      raise fail("probe.layers", self.layers, "a tuple of layer indices such as (-1,)")
    if self.pooling not in PROBE_POOLINGS:
      raise fail("probe.pooling", self.pooling, f"one of {', '.join(map(repr, PROBE_POOLINGS))}")
    if not is_int(self.max_examples) or (self.max_examples and self.max_examples < 5):
      raise fail("probe.max_examples", self.max_examples, "0 (every example) or an integer >= 5")
    if not isinstance(self.data_dir, str):
      raise fail("probe.data_dir", self.data_dir, "a directory path, or ''")


@dataclasses.dataclass(frozen=True)
class ProfileSettings:
  """`config.profile`: jax.profiler traces of chosen steps (train/profiling)."""
  steps: tuple = ()  # (start, end): steps start..end-1; () = none planned
  on_demand_steps: int = 5  # steps traced when <workdir>/PROFILE appears

  def __post_init__(self):
    if self.steps and not (len(self.steps) == 2 and all(is_int(s) for s in self.steps)
                           and 0 <= self.steps[0] < self.steps[1]):
      raise fail("profile.steps", self.steps, "() or (start, end) with 0 <= start < end")
    positive_int("profile.on_demand_steps", self.on_demand_steps)


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
