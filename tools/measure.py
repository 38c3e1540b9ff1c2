"""Timing and memory inside one benchmark worker: steps, peak memory, a matmul peak.

PyTorch is imported where a measurement needs it: it is an optional peer.
"""

from __future__ import annotations

import os
import resource
import statistics
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import psutil


def _rss_bytes() -> int:
  return psutil.Process().memory_info().rss


def _peak_rss_bytes() -> int:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


class Memory:
  """Peak memory during a measurement: XLA/CUDA allocator stats on GPU, else RSS."""

  def __init__(self, framework: str):
    self.framework = framework
    self.kind = "cpu_peak_rss_delta"
    if framework == "jax":
      stats = jax.devices()[0].memory_stats() if jax.devices()[0].platform == "gpu" else None
      if stats and "peak_bytes_in_use" in stats:
        self.kind = "xla_peak_bytes_in_use"
    elif framework == "torch":
      import torch
      if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
        self.kind = "torch_cuda_max_memory_allocated"
    self.base = _rss_bytes()

  def peak(self) -> int:
    if self.kind == "xla_peak_bytes_in_use":
      return int(jax.devices()[0].memory_stats()["peak_bytes_in_use"])
    if self.kind == "torch_cuda_max_memory_allocated":
      import torch
      return int(torch.cuda.max_memory_allocated())
    # The worker's high-water mark minus its RSS after imports, before the
    # model existed: parameters, optimizer state, activations and compiler.
    return max(0, _peak_rss_bytes() - self.base)


def time_steps(step: Callable[[int], Any], warmup: int, steps: int) -> dict:
  """Runs `step(i)` warmup + steps times; median, min and max of the timed ones."""
  for i in range(warmup):
    step(i)
  wall, cpu = [], []
  for i in range(warmup, warmup + steps):
    t, c = time.perf_counter(), time.process_time()
    step(i)
    wall.append(time.perf_counter() - t)
    cpu.append(time.process_time() - c)
  # Process CPU seconds too: on a shared machine they move less than wall time.
  return {"median_s": statistics.median(wall), "min_s": min(wall), "max_s": max(wall),
          "timed_steps": len(wall), "median_cpu_s": statistics.median(cpu)}


def jax_peak_dot(a: jax.Array, b: jax.Array) -> jax.Array:
  """The dot the JAX matmul peak times: float32 accumulation and output for every dtype.

  For bf16 operands that is the bf16 x bf16 -> f32 dot mixed precision runs
  (`bert_jax.model.precision`), the fastest bf16 dot XLA:CPU has (AVX-512 BF16: 306
  against 153 GFLOP/s for bf16 output at 2048², tools/bench_matmul.py), so MFU is
  measured against the dot the model uses, not a slower one. torch.mm, the PyTorch
  rows' peak, accumulates bf16 in float32 too.
  """
  return jax.lax.dot(a, b, preferred_element_type=jnp.float32)


def matmul_peak(framework: str, dtype: str, n: int = 0, repeats: int = 10) -> dict:
  """FLOP/s of one large square matmul in `dtype`, median of `repeats`."""
  if framework == "jax":
    n = n or (8192 if jax.devices()[0].platform != "cpu" else 2048)
    jd = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[dtype]
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(jd)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32).astype(jd)
    f = jax.jit(jax_peak_dot).lower(a, b).compile()
    run = lambda _: f(a, b).block_until_ready()
  else:
    import torch
    torch.set_num_threads(os.cpu_count() or 1)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    n = n or (8192 if device == "cuda" else 2048)
    td = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    a, b = (torch.randn(n, n, device=device).to(td) for _ in range(2))

    def run(_):
      torch.mm(a, b)
      if device == "cuda":
        torch.cuda.synchronize()
  timing = time_steps(run, 2, repeats)
  return {"framework": framework, "dtype": dtype, "n": n,
          "flops_per_s": 2.0 * n ** 3 / timing["median_s"], **timing}
