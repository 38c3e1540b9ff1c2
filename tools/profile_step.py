"""Where a train step's time goes: an XLA trace of our step, grouped by model part.

  python tools/profile_step.py                          # train_small_128, float32
  python tools/profile_step.py --case train_base_128 --top 40
  python tools/profile_step.py --case features_base_128 --dtype bfloat16
  python tools/profile_step.py --case features_base_128 --timeline layer_5

Builds the same step as `python -m tools.bench` (`tools.step_builder`: the real
`TrainSteps.train_step_fn`, or the encoder forward for `features_*`), traces a few
steps with `jax.profiler` and the XLA CPU per-op trace events, and prints:
the wall time per step, each op's time per step with its HLO shape and the JAX
source it came from, and totals per part of the model (MLM head, attention,
feed-forward, optimizer, ...) and per kind of op (matmul, copy/transpose,
elementwise). On 2 cores XLA runs independent ops side by side, so op times add
up to more than the wall time; compare shares, not sums with wall time.
`--timeline SCOPE` also lists one scope's ops (e.g. a layer) of the last traced
step in time order, with their threads: what runs side by side, and how long the
scope takes from its first op to its last.
A measuring tool for performance work: not part of CI.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run as `python tools/profile_step.py`: bert_jax, configs, tools
  sys.path.insert(0, ROOT)

import jax  # noqa: E402  (XLA_FLAGS is read when the backend starts, in main)

from bert_jax.parallel import host_malloc  # noqa: E402
from tools import ab_step, cases, step_builder  # noqa: E402

# Model part of an op, from the JAX source path XLA keeps in its metadata.
# First match wins; order matters (the MLM head's dense layer is not the FFN's).
PARTS = (
    ("optimizer", ("cond/", "clip", "adam", "/sqrt", "apply_updates")),
    # ".attend": the tied word embeddings' logits (the attention core is "._attend").
    ("MLM head + loss", (".attend", "mlm_", "log_softmax", "take_along_axis",
                         "/reduce_max", "argmax", "jvp()/")),
    ("dropout RNG + mask", ("Dropout", "threefry", "random_bits", "random_wrap")),
    ("masking", ("mask_tokens", "masking")),
    ("attention", ("attention",)),
    ("feed-forward", ("intermediate", "/output/", "erf")),
    ("LayerNorm", ("LayerNorm", "norm")),
    ("embeddings", ("embeddings",)),
    ("residuals, GELU grads (layers)", ("/layer_",)),
)


def _kind(name: str) -> str:
  if name.startswith(("ynn_fusion", "xnn_fusion", "onednn", "dot", "custom-call")):
    return "matmul (library or dot)"
  if "copy" in name or "transpose" in name:
    return "copy / transpose"
  if "scatter" in name or "gather" in name:
    return "scatter / gather"
  return "elementwise / reduce"


def _part(op_name: str) -> str:
  # Ops of the loss's backward, or at the top of the pre-training model
  # outside the encoder (the MLM bias), belong to the MLM head.
  if "transpose(jvp())" in op_name or (
      "BertForPreTraining" in op_name and "/bert/" not in op_name and "nsp" not in op_name):
    return "MLM head + loss"
  for part, keys in PARTS:
    if any(k in op_name for k in keys):
      return part
  return "other"


def _hlo_info(hlo_text: str) -> dict[str, tuple[str, str]]:
  info = {}
  for line in hlo_text.split("\n"):
    m = re.match(r"\s*(?:ROOT )?%(\S+) = (\S+) ", line)
    if m:
      src = re.search(r'op_name="([^"]*)"', line)
      info[m.group(1)] = (m.group(2), src.group(1) if src else "")
  return info


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--case", default="train_small_128", choices=[
      c.name for c in cases.CASES if c.kind != "prepare"], help="a tools.bench case")
  p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  p.add_argument("--batch", type=int, default=0, help="batch size (default: the case's)")
  p.add_argument("--steps", type=int, default=3, help="traced steps (after 2 untimed ones)")
  p.add_argument("--top", type=int, default=25, help="how many single ops to list")
  p.add_argument("--part", default="", help="list only ops of this model part (e.g. 'other')")
  p.add_argument("--set", default="", metavar="NAME=VALUE,...",
                 help="config overrides, as a tools/ab_step.py variant (e.g. "
                      "model.cpu_forward_dots=ynnpack)")
  p.add_argument("--timeline", default="", metavar="SCOPE",
                 help="also list, in time order, the last traced step's ops whose JAX source "
                      "holds /SCOPE/ (e.g. layer_5): start, duration and thread")
  return p.parse_args(argv)


def main(argv=None) -> int:
  args = parse_args(argv)
  # Per-op trace events of the XLA CPU runtime; must be set before JAX starts.
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_cpu_enable_xprof_traceme=true").strip()
  built = step_builder.build_case(args.case, args.dtype, args.batch,
                                  ab_step.parse_variant(args.set))
  step, compile_s = built.run, built.compile_s
  info = _hlo_info(built.compiled.as_text())
  for i in range(2):
    step(i)
  walls = []
  with tempfile.TemporaryDirectory() as d:
    with jax.profiler.trace(d, create_perfetto_trace=True):
      for i in range(2, 2 + args.steps):
        t = time.perf_counter()
        step(i)
        walls.append(time.perf_counter() - t)
    trace_file = glob.glob(os.path.join(d, "**", "*.trace.json.gz"), recursive=True)[0]
    with gzip.open(trace_file) as f:
      events = json.load(f)
  events = events["traceEvents"] if isinstance(events, dict) else events
  per_op = collections.Counter()
  for e in events:
    if e.get("ph") == "X" and e.get("name") in info:
      per_op[e["name"]] += e.get("dur", 0) / 1e3 / args.steps  # ms per step
  if not per_op:
    print("error: the trace has no XLA op events (not a CPU backend?)", file=sys.stderr)
    return 1
  total = sum(per_op.values())
  print(f"{args.case} ({args.dtype}) on {jax.devices()[0].device_kind}: "
        f"wall {statistics.median(walls) * 1e3:.1f} ms/step (median of {len(walls)}), "
        f"compile {compile_s:.1f} s, op time {total:.1f} ms/step over {len(per_op)} ops")
  if total < 0.5 * statistics.median(walls) * 1e3:
    print("note: op time is under half the wall time. XLA's own (Eigen) dots, what "
          "features compile to on CPU by default (model.cpu_forward_dots), run "
          "asynchronously: their trace events time only their launch, so their time is "
          "missing below. --timeline shows it as the gap after each dot; "
          "--set model.cpu_forward_dots=ynnpack traces them as YNNPACK fusions.")
  for title, key in (("model part", lambda n: _part(info[n][1])), ("op kind", _kind)):
    groups = collections.Counter()
    for name, ms in per_op.items():
      groups[key(name)] += ms
    print(f"\nby {title}:")
    for g, ms in groups.most_common():
      print(f"  {ms:9.1f} ms  {100 * ms / total:5.1f}%  {g}")
  print(f"\ntop {args.top} ops{' of ' + args.part if args.part else ''} (ms/step, shape, JAX source):")
  listed = [(n, ms) for n, ms in per_op.most_common()
            if not args.part or _part(info[n][1]) == args.part]
  for name, ms in listed[:args.top]:
    shape, src = info[name]
    print(f"  {ms:8.1f}  {name:28s} {shape[:32]:32s} {src.replace('jit(step_fn)/', '')[-90:]}")
  if args.timeline:
    _print_timeline(events, info, args.timeline)
  return 0


def _print_timeline(events: list, info: dict, scope: str) -> None:
  """The last traced step's ops of one scope in time order: what runs side by side, and the gaps."""
  ops = sorted((e for e in events if e.get("ph") == "X" and e.get("name") in info),
               key=lambda e: e["ts"])
  # Op names repeat every step: the last step starts at the last occurrence of the first op.
  first = ops[0]["name"]
  start = max(i for i, e in enumerate(ops) if e["name"] == first)
  chosen = [e for e in ops[start:] if f"/{scope}/" in info[e["name"]][1]]
  if not chosen:
    print(f"\nno op of the last step has /{scope}/ in its JAX source")
    return
  t0 = chosen[0]["ts"]
  span = max(e["ts"] + e["dur"] for e in chosen) - t0
  threads = {tid: i for i, tid in enumerate(dict.fromkeys(e["tid"] for e in chosen))}
  print(f"\ntimeline of /{scope}/ in the last step: {span / 1e3:.1f} ms from its first op's "
        f"start to its last op's end (start ms, duration ms, thread, op, shape, JAX source):")
  for e in chosen:
    shape, src = info[e["name"]]
    print(f"  {(e['ts'] - t0) / 1e3:8.1f} {e['dur'] / 1e3:8.1f}  t{threads[e['tid']]}  "
          f"{e['name']:28s} {shape[:28]:28s} {src.replace('jit(step_fn)/', '')}")


if __name__ == "__main__":
  host_malloc.reexec_with_huge_pages()  # profile the step as the trainer runs it
  sys.exit(main())
