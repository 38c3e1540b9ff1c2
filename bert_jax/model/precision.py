"""Mixed-precision matmuls: low-precision operands, float32 accumulation.

Every matmul of the model in mixed mode (ModelConfig.dtype 'bfloat16' or
'float16') goes through `dot_general` / `einsum` here. Each is a
`jax.custom_vjp` whose forward dot AND both gradient dots take operands in the
compute dtype (bfloat16) and accumulate and return float32
(`preferred_element_type=float32`): the form TPUs, GPUs and CPUs with AMX or
AVX-512 BF16 run natively. Without the custom VJP, JAX differentiates a
bf16 x bf16 -> f32 dot into f32 x bf16 dots (a float32 cotangent against a
bfloat16 operand), which XLA CPU runs on its slow paths.

Gradients are returned in the dtype of each primal operand, so a float32
parameter fed directly into the dot receives a float32 gradient, never one
rounded to bfloat16.

How the dot is laid out depends on the platform it is compiled for: XLA CPU
gets its operands transposed to a canonical layout behind optimization
barriers (see `_plain`); TPUs and GPUs get the plain dot. The platform is the
one of `target_platform(...)` around the model's trace (the mesh's devices:
a TPU program compiled on a CPU host is a TPU program), else JAX's default
backend.

`resolve_dtype('auto', platform)` picks the compute dtype for a machine.
"""

import contextlib
import contextvars
import functools
import string
from collections.abc import Sequence
from typing import Optional

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np

from bert_jax.settings import model as config
from bert_jax.storage import fs

_ACCUM = jnp.float32
_NATIVE_BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")


# ----------------------------------------------------------------------------
# dtype resolution


def _cpuinfo_field(name: str, cpuinfo_path: str) -> str:
  """The first processor's `name` field of /proc/cpuinfo ('' if absent or unreadable).

  The one reader of /proc/cpuinfo: the flags choose the dtype, the model name goes
  into the measured blocks of the docs (tools/).
  """
  try:
    with fs.open(cpuinfo_path) as f:
      for line in f:
        if line.startswith(name) and ":" in line:
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return ""


def cpu_flags(cpuinfo_path: str = "/proc/cpuinfo") -> set:
  """The CPU feature flags of the first processor in /proc/cpuinfo (empty set if unreadable)."""
  return set(_cpuinfo_field("flags", cpuinfo_path).split())


def cpu_model(cpuinfo_path: str = "/proc/cpuinfo") -> str:
  """The CPU's model name, e.g. 'AMD EPYC 9B14' ('' if unreadable)."""
  return _cpuinfo_field("model name", cpuinfo_path)


def cpu_has_native_bf16(cpuinfo_path: str = "/proc/cpuinfo") -> bool:
  """True if the CPU has bf16 dot instructions (AMX-BF16 or AVX-512 BF16)."""
  return bool(cpu_flags(cpuinfo_path) & set(_NATIVE_BF16_CPU_FLAGS))


def resolve_dtype(dtype: str, platform: Optional[str] = None,
                  cpuinfo_path: str = "/proc/cpuinfo") -> str:
  """Resolves config.model.dtype: 'auto' -> 'bfloat16' | 'float32'; others unchanged.

  'auto' means bfloat16 (mixed mode: bf16 operands, f32 accumulation) on TPU
  and GPU, and on CPUs with native bf16 dots (Linux flags amx_bf16 or
  avx512_bf16); float32 elsewhere, where bf16 dots are emulated and slower.
  `platform` is a JAX backend name ('cpu', 'gpu', 'cuda', 'rocm', 'tpu');
  None means jax.default_backend().
  """
  if dtype != "auto":
    return dtype
  platform = (platform or jax.default_backend()).lower()
  if platform in ("tpu", "gpu", "cuda", "rocm"):
    return "bfloat16"
  if platform == "cpu" and cpu_has_native_bf16(cpuinfo_path):
    return "bfloat16"
  return "float32"


# The shortest longest-phase at which 'auto' picks splash: BERT-Base's step compiled for
# v5e-8 at 131,072 tokens needs 35% less memory with splash at 512 tokens (and fits at
# 2048 and 8192, where einsum does not), but 1.5% more at 128 (plan_kernels.md).
SPLASH_MIN_LEN = 512


