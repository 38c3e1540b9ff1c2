"""The README's "Plan a TPU run" table: BERT-Base and BERT-Large on four TPU slices,
and ModernBERT-Base and -Large at 1024 and 8192 tokens (`--models
modernbert-base,modernbert-large`: their config with the context extension as a second
phase, 8192 tokens at global RoPE theta 160,000, docs/modernbert.md).

  python tools/plan_table.py                       # all 16 rows, then the table
  python tools/plan_table.py --models large --topologies v4-8 --phases 1   # one row again
  python tools/plan_table.py --table-only          # the table again from plan_table.json
  python tools/plan_table.py --dot-layouts --models base --topologies v4-8,v5e-8 --phases 0

Compiles the real train step of each phase (phase 1: L=128, P=20; phase 2:
L=512, P=80) at the reference global batch 256, as `python -m bert_jax.plan`
does (`bert_jax.planner.plan`), for v4-8, v5e-8, v5p-8 and v6e-8, with libtpu
on any host (no TPU). Each row: memory per device against the chip's HBM,
fits or not (and, when not, the planner's fit search: the largest per-device
batch that fits and which config change makes the batch fit, each verified by
a compile), the FLOPs of one step and its collectives. Needs libtpu (pip
install -r requirements-tpu.txt).

Each row is compiled in a process of its own, at low priority (nice), so its
memory goes back to the host when it ends; its peak host RAM is measured and
a row whose compile passes --max-rss-gib is stopped and recorded as such. Rows
are kept in tools/results/plan_table.json (a run recomputes the rows it
selects and keeps the others), and the Markdown table is written from it with
the date and the versions used.

--dot-layouts compiles each selected row twice instead, with the mixed dot
as TPU programs have it (plain, f32 accumulation) and with XLA CPU's
canonical-layout transposes, and prints both temporaries (no table written).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# ModernBERT's configs are its three stages (1024 tokens at 4608 rows, then 8192 at 576
# in the extension and the decay): each stage's step is planned as the config has it.
EXTENDED: dict = {}
MODELS = {"base": ("BERT-Base", "configs/base.py", {}),
          "large": ("BERT-Large", "configs/large.py", {}),
          "modernbert-base": ("ModernBERT-Base", "configs/modernbert_base.py", EXTENDED),
          "modernbert-large": ("ModernBERT-Large", "configs/modernbert_large.py", EXTENDED)}
TOPOLOGIES = ("v4-8", "v5e-8", "v5p-8", "v6e-8", "tpu7x-8")  # tpu7x: libtpu 0.0.50+
GIB = 1024**3
# libtpu's compile: one compile thread keeps the peak host memory of a big step down.
LIBTPU_ARGS = "--xla_tpu_impure_hlo_parallel_compile=false"
HEADER = ("| model | phase (L, P) | slice | devices | batch / device | memory / device (GiB) | "
          "fits | when it does not fit (each verified by a compile) | model TFLOP / step | "
          "XLA TFLOP / device-step | collectives / step | compile here (s, peak host RAM) |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|")


def load_config(path: str, overrides: dict | None = None):
  import importlib.util
  spec = importlib.util.spec_from_file_location("plan_table_config", os.path.join(ROOT, path))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  config.update_from_flattened_dict(dict(overrides or {}))
  return config


def row_keys(args) -> list:
  return [(m, t, int(ph)) for m in args.models.split(",") if m
          for t in args.topologies.split(",") if t for ph in args.phases.split(",") if ph]


# ----------------------------------------------------------------------------
# One row, in its own process


def compile_row(model: str, topo_name: str, phase: int, search: bool, max_compiles: int,
                layout: str = "") -> dict:
  """Compiles one row's train step (and searches what fits when it does not); a JSON dict."""
  from bert_jax.planner import topology
  topo = topology.parse(topo_name)
  devices = topology.devices(topo)  # before JAX picks a backend
  from bert_jax import settings as settings_lib
  from bert_jax.planner import fit_search, plan as plan_lib, plan_report
  s = settings_lib.from_config(load_config(*MODELS[model][1:]))
  log = lambda m: print(m, file=sys.stderr, flush=True)
  p = plan_lib.Planner(s, devices, s.data.vocab_size, topo.hbm_bytes_per_device, log)
  ph = next(x for x in p.s.train.phases if x.index == phase)
  if layout:  # the mixed dots laid out as for 'cpu' (canonical layouts) or 'tpu' (plain)
    p.steps.platform = layout
  st = p.compile_step("train", ph)
  out = {"model": model, "slice": topo_name, "devices": topo.num_devices,
         "hbm_bytes": topo.hbm_bytes_per_device, "step": st.to_dict(),
         "model_flops_per_step": st.model_flops * topo.num_devices,
         "collectives": plan_report.describe_collectives(st.collectives) if st.compiled else "",
         "versions": plan_lib.versions()}
  if not st.fits and search:
    plan = plan_lib.Plan(topo.describe(), "tpu", topo.num_devices, "", topo.hbm_bytes_per_device,
                         "HBM", {k: int(v) for k, v in p.mesh.shape.items()}, {}, [st])
    fit_search.search_fixes(p, plan, [st], max_compiles)
    out["max_per_device_batch"] = plan.max_per_device_batch
    out["max_batch_exact"] = plan.max_batch_exact
    out["fixes"] = [f.to_dict() for f in plan.fixes]
  return out


