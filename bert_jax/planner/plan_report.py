"""The plan as the console shows it: memory per device against HBM, FLOPs, collectives.

(bert_jax.planner.plan compiles and measures; this module only formats.)
"""

from __future__ import annotations

from typing import Optional

from bert_jax.parallel import sharding
from bert_jax.planner.plan import GIB, Plan



def _gib(n: Optional[float]) -> str:
  return "-" if n is None else f"{n / GIB:.2f}"


def _flop(n: float) -> str:
  for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6)):
    if n >= scale:
      return f"{n / scale:.3g} {unit}FLOP"
  return f"{n:.3g} FLOP"


def _bytes(n: float) -> str:
  for unit, scale in (("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
    if n >= scale:
      return f"{n / scale:.3g} {unit}"
  return f"{int(n)} B"


def _seconds(t: float) -> str:
  return f"{t * 1e3:.3g} ms" if t >= 1e-3 else f"{t * 1e6:.3g} us"


def describe_collectives(collectives: list) -> str:
  if not collectives:
    return "none"
  return ", ".join(f"{c.kind} x{c.count} ({_bytes(c.bytes)})" for c in collectives)


def format_plan(plan: Plan) -> str:
  """The plan as the CLI prints it."""
  m = plan.model
  lines = [f"target: {plan.target}",
           f"model: {m['layers']} layers, hidden {m['hidden_size']}, vocab {m['vocab_size']} "
           f"(padded {m['padded_vocab_size']}) -> {m['params'] / 1e6:.1f}M params; "
           f"{m['dtype']}{' mixed' if m['dtype'] != 'float32' else ''}, remat "
           f"{m.get('remat_policy', 'full') if m['remat'] else 'off'}, "
           f"dropout {m['dropout_rng']}; batch "
           f"{m['batch_size']}, grad accum {m['grad_accum_steps']}; mesh {plan.mesh}, params "
           f"{m['param_sharding']}",
           "",
           f"per device (GiB)                  params  opt    batch  temp    total   "
           f"{plan.memory_label:<7} fits  headroom  compile"]
  for st in plan.steps:
    lines.append(
        f"{st.name + f' B={st.batch}':<33} {_gib(st.params_bytes):>6} {_gib(st.opt_state_bytes):>6} "
        f"{_gib(st.batch_bytes):>6} {(_gib(st.temp_bytes) if st.compiled else '?'):>6} "
        f"{(_gib(st.total_bytes) if st.total_bytes else '?'):>7} {_gib(st.memory_bytes):>7} "
        f"{'yes' if st.fits else 'NO':<5} {_gib(st.headroom_bytes) if st.total_bytes else '-':>8} "
        f"{st.compile_seconds:6.0f} s")
  lines.append("")
  for st in plan.steps:
    if not st.compiled:
      lines.append(f"{st.name}: not compiled: {st.error}")
      continue
    peak = (f"; at {plan.device_kind}'s peak {plan.peak_flops / 1e12:g} TFLOP/s >= "
            f"{_seconds(max(st.model_flops, st.xla_flops) / plan.peak_flops)}"
            if plan.peak_flops else "")
    lines.append(f"{st.name}: FLOPs per device-step: model {_flop(st.model_flops)}, XLA "
                 f"{_flop(st.xla_flops)}{peak}; collectives: "
                 f"{describe_collectives(st.collectives)}"
                 + (f"; HOST TRANSFERS: {', '.join(st.host_transfers)}" if st.host_transfers
                    else ""))
  lines.append("")
  if plan.fits and plan.memory_bytes:
    # Every phase (a staged recipe's stage) is planned; the tightest one decides the slice.
    tight = min(plan.steps, key=lambda st: st.headroom_bytes)
    lines.append(f"fits: every step fits {plan.memory_label}; the tightest is {tight.name} "
                 f"(B={tight.batch}), with {_gib(tight.headroom_bytes)} GiB to spare per device")
  elif plan.fits:
    lines.append("fits: every step compiles (no device memory limit known)")
  else:
    bad = [st.name for st in plan.steps if not st.fits]
    lines.append(f"does NOT fit: {', '.join(bad)}")
    if plan.max_per_device_batch is not None:
      data = plan.mesh.get(sharding.DATA, 1)
      best = plan.max_per_device_batch
      lines.append(("  largest per-device batch that fits: " if plan.max_batch_exact else
                    "  largest per-device batch seen to fit (the search ran out of compiles; "
                    "a larger one may fit): ")
                   + f"{best} (--config.train.batch_size={best * data})"
                   if best else "  not even a per-device batch of 1 fits")
    for f in plan.fixes:
      lines.append(f"  {f.field}: {'fits' if f.fits else 'does not fit'}"
                   + (f" ({_gib(f.total_bytes)} GiB per device)" if f.total_bytes else "")
                   + (f"; {f.note}" if f.note else ""))
  return "\n".join(lines)