def resolve_attention_kernel(kernel: str, attention_dropout_rate: float,
                             seq_lens: Sequence[int], platform: Optional[str] = None) -> str:
  """Resolves config.model.attention_kernel: 'auto' -> 'splash' on TPU where it applies
  and pays, else 'einsum'; any other value unchanged.

  It applies with no attention dropout (splash has none, so the reference BERT's 0.1
  keeps 'einsum', bit for bit) and every phase's length a multiple of config.SPLASH_TILE.
  It pays in memory from SPLASH_MIN_LEN tokens: it keeps no [B, H, L, L] scores. A run
  must fit in its longest phase, so that phase decides. The compiled memory and FLOPs of
  both kernels are in tools/results/plan_kernels.md (the kernel: model/splash.py).
  `platform` is a JAX backend name; None means jax.default_backend().
  """
  if kernel != "auto":
    return kernel
  platform = (platform or jax.default_backend()).lower()
  pays = config.splash_tiles_fit(seq_lens) and max(seq_lens) >= SPLASH_MIN_LEN
  return "splash" if platform == "tpu" and not attention_dropout_rate and pays else "einsum"


def auto_reason(platform: Optional[str] = None, cpuinfo_path: str = "/proc/cpuinfo") -> str:
  """Why 'auto' resolved as it did, in a few words (printed at start-up)."""
  platform = (platform or jax.default_backend()).lower()
  if platform != "cpu":
    return "accelerators compute bfloat16 natively"
  if cpu_has_native_bf16(cpuinfo_path):
    return "this CPU has native bf16 dots (amx_bf16 or avx512_bf16)"
  return "this CPU has no native bf16 dots (no amx_bf16 / avx512_bf16), so float32 is faster"


# ----------------------------------------------------------------------------
# dot_general <-> einsum letters


def _dims_to_letters(lhs_ndim: int, rhs_ndim: int, dims) -> tuple[str, str, str]:
  """Einsum letters (lhs, rhs, out) equal to lax.dot_general(lhs, rhs, dims)."""
  (lc, rc), (lb, rb) = dims
  lc, rc, lb, rb = (tuple(int(i) for i in d) for d in (lc, rc, lb, rb))
  pool = iter(string.ascii_letters)
  lhs, rhs = [None] * lhs_ndim, [None] * rhs_ndim
  for i, j in zip(lb, rb):
    lhs[i] = rhs[j] = next(pool)
  for i, j in zip(lc, rc):
    lhs[i] = rhs[j] = next(pool)
  lhs = [x or next(pool) for x in lhs]
  rhs = [x or next(pool) for x in rhs]
  out = ([lhs[i] for i in lb] + [x for i, x in enumerate(lhs) if i not in lb + lc]
         + [x for j, x in enumerate(rhs) if j not in rb + rc])
  return "".join(lhs), "".join(rhs), "".join(out)


@functools.lru_cache(maxsize=None)
def _letters_to_dims(lhs: str, rhs: str, out: str):
  """dot_general dimension numbers and output permutation for 'lhs,rhs->out'."""
  for s in (lhs, rhs, out):
    if len(set(s)) != len(s):
      raise ValueError(f"einsum {lhs},{rhs}->{out}: repeated index in one operand")
  for x in lhs + rhs:
    if x not in out and not (x in lhs and x in rhs):
      raise ValueError(f"einsum {lhs},{rhs}->{out}: index {x!r} summed in one operand only")
  if set(out) - set(lhs) - set(rhs):
    raise ValueError(f"einsum {lhs},{rhs}->{out}: output index not in any operand")
  batch = [x for x in lhs if x in rhs and x in out]
  contract = [x for x in lhs if x in rhs and x not in out]
  lhs_free = [x for x in lhs if x not in rhs]
  rhs_free = [x for x in rhs if x not in lhs]
  dims = ((tuple(lhs.index(x) for x in contract), tuple(rhs.index(x) for x in contract)),
          (tuple(lhs.index(x) for x in batch), tuple(rhs.index(x) for x in batch)))
  result = batch + lhs_free + rhs_free
  perm = tuple(result.index(x) for x in out)
  return dims, (None if perm == tuple(range(len(perm))) else perm)


