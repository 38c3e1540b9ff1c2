"""The README's "Plan a TPU run" table: BERT-Base and BERT-Large on four TPU slices.

  python tools/plan_table.py                       # all 16 rows, to stdout and --out
  python tools/plan_table.py --models base --topologies v4-8,v5e-8 --out /tmp/t.md

Compiles the real train step of each phase (phase 1: L=128, P=20; phase 2:
L=512, P=80) at the reference global batch 256, as `python -m bert_jax.plan`
does (`bert_jax.dist.plan`), for v4-8, v5e-8, v5p-8 and v6e-8, with libtpu
on any host (no TPU). Each row: memory per device against the chip's HBM,
fits or not, the FLOPs of one step and its collectives. Needs libtpu (pip
install -r requirements-tpu.txt). A compile takes minutes on 2 CPU cores;
rows are printed as they finish, and the file is rewritten (atomically) after
each row, with the date and the versions used.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MODELS = {"base": ("BERT-Base", "configs/base.py"), "large": ("BERT-Large", "configs/large.py")}
TOPOLOGIES = ("v4-8", "v5e-8", "v5p-8", "v6e-8")
HEADER = ("| model | phase (L, P) | slice | devices | batch / device | memory / device (GiB) | "
          "fits | model TFLOP / step | XLA TFLOP / device-step | collectives / step |\n"
          "|---|---|---|---|---|---|---|---|---|---|")


def load_config(path: str):
  import importlib.util
  spec = importlib.util.spec_from_file_location("plan_table_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def row(label: str, topo, st) -> str:
  from bert_jax.dist import plan as plan_lib, plan_report
  GIB = plan_lib.GIB
  if st.compiled:
    mem = f"{st.total_bytes / GIB:.2f} of {topo.hbm_bytes_per_device / GIB:g}"
  elif st.total_bytes:
    mem = f"needs {st.total_bytes / GIB:.2f} of {topo.hbm_bytes_per_device / GIB:g}"
  else:
    mem = f"? ({st.error[:60]})"
  colls = plan_report.describe_collectives(st.collectives) if st.compiled else "-"
  return (f"| {label} | {st.seq_len}, {st.max_predictions} | {topo.name} | {topo.num_devices} | "
          f"{st.per_device_batch} | {mem} | {'yes' if st.fits else '**no**'} | "
          f"{st.model_flops * topo.num_devices / 1e12:.2f} | "
          f"{(st.xla_flops / 1e12) if st.compiled else float('nan'):.2f} | {colls} |")


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--models", default="base,large")
  ap.add_argument("--topologies", default=",".join(TOPOLOGIES))
  ap.add_argument("--phases", default="0,1", help="phase indices of the configs (0: L=128, 1: 512)")
  ap.add_argument("--out", default=os.path.join("tools", "results", "plan_table.md"))
  args = ap.parse_args(argv)
  from bert_jax.dist import topology
  topos = [topology.parse(t) for t in args.topologies.split(",") if t]
  devices = {t.name: topology.devices(t) for t in topos}  # before JAX picks a backend
  from bert_jax import settings as settings_lib
  from bert_jax.dist import plan as plan_lib
  phases = [int(p) for p in args.phases.split(",")]
  rows, started = [], time.time()
  todo = len(args.models.split(",")) * len(topos) * len(phases)
  print(HEADER, flush=True)
  for key in args.models.split(","):
    label, path = MODELS[key]
    s = settings_lib.from_config(load_config(path))
    for t in topos:
      p = plan_lib.Planner(s, devices[t.name], s.data.vocab_size, t.hbm_bytes_per_device,
                           log=lambda m: print(m, file=sys.stderr, flush=True))
      for ph in s.train.phases:
        if ph.index in phases:
          r = row(label, t, p.compile_step("train", ph))
          rows.append(r)
          print(r, flush=True)
          write(args.out, rows, todo, time.time() - started)  # a long run keeps what it has
  print(f"wrote {args.out}", file=sys.stderr)
  return 0


def write(path: str, rows: list, todo: int, seconds: float) -> None:
  from bert_jax.dist import plan as plan_lib
  v = plan_lib.versions()
  date = datetime.date.today().isoformat()
  partial = f" Partial: {len(rows)} of {todo} rows." if len(rows) < todo else ""
  text = (f"Generated {date} by `python tools/plan_table.py` (jax {v['jax']}, libtpu "
          f"{v.get('libtpu', '-')}; {seconds:.0f} s of compiling on this host).{partial} "
          "Global batch 256, the configs as shipped (mixed bf16; BERT-Large with remat); "
          "memory is the compiler's per-device total (state, batch, temporaries, program).\n\n"
          + HEADER + "\n" + "\n".join(rows) + "\n")
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=folder, suffix=".md")
  with os.fdopen(fd, "w") as f:
    f.write(text)
  os.replace(tmp, path)


if __name__ == "__main__":
  sys.exit(main())
