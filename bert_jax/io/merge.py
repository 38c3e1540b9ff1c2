"""Checkpoint merging: the weighted mean of several checkpoints' parameters, written as a
checkpoint that features, probes, fine-tuning and `convert to-hf` read.

The sources must be one model: the same family and shapes (model_config, RoPE bases
aside, which the newest source's meta gives) and the same vocabulary. Means are taken
in float64 and stored in each parameter's own dtype. The merged checkpoint has no
optimizer state (as an import): it is read, not resumed. Its meta is the newest
source's, with `merged_from` listing every source, its step and its weight.

mmBERT merges the ends of several decay runs from one parent; the last checkpoints of
one decay (`last`) is the other common use (model soups, checkpoint averaging). With
`ema`, each source gives the moving average of its parameters that its run kept
(`config.train.phase_ema`) instead of its parameters, and one source is enough.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Optional

import jax
import numpy as np

from bert_jax.errors import CheckpointError
from bert_jax.io import checkpointing
from bert_jax.settings.model import RUNTIME_FIELDS
from bert_jax.storage import fs
from bert_jax.storage.outputs import atomic_output_dir, check_apart

# Model fields that may differ between merged checkpoints: they change no parameter (the
# RoPE bases of an extension stage included; the newest source's are kept).
_FREE = RUNTIME_FIELDS + ("global_rope_theta", "local_rope_theta")


@dataclasses.dataclass(frozen=True)
class Source:
  """One checkpoint to merge: a workdir, its checkpoints/ or a step folder, and a step."""
  path: str
  step: Optional[int] = None
  weight: float = 1.0

  def describe(self) -> str:
    return f"{self.path}" + (f" step {self.step}" if self.step is not None else "")


def parse(spec: str, weight: float = 1.0) -> Source:
  """'PATH' or 'PATH@STEP' -> Source."""
  path, at, step = spec.rpartition("@")
  if at and step.isdigit():
    return Source(path, int(step), weight)
  return Source(spec, None, weight)


def last_steps(path: str, k: int) -> list[Source]:
  """The newest `k` complete checkpoints of a workdir (or its checkpoints/ folder)."""
  root, steps = checkpointing.complete_steps(path)
  if len(steps) < k:
    raise CheckpointError(f"checkpoint {root}: {len(steps)} step(s) {steps}; expected at "
                          f"least --last {k}")
  return [Source(path, s) for s in steps[-k:]]


def merge(sources: Sequence[Source], out_dir: str, overwrite: bool = False,
          ema: bool = False) -> dict:
  """Writes the weighted mean of `sources`' parameters (or, with `ema`, of their moving
  averages) to `out_dir`; returns its meta."""
  if len(sources) < (1 if ema else 2):
    raise CheckpointError(f"merge: {len(sources)} checkpoint(s); expected "
                          + ("1 or more with --ema" if ema else "2 or more"))
  restore = checkpointing.restore_ema if ema else checkpointing.restore_params
  weights = np.asarray([s.weight for s in sources], np.float64)
  if not np.all(np.isfinite(weights)) or np.any(weights <= 0):
    raise CheckpointError(f"merge: weights {weights.tolist()}; expected positive numbers")
  reads = tuple((f"checkpoint {i + 1}", s.path) for i, s in enumerate(sources))
  check_apart("OUT_DIR", out_dir, reads)  # before anything is read
  total, first_meta, metas = None, None, []
  for source, w in zip(sources, weights):
    params, meta = restore(source.path, step=source.step)
    _check_same(first_meta, meta, source, sources[0])
    first_meta = first_meta or meta
    host = jax.tree.map(lambda x: np.asarray(jax.device_get(x)), params)
    if total is not None and jax.tree.structure(total) != jax.tree.structure(host):
      raise CheckpointError(f"checkpoint {source.describe()}: other parameters than "
                            f"{sources[0].describe()}'s; expected one model's checkpoints")
    total = (jax.tree.map(lambda x: x.astype(np.float64) * w, host) if total is None else
             jax.tree.map(lambda t, x: _add(t, x, w, source), total, host))
    metas.append((source, meta, float(w / weights.sum()), host))
  dtypes = jax.tree.map(lambda x: x.dtype, metas[0][3])
  # sum(w_i x_i) / sum(w_i), in float64: numpy's average, to the last bit in each dtype.
  merged = jax.tree.map(lambda t, d: (t / weights.sum()).astype(d), total, dtypes)
  newest = max(metas, key=lambda m: int(m[1].get(checkpointing.RESTORED_STEP,
                                                   m[1].get("step", 0)) or 0))
  meta = {k: v for k, v in newest[1].items() if k != checkpointing.RESTORED_STEP}
  step = int(newest[1].get(checkpointing.RESTORED_STEP, meta.get("step", 0)) or 0)
  meta.update(step=step, merged_from=[
      {"checkpoint": fs.abspath(s.path),
       "step": int(m.get(checkpointing.RESTORED_STEP, m.get("step", 0)) or 0), "weight": w,
       **({"ema": True} if ema else {})}
      for s, m, w, _ in metas])
  with atomic_output_dir(out_dir, overwrite, reads) as tmp:
    checkpointing.save_params(tmp, step, merged, meta)
  return meta


def _add(total: np.ndarray, x: np.ndarray, w: float, source: Source) -> np.ndarray:
  if total.shape != x.shape:
    raise CheckpointError(f"checkpoint {source.describe()}: a parameter of shape {x.shape} "
                          f"where the first has {total.shape}; expected one model's checkpoints")
  return total + x.astype(np.float64) * w


def _check_same(first: Optional[dict], meta: dict, source: Source, first_source: Source) -> None:
  """The same model (parameters) and vocabulary as the first source, else one line."""
  if first is None:
    return
  a, b = first.get("model_config", {}), meta.get("model_config", {})
  differ = sorted(k for k in set(a) | set(b) if k not in _FREE and a.get(k) != b.get(k))
  if differ:
    k = differ[0]
    raise CheckpointError(f"checkpoint {source.describe()} has model {k}={b.get(k)!r} but "
                          f"{first_source.describe()} has {a.get(k)!r}; expected checkpoints "
                          "of one model to merge")
  for key in ("vocab", "tokenizer_json"):
    if key in first or key in meta:
      if first.get(key) != meta.get(key):
        raise CheckpointError(f"checkpoint {source.describe()} has another vocabulary than "
                              f"{first_source.describe()}; expected checkpoints of one model")