def _parse(spec: str) -> tuple[str, str, str]:
  spec = spec.replace(" ", "")
  if "->" not in spec or "." in spec:
    raise ValueError(f"einsum {spec!r}: expected an explicit 'ab,bc->ac' spec without '...'")
  ins, out = spec.split("->")
  parts = ins.split(",")
  if len(parts) != 2:
    raise ValueError(f"einsum {spec!r}: expected exactly two operands")
  return parts[0], parts[1], out


_TARGET = contextvars.ContextVar("bert_jax_precision_target", default=None)


@contextlib.contextmanager
def target_platform(platform: Optional[str]):
  """Mixed dots traced inside are laid out for `platform` ('cpu', 'tpu', 'gpu'; None: default)."""
  token = _TARGET.set(platform)
  try:
    yield
  finally:
    _TARGET.reset(token)


def target_backend() -> str:
  """'cpu', 'gpu' or 'tpu': the platform the program traced now is compiled for."""
  return (_TARGET.get() or jax.default_backend()).lower()


def cpu_layout() -> bool:
  """True when the dots traced now are for XLA CPU (canonical layout and barriers)."""
  return target_backend() == "cpu"


def forward_compiler_options(cpu_forward_dots: str, dtype: str) -> dict:
  """XLA compiler options for a forward-only program (features, probes) traced now.

  On XLA:CPU, 'eigen' (and 'auto' in float32) turns YNNPACK library fusions off,
  so the dots run as XLA's own: BERT-Base float32 features ran 7-9% faster so on an
  AMD EPYC (AVX2), mostly from fewer page faults, while float32 training steps ran
  4-11% slower, so training never takes this (docs/performance.md, levers). Empty
  elsewhere.
  """
  if target_backend() != "cpu":
    return {}
  if cpu_forward_dots == "auto":
    cpu_forward_dots = "eigen" if dtype == "float32" else "ynnpack"
  return {"xla_cpu_experimental_ynn_fusion_type": ""} if cpu_forward_dots == "eigen" else {}


def _plain(lhs: str, rhs: str, out: str, a, b, op_dtype, for_cpu: bool = True):
  """op_dtype x op_dtype -> float32 dot in einsum form (not differentiated).

  Not `for_cpu` (TPU, GPU): the plain dot_general with float32 accumulation,
  laid out as the compiler likes it. `for_cpu`:

  The operands are first put in the canonical layout [batch, free, contract]
  x [batch, contract, free]: with the contraction on the lhs's last axis XLA
  CPU keeps the dot in its bf16 x bf16 -> f32 (YNNPACK) kernels; a leading
  contraction axis (the weight gradient X^T G) otherwise reached a runtime
  DotThunk that has no bf16 x bf16 -> f32 path ("Unsupported element type
  for DotThunk::Execute", jaxlib 0.10.2).
  """
  batch = [x for x in lhs if x in rhs and x in out]
  contract = [x for x in lhs if x in rhs and x not in out]
  free = lambda u, v: [x for x in u if x not in v]
  if not for_cpu:
    dims, perm = _letters_to_dims(lhs, rhs, out)
    y = jax.lax.dot_general(a.astype(op_dtype), b.astype(op_dtype), dims,
                            preferred_element_type=_ACCUM)
    return y if perm is None else jnp.transpose(y, perm)
  if (batch + free(lhs, rhs) + free(rhs, lhs) != list(out)
      and batch + free(rhs, lhs) + free(lhs, rhs) == list(out)):
    # Swapped operands give the output order directly: no output transpose,
    # which XLA would fold into the dot as a leading-axis contraction.
    lhs, rhs, a, b = rhs, lhs, b, a
  lhs_c = "".join(batch + [x for x in lhs if x not in rhs] + contract)
  rhs_c = "".join(batch + contract + [x for x in rhs if x not in lhs])
  a = a.astype(op_dtype)
  b = b.astype(op_dtype)
  # optimization_barrier keeps XLA from folding the transposes back into the dot.
  if lhs_c != lhs:
    a = jax.lax.optimization_barrier(jnp.transpose(a, [lhs.index(x) for x in lhs_c]))
  if rhs_c != rhs:
    b = jax.lax.optimization_barrier(jnp.transpose(b, [rhs.index(x) for x in rhs_c]))
  dims, perm = _letters_to_dims(lhs_c, rhs_c, out)
  y = jax.lax.dot_general(a, b, dims, preferred_element_type=_ACCUM)
  return y if perm is None else jnp.transpose(y, perm)


