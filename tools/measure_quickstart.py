"""Regenerates the README's Quick start "Measured" block from a real `python train.py` run.

  python tools/measure_quickstart.py             # the Quick start run; prints the block
  python tools/measure_quickstart.py --readme    # ... and rewrites it in README.md
  python tools/measure_quickstart.py --steps 40  # a quick check (the block says so)

Runs `python train.py` (the tiny config on the built-in corpus) in a fresh workdir
with its output passing through, times it, reads what the run printed (data
preparation, its end-of-run throughput summary) and its `metrics.jsonl` (the final
evaluation), and prints the markdown block that sits between the
`<!-- quickstart:start -->` and `<!-- quickstart:end -->` markers of README.md.
The wall time is split into the parts the run measured, so the rates can be checked
against it. Run it alone on an idle machine: other jobs slow every number.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bert_jax.errors import BertJaxError  # noqa: E402  (run as a script: the repo root first)
from tools import readme_block  # noqa: E402

README = os.path.join(ROOT, "README.md")
BLOCK = "quickstart"
START, END = readme_block.markers(BLOCK)
DEFAULT_STEPS = 1200  # configs/tiny.py

_PREPARED = re.compile(r"^Prepared seq_len \d+: .* in ([\d.]+) s", re.M)
_MODEL = re.compile(r"^model: (.*)$", re.M)
_SUMMARY = re.compile(
    r"^throughput: (\d+) steps in ([\d.]+) s: ([\d.]+) steps/s, ([\d.]+) sequences/s, "
    r"(\d+) tokens/s \((\d+) real\), ([\d.e+-]+) model TFLOP/s(?:, MFU ([\d.]+%))?"
    r"; compile \(first step\) ([^;]*?)(?:; evaluation ([\d.]+) s)?(?:; probes ([\d.]+) s)?$",
    re.M)


def cpu_name() -> str:
  from bert_jax.model import precision  # the one reader of /proc/cpuinfo
  return precision.cpu_model() or platform.processor() or platform.machine()


def _duration(sec: float) -> str:
  m, s = divmod(round(sec), 60)
  return f"{m} min {s} s" if m else f"{sec:.1f} s"


def run_quickstart(steps: int, workdir: str) -> dict:
  """Runs train.py into `workdir`; returns what it printed, its wall time and final eval."""
  cmd = [sys.executable, os.path.join(ROOT, "train.py"), "--workdir", workdir]
  if steps != DEFAULT_STEPS:
    cmd.append(f"--config.train.num_steps={steps}")
  load = os.getloadavg()[0]
  start = time.perf_counter()
  proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, bufsize=1, env=dict(os.environ, PYTHONUNBUFFERED="1"))
  lines, arrived = [], {}  # arrived: what a line starts with -> seconds since the start
  for line in proc.stdout:
    sys.stderr.write(line)  # the run's own output passes through (progress bar included)
    lines.append(line)
    for part in line.split("\r"):
      for key in ("throughput: ", "final eval @"):
        if part.startswith(key):
          arrived.setdefault(key + ("summary" if " steps in " in part else ""),
                             time.perf_counter() - start)
  rc = proc.wait()
  wall = time.perf_counter() - start
  text = "".join(lines).replace("\r", "\n")
  if rc != 0:
    raise SystemExit(f"error: train.py exited {rc}; see its output above")
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    rows = [json.loads(l) for l in f if l.strip()]
  evals = [r for r in rows if r.get("split") == "eval" and r.get("step") == steps]
  probes = [r for r in rows if r.get("split") == "probe" and r.get("step") == steps]
  summary = _SUMMARY.search(text)
  if not evals or summary is None:
    raise SystemExit("error: the run printed no throughput summary or wrote no final eval "
                     f"row at step {steps} to {workdir}/metrics.jsonl")
  times = {"train_start_s": arrived.get("throughput: "),  # the start-up note of the loop
           "final_eval_s": (arrived["final eval @"] - arrived["throughput: summary"]
                            if "final eval @" in arrived and "throughput: summary" in arrived
                            else None)}
  return {**times, "steps": steps, "wall_s": wall, "load_at_start": load, "text": text,
          "prepare_s": sum(float(x) for x in _PREPARED.findall(text)),
          "model": (_MODEL.search(text) or [None, "?"])[1], "summary": summary,
          "eval": evals[-1], "probe": probes[-1] if probes else None, "date": datetime.datetime.now(datetime.timezone.utc)}


def markdown(m: dict) -> str:
  """The README block (markers included) for the measurement `m`."""
  return readme_block.wrap(BLOCK, body(m))


def body(m: dict) -> str:
  """The text between the block's markers for the measurement `m`."""
  s, ev = m["summary"], m["eval"]
  timed_steps, timed_s = int(s[1]), float(s[2])
  compile_s = sum(float(x) for x in re.findall(r"([\d.]+) s", s[9]))
  eval_s = float(s[10] or 0)
  probe_s = float(s[11] or 0)  # config.probe.tasks at every eval but the final one
  final_s = m.get("final_eval_s") or 0.0
  startup_s = max((m.get("train_start_s") or 0.0) - m["prepare_s"], 0.0)
  rest = (m["wall_s"] - startup_s - m["prepare_s"] - timed_s - compile_s - eval_s - probe_s
          - final_s)
  command = "python train.py" + ("" if m["steps"] == DEFAULT_STEPS
                                 else f" --config.train.num_steps={m['steps']}")
  quick = ("" if m["steps"] == DEFAULT_STEPS else
           f" *A quick check of {m['steps']} steps, not the Quick start's {DEFAULT_STEPS}.*")
  devices = re.search(r"(\d+ \w+ devices)", m["model"])
  mfu = f", MFU {s[8]}" if s[8] else " (MFU: no known peak for this device)"
  return "\n".join([
      f"**Measured**: `{command}` in a fresh workdir, on {cpu_name()} ({os.cpu_count()} "
      f"cores, {devices[1] if devices else 'devices: see the run'}; load average "
      f"{m['load_at_start']:.1f} when it started), {m['date']:%Y-%m-%d %H:%M} UTC. Written by "
      f"`python tools/measure_quickstart.py --readme` from that run's output and "
      f"`metrics.jsonl`.{quick}",
      "",
      "| | |",
      "| --- | --- |",
      f"| wall time | {_duration(m['wall_s'])}: start-up (imports, model set-up) "
      f"{_duration(startup_s)}, data preparation {m['prepare_s']:.1f} s, compile "
      f"{compile_s:.1f} s, {timed_steps} timed steps {_duration(timed_s)}, evaluations "
      f"{eval_s:.1f} s" + (f", probes {probe_s:.1f} s" if probe_s else "")
      + f", final evaluation and checkpoint {final_s:.1f} s, the rest (plot, "
      f"exit) {_duration(rest) if rest >= 0 else f'{rest:.1f} s (the parts overlap)'} |",
      f"| training speed | {float(s[3]):.2f} steps/s, {float(s[4]):.0f} sequences/s, "
      f"{int(s[5])} tokens/s ({int(s[6])} real), {float(s[7]):.3g} model TFLOP/s{mfu}; "
      "over synchronised intervals, compile and evaluation left out |",
      f"| held-out MLM accuracy | {ev['mlm_accuracy']:.3f} ± "
      f"{ev.get('mlm_accuracy_stderr', float('nan')):.3f} (the best constant guess is "
      f"{ev.get('mlm_best_constant_accuracy', float('nan')):.3f}) |",
      f"| held-out NSP accuracy | {ev['nsp_accuracy']:.3f} ± "
      f"{ev.get('nsp_accuracy_stderr', float('nan')):.3f} |"] + [
      f"| linear probe, {k.replace('/', ' ')} | {v:.3f} (dev of "
      f"{int(m['probe'].get(k.split('/')[0] + '/num_eval', 0))}; see Is the model any good?) |"
      for k, v in (m.get("probe") or {}).items()
      if "/" in k and not k.endswith("/num_eval")])


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--steps", type=int, default=DEFAULT_STEPS,
                 help=f"training steps (default {DEFAULT_STEPS}, the Quick start's)")
  p.add_argument("--readme", action="store_true", help="rewrite the block in README.md")
  p.add_argument("--workdir", default="",
                 help="a fresh workdir to train into (default: a temporary one, removed)")
  args = p.parse_args(argv)
  try:
    return _measure(args)
  except (BertJaxError, OSError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2


def _measure(args: argparse.Namespace) -> int:
  if args.readme:  # fail before the (long) run, not after it
    readme_block.check(README, BLOCK)
  if args.workdir and os.path.exists(args.workdir) and os.listdir(args.workdir):
    raise SystemExit(f"error: --workdir {args.workdir} is not empty; expected a fresh one")
  workdir = args.workdir or tempfile.mkdtemp(prefix="measure_quickstart_")
  try:
    text = body(run_quickstart(args.steps, os.path.abspath(workdir)))
  finally:
    if not args.workdir:
      shutil.rmtree(workdir, ignore_errors=True)
  print(readme_block.wrap(BLOCK, text))
  if args.readme:
    readme_block.rewrite(README, BLOCK, text)
    print(f"rewrote the block in {README}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