def run_child(key: tuple, args, result_path: str, layout: str = "") -> dict:
  """Runs one row in a child process; its result, or why it has none, with its peak RSS."""
  model, topo, phase = key
  nice = str(max(0, 10 - os.nice(0)))  # the child at niceness 10, however this one runs
  cmd = ["nice", "-n", nice, sys.executable, os.path.abspath(__file__), "--one",
         f"{model}:{topo}:{phase}", "--result", result_path,
         "--search-compiles", str(args.search_compiles)] + (["--nosearch"] if args.nosearch
                                                           else [])
  if layout:
    cmd += ["--layout", layout]
  env = dict(os.environ)
  if not args.parallel_compile:
    env["LIBTPU_INIT_ARGS"] = (env.get("LIBTPU_INIT_ARGS", "") + " " + LIBTPU_ARGS).strip()
  started, killed_at = time.time(), 0
  proc = subprocess.Popen(cmd, env=env, cwd=ROOT)
  while True:  # poll, so that a compile past the host-memory limit is stopped
    pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
    if pid:
      break
    rss = _rss_bytes(proc.pid)
    if rss > args.max_rss_gib * GIB and not killed_at:
      killed_at = rss
      os.kill(proc.pid, signal.SIGKILL)
    time.sleep(2)
  peak, seconds = usage.ru_maxrss * 1024, time.time() - started
  if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
    with open(result_path) as f:
      out = json.load(f)
  else:
    why = (f"stopped at {killed_at / GIB:.1f} GiB of host RAM (--max-rss-gib "
           f"{args.max_rss_gib:g})" if killed_at else
           f"killed by signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else
           f"exit status {os.WEXITSTATUS(status)}")
    out = {"model": model, "slice": topo, "phase": phase, "host_failure": why}
  out.update(peak_rss_bytes=peak, wall_seconds=seconds, phase=phase)
  return out


