"""How a run is kept and watched: `config.mesh`, the bookkeeping fields at the top of
the config (seed, log / eval / checkpoint cadence, compile cache, watchdog,
stragglers), and the reports it may add: `config.probe`, `config.profile`.
"""

from __future__ import annotations

import dataclasses

from bert_jax.settings.checks import fail, is_int, positive_int

MIN_WATCHDOG_S = 1.0  # train/watchdog: below this, healthy steps' gaps look like hangs
PROBE_POOLINGS = ("mean", "cls", "pooler")  # bert_jax.features.extract's, less per-token 'none'


@dataclasses.dataclass(frozen=True)
class MeshSettings:
  model_parallel: int = 1
  param_sharding: str = "replicated"

  def __post_init__(self):
    positive_int("mesh.model_parallel", self.model_parallel)
    if self.param_sharding not in ("replicated", "fsdp"):
      raise fail("mesh.param_sharding", self.param_sharding, "'replicated' or 'fsdp'")


@dataclasses.dataclass(frozen=True)
class RunSettings:
  """Bookkeeping: seed, how often to log / evaluate / checkpoint."""
  seed: int = 0
  log_every: int = 100
  eval_every: int = 10_000
  eval_batches: int = 0
  checkpoint_every: int = 10_000
  keep_checkpoints: int = 3
  progress_bar: bool = True
  plot: bool = True  # training_curves.png at the end
  compile_cache_dir: str = ""  # JAX persistent compilation cache ('' = off)
  watchdog_s: float = 0.0  # train/watchdog: no step for this long dumps the stacks (0 = off)
  watchdog_exit: bool = False  # and then exits with status 3
  straggler_factor: float = 3.0  # train/stragglers: name a process waiting this x the median

  def __post_init__(self):
    for name in ("log_every", "eval_every", "checkpoint_every", "keep_checkpoints"):
      positive_int(name, getattr(self, name))
    if not (isinstance(self.straggler_factor, (int, float)) and (
        self.straggler_factor == 0 or 1 < self.straggler_factor < float("inf"))):
      raise fail("straggler_factor", self.straggler_factor, "0 (off) or a number > 1")
    if not (isinstance(self.watchdog_s, (int, float)) and 0 <= self.watchdog_s < float("inf")
            and (self.watchdog_s == 0 or self.watchdog_s >= MIN_WATCHDOG_S)):
      raise fail("watchdog_s", self.watchdog_s, f"0 (off) or seconds >= {MIN_WATCHDOG_S:g} "
                  "(a shorter wait fires between healthy steps; the watchdog is for hangs of "
                  "minutes)")
    if not is_int(self.eval_batches) or self.eval_batches < 0:
      raise fail("eval_batches", self.eval_batches, "an integer >= 0 (0 = the whole eval split)")


@dataclasses.dataclass(frozen=True)
class ProbeSettings:
  """`config.probe`: linear probes (bert_jax.eval.probe) of the parameters at every eval."""
  tasks: tuple = ("word_order",)
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
