"""The planner's per-device memory and compiled FLOPs of BERT-Base's train step with the
reference attention ('einsum') and with Pallas splash attention ('splash'), at 128 and 512
tokens and at long-context lengths, on TPU slices compiled here with libtpu (no TPU).

  python tools/plan_kernels.py                                  # every row, then the table
  python tools/plan_kernels.py --topologies v5e-8 --lens 512    # some rows again
  python tools/plan_kernels.py --table-only

Each row is one `python -m bert_jax.plan --nosearch --noeval` in a process of its own:
configs/base.py with attention dropout 0 for both kernels (splash has none), one phase of
L tokens (max_position_embeddings = L), 15% predictions, and the same 131,072 tokens a
step at every length (the recipe's 256 x 512): 1024 rows at 128, 256 at 512, 64 at
2048, 16 at 8192.
Rows are unpadded: the compile cannot see what packing or padding skips at run time, so
splash's block skipping is not in these numbers. XLA's cost analysis counts nothing for
the splash kernel (a Mosaic custom call): its XLA FLOPs are the rest of the step, the
same at every length; the analytic model FLOPs count attention for both.
Rows are kept in tools/results/plan_kernels.json; the table goes to plan_kernels.md.
Needs libtpu (pip install -r requirements-tpu.txt).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

TOKENS = 256 * 512  # per step, at every length
KERNELS = ("einsum", "splash")
GIB = 1024**3
RESULTS = os.path.join(ROOT, "tools", "results")


def row_command(topology: str, seq_len: int, kernel: str, json_path: str) -> list[str]:
  """The planner's command line for one row."""
  over = {"model.attention_kernel": kernel, "model.attention_dropout_rate": 0.0,
          "train.seq_lens": f"({seq_len},)", "train.phase_fractions": "(1.0,)",
          "train.max_predictions": f"({int(0.15 * seq_len)},)",
          "model.max_position_embeddings": seq_len, "train.batch_size": TOKENS // seq_len}
  return ([sys.executable, "-m", "bert_jax.plan", "--config", "configs/base.py",
           "--topology", topology, "--nosearch", "--noeval", "--json", json_path]
          + [f"--config.{k}={v}" for k, v in over.items()])


def run_row(topology: str, seq_len: int, kernel: str) -> dict:
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "plan.json")
    t = time.time()
    proc = subprocess.run(row_command(topology, seq_len, kernel, path), cwd=ROOT,
                          capture_output=True, text=True, check=False)
    seconds = time.time() - t
    if proc.returncode not in (0, 1) or not os.path.exists(path):
      return {"topology": topology, "seq_len": seq_len, "kernel": kernel, "seconds": seconds,
              "error": (proc.stderr.strip().splitlines() or ["?"])[-1][:200]}
    with open(path) as f:
      plan = json.load(f)
  (step,) = plan["steps"]
  return {"topology": topology, "seq_len": seq_len, "kernel": kernel, "seconds": seconds,
          "devices": plan["num_devices"], "hbm_bytes": plan["memory_bytes"],
          "batch": step["batch"], "per_device_batch": step["per_device_batch"],
          "compiled": step["compiled"], "fits": step["fits"],
          "total_bytes": step["total_bytes"], "temp_bytes": step["temp_bytes"],
          "xla_flops": step["xla_flops"], "model_flops": step["model_flops"],
          "error": step["error"], "versions": plan.get("versions", {})}


def _memory(r: dict) -> str:
  if "devices" not in r:
    return f"not planned: {r['error']}"
  hbm = r["hbm_bytes"] / GIB
  if r["compiled"]:
    return f"{r['total_bytes'] / GIB:.2f} of {hbm:g} (temporaries {r['temp_bytes'] / GIB:.2f})"
  if r["total_bytes"]:
    return f"needs > {r['total_bytes'] / GIB:.2f} of {hbm:g} (out of HBM)"
  return f"? ({r['error'][:60]})"


def table(rows: list[dict]) -> str:
  by = {(r["topology"], r["seq_len"], r["kernel"]): r for r in rows}
  keys = sorted({(r["topology"], r["seq_len"]) for r in rows})
  v = next((r["versions"] for r in rows if r.get("versions")), {})
  lines = [f"Written {datetime.date.today().isoformat()} by `python tools/plan_kernels.py` "
           f"(jax {v.get('jax', '?')}, libtpu {v.get('libtpu', '?')}) on a 2-core CPU with "
           "libtpu's topologies, no TPU: BERT-Base's train step, 131,072 tokens a step, "
           "attention dropout 0, unpadded rows. XLA's FLOPs leave out the splash kernel "
           "(a Mosaic call declares no cost to XLA); the model FLOPs count attention "
           "analytically.", "",
           "| slice | L | batch (per device) | einsum: memory / device (GiB) | splash: memory "
           "/ device (GiB) | einsum: XLA TFLOP / device | splash: XLA TFLOP / device | "
           "model TFLOP / device | compile here (s) |", "|---|---|---|---|---|---|---|---|---|"]
  for topo, seq_len in keys:
    e, s = by.get((topo, seq_len, "einsum"), {}), by.get((topo, seq_len, "splash"), {})
    any_row = e or s
    flops = lambda r: f"{r['xla_flops'] / 1e12:.2f}" if r.get("compiled") else "-"
    batch = (f"{any_row['batch']} ({any_row['per_device_batch']})" if "batch" in any_row
             else "?")
    model = (f"{any_row['model_flops'] / 1e12:.2f}" if "model_flops" in any_row else "?")
    secs = " / ".join(f"{r['seconds']:.0f}" for r in (e, s) if r)
    lines.append(f"| {topo} | {seq_len} | {batch} | {_memory(e) if e else 'not run'} | "
                 f"{_memory(s) if s else 'not run'} | {flops(e)} | {flops(s)} | {model} | "
                 f"{secs} |")
  return "\n".join(lines) + "\n"


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--topologies", default="v5e-8,v5p-8,v6e-8")
  ap.add_argument("--lens", default="128,512,2048,8192")
  ap.add_argument("--kernels", default=",".join(KERNELS))
  ap.add_argument("--table-only", action="store_true")
  ap.add_argument("--out", default=os.path.join(RESULTS, "plan_kernels"))
  args = ap.parse_args(argv)
  json_path = args.out + ".json"
  rows = []
  if os.path.exists(json_path):
    with open(json_path) as f:
      rows = json.load(f)
  if not args.table_only:
    for topo in args.topologies.split(","):
      for seq_len in map(int, args.lens.split(",")):
        for kernel in args.kernels.split(","):
          r = run_row(topo, seq_len, kernel)
          print(json.dumps({k: r[k] for k in r if k != "versions"}), flush=True)
          rows = [x for x in rows if (x["topology"], x["seq_len"], x["kernel"])
                  != (topo, seq_len, kernel)] + [r]
          _write(json_path, json.dumps(rows, indent=1))
  text = table(rows)
  _write(args.out + ".md", text)
  print(text)
  return 0


def _write(path: str, text: str) -> None:
  from bert_jax.storage import fs  # the package's one writer of whole files
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fs.write_atomic_local(path, lambda f: f.write(text.encode("utf-8")))


if __name__ == "__main__":
  sys.exit(main())