# ----------------------------------------------------------------------------
# The custom-VJP dot


# for_cpu is fixed when the forward is traced (the backward may be traced later,
# outside target_platform), so it travels as a non-differentiable argument.
@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3, 4, 5))
def _mixed(lhs, rhs, out, op_dtype, in_dtypes, for_cpu, a, b):
  return _plain(lhs, rhs, out, a, b, op_dtype, for_cpu)


def _mixed_fwd(lhs, rhs, out, op_dtype, in_dtypes, for_cpu, a, b):
  a, b = a.astype(op_dtype), b.astype(op_dtype)  # residuals kept in the compute dtype
  return _plain(lhs, rhs, out, a, b, op_dtype, for_cpu), (a, b)


def _mixed_bwd(lhs, rhs, out, op_dtype, in_dtypes, for_cpu, res, g):
  a, b = res
  g = g.astype(op_dtype)  # the gradient dots are op_dtype x op_dtype -> f32 too
  da = _plain(out, rhs, lhs, g, b, op_dtype, for_cpu).astype(in_dtypes[0])
  db = _plain(lhs, out, rhs, a, g, op_dtype, for_cpu).astype(in_dtypes[1])
  return da, db


_mixed.defvjp(_mixed_fwd, _mixed_bwd)


def einsum(spec: str, a, b, op_dtype=jnp.bfloat16, out_dtype=None):
  """Two-operand einsum with op_dtype operands and float32 accumulation, forward and backward.

  The result is float32 (the accumulator) unless `out_dtype` is given; the
  gradients have the dtypes of `a` and `b`.
  """
  lhs, rhs, out = _parse(spec)
  y = _mixed(lhs, rhs, out, jnp.dtype(op_dtype), (jnp.dtype(a.dtype), jnp.dtype(b.dtype)),
             cpu_layout(), a, b)
  return y if out_dtype is None else y.astype(out_dtype)


def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None,
                op_dtype=jnp.bfloat16, out_dtype=None, **unused):
  """lax.dot_general-compatible mixed dot (result float32 unless out_dtype).

  `precision` and `preferred_element_type` are accepted for signature
  compatibility (flax's Dense passes them) and ignored: accumulation is float32.
  """
  del precision, preferred_element_type, unused
  lt, rt, ot = _dims_to_letters(lhs.ndim, rhs.ndim, dimension_numbers)
  y = _mixed(lt, rt, ot, jnp.dtype(op_dtype), (jnp.dtype(lhs.dtype), jnp.dtype(rhs.dtype)),
             cpu_layout(), lhs, rhs)
  return y if out_dtype is None else y.astype(out_dtype)


def dot_general_fn(op_dtype):
  """A flax `dot_general=` argument: op_dtype operands, float32 result."""
  return functools.partial(dot_general, op_dtype=jnp.dtype(op_dtype))


def is_mixed(compute_dtype) -> bool:
  """True when matmuls run in mixed mode (any compute dtype other than float32)."""
  return jnp.dtype(compute_dtype) != jnp.dtype(jnp.float32)


# ----------------------------------------------------------------------------
# Inspection (tests, tools)


def iter_eqns(jaxpr):
  """Every equation of a (closed) jaxpr and of all sub-jaxprs (pjit, remat, scan, custom_vjp...)."""
  jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
  for eqn in jaxpr.eqns:
    yield eqn
    for value in eqn.params.values():
      for sub in (value if isinstance(value, (tuple, list)) else (value,)):
        if isinstance(sub, (jax.extend.core.Jaxpr, jax.extend.core.ClosedJaxpr)):
          yield from iter_eqns(sub)


def dot_dtypes(jaxpr) -> list[tuple[str, str, Optional[str]]]:
  """(lhs dtype, rhs dtype, preferred_element_type) for every dot_general in jaxpr."""
  out = []
  for eqn in iter_eqns(jaxpr):
    if eqn.primitive.name == "dot_general":
      pref = eqn.params.get("preferred_element_type")
      out.append((str(eqn.invars[0].aval.dtype), str(eqn.invars[1].aval.dtype),
                  None if pref is None else str(np.dtype(pref))))
  return out
