"""A/B timing of our step under config variants, each in a fresh process, interleaved.

  python tools/ab_step.py --case train_small_128 model.dropout_rng=threefry model.dropout_rng=hash
  python tools/ab_step.py --case train_base_128 --rounds 3 "" model.gelu_approximate=True
  python tools/ab_step.py "" xla_cpu_scheduler_type=CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED
  python tools/ab_step.py BERT_JAX_MALLOC=system ""

Each positional argument is one variant: comma-separated `dotted.name=value`
config overrides ("" = the default config); an item named `xla_...` is an XLA
flag, added as `--xla_...` to that variant's `XLA_FLAGS`, and an UPPER_CASE item
an environment variable of that variant's process. Every process runs with the
host allocator bert-jax's commands use (`bert_jax.parallel.host_malloc`) unless its
variant sets BERT_JAX_MALLOC=system. Every round runs every variant once,
in order, each in its own process (`tools.step_builder`: compile, 1 untimed
step, `--steps` timed steps), so slow drifts of the machine hit all variants alike. Prints the compile
time, the median and min step time, and the minor page faults and kernel time per
step of each variant in each round. This is
how the lever A/B numbers in docs/performance.md were taken; code (not config) variants
were measured the same way on a patched tree.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run as `python tools/ab_step.py`: bert_jax, configs, tools
  sys.path.insert(0, ROOT)

from bert_jax.parallel import host_malloc  # noqa: E402
from tools import step_builder  # noqa: E402

_TAG = "AB_RESULT "


def xla_flags(text: str) -> list[str]:
  """The variant's XLA flags: its `xla_...=value` items, as `--xla_...=value`."""
  return ["--" + item.strip() for item in text.split(",") if item.strip().startswith("xla_")]


def env_items(text: str) -> dict[str, str]:
  """The variant's environment variables: its `UPPER_CASE=value` items."""
  out = {}
  for item in filter(None, (i.strip() for i in text.split(","))):
    name, _, value = item.partition("=")
    if _is_env_name(name):
      out[name] = value
  return out


def _is_env_name(name: str) -> bool:
  return bool(re.fullmatch(r"[A-Z_][A-Z0-9_]*", name.strip()))


def parse_variant(text: str) -> dict:
  """The variant's config overrides: its `dotted.name=value` items."""
  out = {}
  for item in filter(None, text.split(",")):
    if item.strip().startswith("xla_") or _is_env_name(item.partition("=")[0]):
      continue  # an XLA flag (xla_flags) or an environment variable (env_items)
    name, sep, value = item.partition("=")
    if not sep:
      raise SystemExit(f"error: variant item {item!r}: expected dotted.name=value")
    try:
      out[name.strip()] = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      out[name.strip()] = value  # a bare string such as threefry
  return out


def _one(args) -> int:
  built = step_builder.build_case(args.case, args.dtype, args.batch, parse_variant(args.one))
  step, compile_s = built.run, built.compile_s
  step(0)
  times = []
  before = resource.getrusage(resource.RUSAGE_SELF)
  for i in range(1, args.steps + 1):
    t = time.perf_counter()
    step(i)
    times.append(time.perf_counter() - t)
  after = resource.getrusage(resource.RUSAGE_SELF)
  print(_TAG + json.dumps({"compile_s": compile_s, "median_ms": 1e3 * statistics.median(times),
                           "min_ms": 1e3 * min(times),
                           # minor page faults and kernel time: what the host allocator costs
                           "faults_per_step": (after.ru_minflt - before.ru_minflt) / args.steps,
                           "sys_s_per_step": (after.ru_stime - before.ru_stime) / args.steps}),
        flush=True)
  return 0


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("variants", nargs="+", help='config overrides per variant, e.g. "model.remat=True"')
  p.add_argument("--case", default="train_small_128", help="a tools.bench train/features case")
  p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  p.add_argument("--batch", type=int, default=0, help="batch size (default: the case's)")
  p.add_argument("--steps", type=int, default=8, help="timed steps per process")
  p.add_argument("--rounds", type=int, default=2)
  p.add_argument("--one", help=argparse.SUPPRESS)
  return p.parse_args(argv)


def main(argv=None) -> int:
  args = parse_args(argv)
  if args.one is not None:
    return _one(args)
  for v in args.variants:
    parse_variant(v)  # fail before any run
  base_flags = os.environ.get("XLA_FLAGS", "").replace(
      "--xla_force_host_platform_device_count=8", "").strip()
  print(f"{args.case} ({args.dtype}), {args.steps} timed steps per run, {args.rounds} rounds")
  results = {v: [] for v in args.variants}
  for r in range(args.rounds):
    for v in args.variants:
      cmd = [sys.executable, os.path.abspath(__file__), "--one", v, "--case", args.case,
             "--dtype", args.dtype, "--batch", str(args.batch), "--steps", str(args.steps), v]
      env = {**os.environ, **env_items(v),
             "XLA_FLAGS": " ".join([base_flags, *xla_flags(v)]).strip()}
      env = host_malloc.tuned_here(env) or env
      proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
      line = [l for l in proc.stdout.splitlines() if l.startswith(_TAG)]
      if proc.returncode or not line:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"error: variant {v!r} failed: {tail}", file=sys.stderr)
        return 1
      res = json.loads(line[0][len(_TAG):])
      results[v].append(res)
      print(f"  round {r + 1}  {v or '(default)':40s} compile {res['compile_s']:5.1f} s  "
            f"median {res['median_ms']:8.1f} ms  min {res['min_ms']:8.1f} ms  "
            f"page faults/step {res['faults_per_step']:7.0f}  kernel {res['sys_s_per_step']:.2f} s",
            flush=True)
  print("summary (median of the round medians):")
  for v, rs in results.items():
    print(f"  {v or '(default)':40s} {statistics.median(r['median_ms'] for r in rs):8.1f} ms")
  return 0


if __name__ == "__main__":
  sys.exit(main())
