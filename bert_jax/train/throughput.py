"""Throughput accounting of a training run: model FLOPs, rates, MFU, the summary.

The loop hands over synchronised intervals (`Interval`): at each log point it
waits for the last step's metrics before reading the clock, so steps/s times
the steps of an interval is its wall time. Compiles, evaluations and probes
are left out of the intervals and reported apart.

Shape legend: B global batch.
"""

from __future__ import annotations

import collections
import time
from typing import Optional

from bert_jax.model import family, flops
from bert_jax.settings.model import ModelConfig
from bert_jax.settings import Phase, Settings


class Interval:
  """The steps being timed: start time, first step, seconds already counted, real tokens,
  sequences (global; a batch-size warm-up changes them per step).

  `pause`/`resume` leave an evaluation out; `close` returns the interval's
  (seconds, steps, real tokens, sequences) and starts the next one.
  """

  def __init__(self, step: int):
    self.restart(step)

  def restart(self, step: int, now: Optional[float] = None) -> None:
    self.start = time.perf_counter() if now is None else now
    self.first_step, self.elapsed, self.real_tokens, self.sequences = step, 0.0, 0.0, 0

  def pause(self) -> None:
    self.elapsed += time.perf_counter() - self.start

  def resume(self) -> None:
    self.start = time.perf_counter()

  def close(self, step: int) -> tuple[float, int, float, int]:
    now = time.perf_counter()
    out = (self.elapsed + now - self.start, step - self.first_step, self.real_tokens,
           self.sequences)
    self.restart(step, now)
    return out


class Throughput:
  """Rates of the timed steps of one session, against the devices' peak where known."""

  def __init__(self, s: Settings, config: ModelConfig, device_kind: str, device_count: int):
    self.s, self.config = s, config
    self.device_kind, self.device_count = device_kind, device_count
    self.peak = flops.peak_flops(device_kind)  # per device; None: unknown (CPU)
    self.totals = collections.Counter()  # timed steps, seconds, sequences, tokens, FLOPs

  def flops_per_step(self, phase: Phase) -> float:
    c = self.config
    return family.of(c).flops(c, "train", self.s.train.batch_of(phase), phase.seq_len,
                              phase.max_predictions)

  def rates(self, seconds: float, n_steps: int, real_tokens: float, sequences: int,
            phase: Phase) -> dict:
    """Throughput of `n_steps` steps of `phase` (`sequences` in all) that took `seconds`
    (synchronised)."""
    if n_steps <= 0 or seconds <= 0:
      return {}
    # FLOPs scale with the sequences: a batch-size warm-up's steps are smaller.
    flops_ = self.flops_per_step(phase) / self.s.train.batch_of(phase) * sequences
    t = self.totals
    t["steps"] += n_steps
    t["seconds"] += seconds
    t["sequences"] += sequences
    t["tokens"] += sequences * phase.seq_len
    t["real_tokens"] += real_tokens
    t["flops"] += flops_
    out = {"steps_per_sec": n_steps / seconds, "sequences_per_sec": sequences / seconds,
           "tokens_per_sec": sequences * phase.seq_len / seconds,
           "real_tokens_per_sec": real_tokens / seconds,
           "model_flops_per_sec": flops_ / seconds}
    if self.peak:
      out["mfu"] = out["model_flops_per_sec"] / (self.peak * self.device_count)
    return out | device_memory()

  def note(self) -> str:
    """The start-up line: FLOPs per sequence, and the peak MFU is measured against."""
    per_seq = ", ".join(f"{self.flops_per_step(ph) / self.s.train.batch_of(ph) / 1e9:.3g} "
                        f"GFLOP per sequence at length {ph.seq_len}"
                        for ph in self.s.train.phases)
    memory = ("; device memory in use and peak per train row" if device_memory() else
              "; device memory: this platform reports none (CPUs do not)")
    if self.peak:
      return (f"throughput: {per_seq} (model FLOPs, 3x forward); MFU against the dense bfloat16 "
              f"peak of {self.device_count} x {self.device_kind} "
              f"({self.peak / 1e12:.0f} TFLOP/s each){memory}")
    return (f"throughput: {per_seq} (model FLOPs, 3x forward); MFU left out: no known peak "
            f"FLOP/s for device kind {self.device_kind!r}{memory}")

  def summary(self) -> Optional[str]:
    """Average rates of this session's timed steps; None before any was timed."""
    t = self.totals
    if not t["steps"]:
      return None
    sec = t["seconds"]
    return (f"{int(t['steps'])} steps in {sec:.1f} s: {t['steps'] / sec:.2f} steps/s, "
            f"{t['sequences'] / sec:.1f} sequences/s, {t['tokens'] / sec:.0f} tokens/s "
            f"({t['real_tokens'] / sec:.0f} real), {t['flops'] / sec / 1e12:.3g} model TFLOP/s"
            + (f", MFU {t['flops'] / sec / (self.peak * self.device_count):.1%}"
               if self.peak else ""))


def device_memory() -> dict:
  """This process's devices' memory, the largest over them, in GiB: in use now and the
  peak since start (`device.memory_stats()`: TPU and GPU report it, CPU does not: {})."""
  import jax  # pylint: disable=import-outside-toplevel  (the rest of this module needs none)
  stats = [d.memory_stats() for d in jax.local_devices()]
  stats = [s for s in stats if s and "bytes_in_use" in s]
  if not stats:
    return {}
  gib = 1024**3
  out = {"memory_in_use_gib": max(s["bytes_in_use"] for s in stats) / gib}
  peaks = [s["peak_bytes_in_use"] for s in stats if "peak_bytes_in_use" in s]
  if peaks:
    out["memory_peak_gib"] = max(peaks) / gib
  limits = [s["bytes_limit"] for s in stats if "bytes_limit" in s]
  if limits:
    out["memory_limit_gib"] = min(limits) / gib
  return out