def _rss_bytes(pid: int) -> int:
  try:
    with open(f"/proc/{pid}/status") as f:
      for line in f:
        if line.startswith("VmRSS:"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return 0


# ----------------------------------------------------------------------------
# The table


def _fix_text(r: dict) -> str:
  if "max_per_device_batch" not in r:
    return "search not run"
  m = r["max_per_device_batch"]
  exact = r.get("max_batch_exact", True)
  parts = [f"largest batch / device: {m}{'' if exact else ' or more (search stopped)'}" if m
           else "no batch / device fits" if m == 0 else "largest batch / device: not found"]
  for f in r.get("fixes", []):
    size = f" ({f['total_bytes'] / GIB:.1f} GiB)" if f["total_bytes"] else ""
    parts.append(f"`{f['field'].replace('--config.', '')}` "
                 f"{'fits' if f['fits'] else 'does not fit'}{size}")
  return "; ".join(parts)


def shipped_batch(model: str, phase: int) -> int:
  """The global batch of `phase` in the model's config as shipped today."""
  from bert_jax import settings as settings_lib
  train = settings_lib.from_config(load_config(*MODELS[model][1:])).train
  return train.batch_of(next(p for p in train.phases if p.index == phase))


def global_batch(r: dict) -> int:
  return r["step"]["per_device_batch"] * r["devices"]


def row_text(r: dict, shipped: int = 0) -> str:
  """One Markdown row; `shipped` the config's batch now, to mark a row of an earlier one."""
  label = MODELS[r["model"]][0]
  host = f"{r['wall_seconds']:.0f}, {r['peak_rss_bytes'] / GIB:.1f} GiB"
  if "host_failure" in r:
    return (f"| {label} | {r.get('seq', '?')} | {r['slice']} | | | not compiled here: "
            f"{r['host_failure']} | ? | | | | | {host} |")
  st, hbm = r["step"], r["hbm_bytes"]
  if st["compiled"]:
    mem = f"{st['total_bytes'] / GIB:.2f} of {hbm / GIB:g}"
  elif st["total_bytes"]:
    mem = f"needs > {st['total_bytes'] / GIB:.2f} of {hbm / GIB:g} (compiler: out of HBM)"
  else:
    mem = f"? ({st['error'][:80]})"
  fits = "yes" if st["fits"] else "**no**"
  if shipped and global_batch(r) != shipped:  # compiled before the config's batch changed
    label += f" (an earlier config: batch {global_batch(r)}, now {shipped})"
  xla = f"{st['xla_flops'] / 1e12:.2f}" if st["compiled"] else "-"
  return (f"| {label} | {st['seq_len']}, {st['max_predictions']} | {r['slice']} | "
          f"{r['devices']} | {st['per_device_batch']} | {mem} | {fits} | "
          f"{'' if st['fits'] else _fix_text(r)} | {r['model_flops_per_step'] / 1e12:.2f} | "
          f"{xla} | {r['collectives'] or '-'} | {host} |")


def write_table(path: str, rows: dict) -> None:
  # ModernBERT's rows are the v5e, v5p and v6e slices (no v4); TPU7x's are
  # BERT-Base's and ModernBERT's (issue 54).
  order = [(m, t, ph) for m in MODELS for ph in (0, 1) for t in TOPOLOGIES
           if not (m.startswith("modernbert") and t == "v4-8")
           and not (m == "large" and t == "tpu7x-8")]
  keyed = {(r["model"], r["slice"], r["phase"]): r for r in rows.values()}
  done = [keyed[k] for k in order if k in keyed]
  shipped = {(r["model"], r["phase"]): 0 for r in done}  # one config load per model, phase
  shipped = {k: shipped_batch(*k) for k in shipped}
  earlier = sum(1 for r in done
                if "step" in r and global_batch(r) != shipped[(r["model"], r["phase"])])
  by_version: dict = {}  # (jax, libtpu) -> {family: the slices compiled with them}
  for r in done:
    v = r.get("versions", {})
    family = "ModernBERT" if r["model"].startswith("modernbert") else "BERT"
    by_version.setdefault((v.get("jax", "?"), v.get("libtpu", "-")), {}).setdefault(
        family, []).append(r["slice"])
  versions = "; ".join(f"jax {j}, libtpu {t}" + (" (" + ", ".join(
      f"{fam} on {', '.join(dict.fromkeys(sl))}" for fam, sl in fams.items()) + ")"
      if len(by_version) > 1 else "") for (j, t), fams in by_version.items())
  date = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
  seconds = sum(r["wall_seconds"] for r in done)
  missing = len(order) - len(done)
  text = (f"Generated {date} by `python tools/plan_table.py` ({versions}) on this host (2-core AMD EPYC, 24 GiB RAM, shared with "
          f"other jobs), {seconds:.0f} s "
          f"of compiling, each row in a process of its own."
          + (f" Missing: {missing} of {len(order)} rows." if missing else "")
          + " The configs as shipped: BERT at global batch 256 (mixed bf16; BERT-Large with "
          "remat), ModernBERT with its `attention_kernel=auto` (splash on TPU) at each "
          "stage's batch, 4608 rows at 1024 tokens and 576 at 8192"
          + (f" ({earlier} rows, marked, were compiled at an earlier config's batch)"
             if earlier else "") + "; "
          "memory is the compiler's per-device total (state, batch, temporaries, program). "
          "A step that does not fit is searched as `python -m bert_jax.plan` does: the "
          "largest per-device batch that fits, and each single config change compiled at the "
          "requested batch.\n\n" + HEADER + "\n" + "\n".join(
              row_text(r, shipped[(r["model"], r["phase"])]) for r in done) + "\n")
  _atomic_write(path, text)


def _atomic_write(path: str, text: str) -> None:
  from bert_jax.storage import fs  # the package's one writer of whole files
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fs.write_atomic_local(path, lambda f: f.write(text.encode("utf-8")))


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--models", default="base,large")
  ap.add_argument("--topologies", default=",".join(TOPOLOGIES))
  ap.add_argument("--phases", default="0,1", help="phase indices of the configs (0: L=128, 1: 512)")
  ap.add_argument("--out", default=os.path.join(ROOT, "tools", "results", "plan_table.md"))
  ap.add_argument("--nosearch", action="store_true", help="no fit search for rows that do not fit")
  ap.add_argument("--search-compiles", type=int, default=6,
                  help="compiles the batch search may take per row")
  ap.add_argument("--max-rss-gib", type=float, default=16.0,
                  help="stop a row whose compile needs more host RAM than this")
  ap.add_argument("--parallel-compile", action="store_true",
                  help="libtpu's parallel compile, for a host with nothing else to do "
                       "(ModernBERT-Large's 1024-token step on v5p-8: 226 s, 6.7 GiB; "
                       "single-threaded beside other work it took 45 min); more host RAM")
  ap.add_argument("--dot-layouts", action="store_true",
                  help="temporaries with the plain mixed dot and with CPU's layouts")
  ap.add_argument("--table-only", action="store_true",
                  help="only rewrite the Markdown table from the rows kept in the JSON file")
  ap.add_argument("--one", help=argparse.SUPPRESS)  # model:slice:phase, in a child process
  ap.add_argument("--result", help=argparse.SUPPRESS)
  ap.add_argument("--layout", default="", help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  if args.one:
    model, topo, phase = args.one.split(":")
    out = compile_row(model, topo, int(phase), not args.nosearch, args.search_compiles,
                      args.layout)
    _atomic_write(args.result, json.dumps(out))
    return 0
  if args.dot_layouts:
    return dot_layouts(args)
  store = os.path.splitext(args.out)[0] + ".json"
  rows = {}
  if os.path.exists(store):
    with open(store) as f:
      rows = json.load(f)
  if args.table_only:
    write_table(args.out, rows)
    return 0
  with tempfile.TemporaryDirectory() as tmp:
    for key in row_keys(args):
      r = run_child(key, args, os.path.join(tmp, "row.json"))
      rows[":".join(map(str, key))] = r
      _atomic_write(store, json.dumps(rows, indent=1))  # a long run keeps what it has
      write_table(args.out, rows)
      print(row_text(r), flush=True)
  print(f"wrote {args.out} and {store}", file=sys.stderr)
  return 0


def dot_layouts(args) -> int:
  """Temporaries of each selected row with the plain dot (as on TPU) and CPU's layouts."""
  print("| model | phase (L, P) | slice | temporaries, plain dot (GiB) | temporaries, CPU "
        "layouts (GiB) |\n|---|---|---|---|---|")
  with tempfile.TemporaryDirectory() as tmp:
    for key in row_keys(args):
      args.nosearch = True
      got = {lay: run_child(key, args, os.path.join(tmp, "row.json"), lay)
             for lay in ("tpu", "cpu")}
      temp = {k: (f"{r['step']['temp_bytes'] / GIB:.2f}" if "step" in r else r["host_failure"])
              for k, r in got.items()}
      st = got["tpu"].get("step", {})
      print(f"| {MODELS[key[0]][0]} | {st.get('seq_len')}, {st.get('max_predictions')} | "
            f"{key[1]} | {temp['tpu']} | {temp['cpu']} |", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
