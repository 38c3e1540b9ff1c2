"""Linear probes of a training run's current parameters (`config.probe.tasks`).

At every evaluation (and at step 0 of a continued run) the encoder's current
parameters are probed on each task (bert_jax.eval.probe: pooled features, an
L2 logistic regression or ridge fit, the task's GLUE metric), so every run
shows a downstream curve beside its MLM curve. The probe reads the
parameters and changes nothing: no training randomness, no optimizer state,
so a resumed run logs the same probe rows as an uninterrupted one.

One Extractor is kept for the whole run: its programs (one per length
bucket) compile at the first probe and are reused with new parameters.

Several processes (a multi-host run): the forward runs on the training mesh
with the parameters as training shards them (replicated or FSDP; nothing is
copied to a host), every process feeds the same probe inputs as one global
batch and receives every feature, then fits the same deterministic probe
(bert_jax.eval.logreg) on its own devices, so all processes hold the same
metrics; only process 0 logs them (console, reporting).
"""

from __future__ import annotations

import time
from typing import Any, Optional

import jax
from jax.sharding import Mesh, NamedSharding

from bert_jax.data.tokenizer import Tokenizer
from bert_jax.eval import probe, tasks
from bert_jax.eval.task_types import Task
from bert_jax.features.extract import Extractor
from bert_jax.settings.model import ModelConfig
from bert_jax.settings import ProbeSettings

# Probe inputs are single sentences or pairs: longer buckets would only pad.
_MAX_LENGTH = 128


def load_tasks(s: ProbeSettings) -> list[Task]:
  """Every task of `config.probe.tasks`, read before anything is written (TaskError: one line)."""
  return [tasks.load_task(spec, s.data_dir or None) for spec in s.tasks]


class RunProbes:
  """Probes one run's parameters on its tasks; the time spent is counted apart."""

  def __init__(self, s: ProbeSettings, task_list: list[Task], config: ModelConfig,
               tokenizer: Tokenizer, seed: int):
    self.s, self.tasks, self.config, self.tokenizer, self.seed = s, task_list, config, tokenizer, seed
    self.seconds = 0.0
    self._extractor: Optional[Extractor] = None

  def __bool__(self) -> bool:
    return bool(self.tasks)

  @staticmethod
  def describe(metrics: dict[str, float]) -> str:
    return describe(metrics)

  def run(self, params: Any, config: Optional[ModelConfig] = None) -> dict[str, float]:
    """{"<task>/<metric>": value, "<task>/num_eval": n, ...} of `params` (a pre-training tree).
    `config`: the model as the current phase trains it (its RoPE base), if not the run's."""
    start = time.perf_counter()
    encoder = params["bert"] if "bert" in params else params
    if config is not None and config != self.config:  # a phase with another RoPE base
      self.config, self._extractor = config, None
    if self._extractor is None:
      dtype = "bfloat16" if self.config.dtype == "bfloat16" else "float32"
      self._extractor = Extractor(encoder, self.config, self.tokenizer, dtype=dtype,
                                  max_length=min(_MAX_LENGTH, self.config.max_position_embeddings),
                                  batch_size=64, mesh=_training_mesh(encoder))
    else:
      self._extractor.set_params(encoder)
    out = {}
    for task in self.tasks:
      result = probe.probe(self._extractor, task, self.s.layers, self.s.pooling,
                           self.s.max_examples or None, seed=self.seed)
      out.update({k: v for k, v in result.items() if k.startswith(task.name + "/")})
    self.seconds += time.perf_counter() - start
    return out


def _training_mesh(params: Any) -> Optional[Mesh]:
  """The mesh the parameters are sharded over in training (None: not a named sharding)."""
  shardings = {leaf.sharding for leaf in jax.tree.leaves(params)
               if isinstance(getattr(leaf, "sharding", None), NamedSharding)}
  meshes = {s.mesh for s in shardings}
  return meshes.pop() if len(meshes) == 1 else None


def describe(metrics: dict[str, float]) -> str:
  """One line: each task's metrics, an accuracy with its binomial standard error and the
  majority class."""
  return probe.describe(metrics)
