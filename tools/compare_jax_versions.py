"""Step time on jax 0.10.2 (Python 3.11) against jax 0.12.0.1 (Python 3.12), on this
machine, in one run: the Quick start's training and the small benchmark's train steps.

  python tools/compare_jax_versions.py --python /path/venv311/bin/python \\
      --python /path/venv312/bin/python [--steps 300] [--cases train_tiny_128,train_base_128]

Each interpreter is a virtual environment with `pip install -r requirements.txt
-r requirements-peers.txt` (the markers there give each Python its jax). For each, one
after the other (never at once: they would share the cores):
- the Quick start, `python train.py` on the built-in corpus, cut to `--steps` steps with
  no evaluation, probes, plot or progress bar; its own `throughput:` line gives the
  steps/s over synchronised intervals, compile left out;
- `python -m tools.bench --impls ours` on `--cases` (our train step alone, median of 10
  timed steps after a warm-up).
Prints one table with both versions side by side, and the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_RATE = re.compile(r"^throughput: (\d+) steps in ([\d.]+) s: ([\d.]+) steps/s", re.M)


def _versions(python: str) -> str:
  code = ("import sys, jax, flax; print(f'Python {sys.version.split()[0]}, jax "
          "{jax.__version__}, flax {flax.__version__}')")
  return subprocess.run([python, "-c", code], check=True, capture_output=True, text=True,
                        cwd=ROOT).stdout.strip()


def _quickstart(python: str, steps: int, scratch: str) -> float:
  """steps/s of train.py's default run, cut to `steps` steps."""
  workdir = os.path.join(scratch, "run")
  out = subprocess.run(
      [python, "train.py", "--workdir", workdir, f"--config.train.num_steps={steps}",
       f"--config.eval_every={steps}", "--config.probe.tasks=()", "--config.plot=False",
       "--config.progress_bar=False", "--config.compile_cache_dir=",
       f"--config.data.cache_dir={os.path.join(scratch, 'prepared')}"],
      cwd=ROOT, capture_output=True, text=True, check=False)
  found = _RATE.findall(out.stdout)
  if out.returncode != 0 or not found:
    raise SystemExit(f"error: {python} train.py failed (exit {out.returncode}): "
                     f"{out.stderr[-2000:]}")
  return float(found[-1][2])


def _bench(python: str, cases: str, scratch: str) -> dict[str, float]:
  """{case: median step seconds} of our train step, by tools.bench."""
  out_json = os.path.join(scratch, "bench.json")
  proc = subprocess.run([python, "-m", "tools.bench", "--cases", cases, "--impls", "ours",
                         "--dtypes", "float32", "--out", out_json,
                         "--md", os.path.join(scratch, "bench.md")],
                        cwd=ROOT, capture_output=True, text=True, check=False)
  if proc.returncode != 0:
    raise SystemExit(f"error: {python} -m tools.bench failed (exit {proc.returncode}): "
                     f"{proc.stderr[-2000:]}")
  with open(out_json, encoding="utf-8") as f:
    rows = json.load(f)["rows"]
  return {r["case"]: r["median_s"] for r in rows if "median_s" in r}


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--python", action="append", required=True,
                 help="an environment's interpreter (give it once per jax version)")
  p.add_argument("--steps", type=int, default=300, help="Quick start steps to time")
  p.add_argument("--cases", default="train_tiny_128,train_base_128",
                 help="tools.bench train cases")
  args = p.parse_args(argv)
  columns = []
  for python in args.python:
    with tempfile.TemporaryDirectory(prefix="bert_jax-jaxcmp-") as scratch:
      columns.append((_versions(python), _quickstart(python, args.steps, scratch),
                      _bench(python, args.cases, scratch)))
  cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo", encoding="utf-8")
              if l.startswith("model name")), platform.processor())
  print(f"{cpu}, {os.cpu_count()} cores; each environment alone, one after the other\n")
  print("| | " + " | ".join(c[0] for c in columns) + " |")
  print("| --- |" + " --- |" * len(columns))
  print(f"| Quick start (`python train.py`, {args.steps} steps), steps/s | "
        + " | ".join(f"{c[1]:.2f}" for c in columns) + " |")
  for case in args.cases.split(","):
    print(f"| tools.bench {case} (ours, float32), median step ms | "
          + " | ".join(f"{c[2][case] * 1000:.1f}" if case in c[2] else "-" for c in columns)
          + " |")
  return 0


if __name__ == "__main__":
  sys.exit(main())
