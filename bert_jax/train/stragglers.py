"""A slow host on a pod (`config.straggler_factor`): every log point, each process's
step time and input wait, gathered on all; process 0 names the slowest.

Steps are synchronous: the gradient all-reduce makes every process wait for the
slowest, so every process measures the same time per step. What tells the slow one
apart is the time it spends on its own before the collective: its input pipeline
(the batch not ready: a slow disk, a slow bucket, a busy CPU) and its host work. So
each process reports its data wait per step beside its step time, and process 0 names
the process whose wait is more than `factor` times the other processes' median wait
and at least 10% of a step. A host whose accelerator alone is slow shows in everyone's step time equally,
and is not named here (a profile of that host shows it).
"""

from __future__ import annotations

import numpy as np

# A wait under this share of a step is noise, however many times the median it is.
_FLOOR = 0.1


def gather(step_s: float, wait_s: float) -> np.ndarray:
  """[processes, 2]: every process's (step time, data wait) per step; a collective."""
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  return np.asarray(multihost_utils.process_allgather(np.array([step_s, wait_s], np.float64)))


def slowest(times_Px2: np.ndarray, factor: float) -> tuple[int, str] | None:
  """(process, one line) when a process's input wait marks it as the straggler."""
  step_P, wait_P = times_Px2[:, 0], times_Px2[:, 1]
  p = int(np.argmax(wait_P))
  median = float(np.median(np.delete(wait_P, p)))  # of the others: with 2, the other one
  step = float(np.median(step_P))
  if wait_P[p] < _FLOOR * step or wait_P[p] <= factor * median:
    return None
  return p, (f"warning: straggler: process {p} waited {wait_P[p] * 1e3:.1f} ms a step for "
             f"its input, {wait_P[p] / max(median, 1e-9):.0f}x the other processes' median "
             f"({median * 1e3:.1f} ms), at {step * 1e3:.1f} ms a step; the others wait for "
             f"it in every collective (config.straggler_factor={factor:g})")


def row(times_Px2: np.ndarray) -> dict:
  """What the train row records of every process's times."""
  wait_P = times_Px2[:, 1]
  return {"data_wait_max_s": float(wait_P.max()), "data_wait_median_s": float(np.median(wait_P)),
          "slowest_process": int(np.argmax(wait_P))}
