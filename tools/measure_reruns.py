"""How far apart two fresh Quick start runs land: the noise a user must see through.

  python tools/measure_reruns.py --runs 4            # prints the README block
  python tools/measure_reruns.py --runs 4 --readme   # ... and rewrites it in README.md
  python tools/measure_reruns.py --runs 2 --steps 40 # a quick check (the block says so)

Runs `python train.py` (the tiny config on the built-in corpus) `--runs` times, each
in a fresh workdir with its own prepared data (so each trains its WordPiece vocabulary
afresh), exactly as a new user reruns the Quick start. The block between
`<!-- reruns:start -->` and `<!-- reruns:end -->` lists each run's final held-out
accuracies with their standard errors and the largest difference between any two runs.
Before `Tokenizer.train` was made deterministic, each run learned a slightly different
vocabulary, and this measured how far the training itself moves the accuracies.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bert_jax.errors import BertJaxError  # noqa: E402  (run as a script: the repo root first)
from tools import measure_quickstart as mq  # noqa: E402
from tools import readme_block  # noqa: E402

BLOCK = "reruns"
START, END = readme_block.markers(BLOCK)
METRICS = (("MLM", "mlm_accuracy"), ("NSP", "nsp_accuracy"))


def spread(values: list[float]) -> float:
  """The largest difference between any two of `values`."""
  return max(values) - min(values)


def markdown(evals: list[dict], steps: int, date: datetime.datetime) -> str:
  """The README block (markers included) for the final eval rows of the runs."""
  return readme_block.wrap(BLOCK, body(evals, steps, date))


def body(evals: list[dict], steps: int, date: datetime.datetime) -> str:
  """The text between the block's markers for the final eval rows of the runs."""
  quick = ("" if steps == mq.DEFAULT_STEPS else
           f" *A quick check of {steps} steps, not the Quick start's {mq.DEFAULT_STEPS}.*")
  examples = sorted({int(e["nsp_count"]) for e in evals if "nsp_count" in e})
  rows = ["| run | held-out MLM accuracy | held-out NSP accuracy |", "| --- | --- | --- |"]
  for i, e in enumerate(evals, 1):
    rows.append(f"| {i} | " + " | ".join(
        f"{e[k]:.3f} ± {e.get(k + '_stderr', float('nan')):.3f}" for _, k in METRICS) + " |")
  rows.append("| largest difference | " + " | ".join(
      f"{spread([e[k] for e in evals]):.3f}" for _, k in METRICS) + " |")
  return "\n".join([
      f"**Reruns**: `python train.py` {len(evals)} times, each in a fresh workdir (so each "
      f"trains its vocabulary afresh), on {mq.cpu_name()} ({os.cpu_count()} cores), "
      f"{date:%Y-%m-%d %H:%M} UTC; eval split of "
      f"{', '.join(map(str, examples)) or '?'} examples. Written by "
      f"`python tools/measure_reruns.py --runs {len(evals)} --readme`.{quick}",
      "",
      *rows])


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--runs", type=int, default=4, help="fresh runs (default 4)")
  p.add_argument("--steps", type=int, default=mq.DEFAULT_STEPS,
                 help=f"training steps (default {mq.DEFAULT_STEPS}, the Quick start's)")
  p.add_argument("--readme", action="store_true", help="rewrite the block in README.md")
  args = p.parse_args(argv)
  if args.runs < 2:
    raise SystemExit(f"error: --runs={args.runs}: expected at least 2 runs to compare")
  try:
    return _measure(args)
  except (BertJaxError, OSError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2


def _measure(args: argparse.Namespace) -> int:
  if args.readme:  # fail before the (long) runs, not after them
    readme_block.check(mq.README, BLOCK)
  evals = []
  for i in range(args.runs):
    workdir = tempfile.mkdtemp(prefix=f"measure_reruns_{i}_")
    try:
      ev = mq.run_quickstart(args.steps, workdir)["eval"]
    finally:
      shutil.rmtree(workdir, ignore_errors=True)
    evals.append(ev)
    print(f"run {i + 1}: " + ", ".join(f"{name} {ev[k]:.4f} ± {ev.get(k + '_stderr', 0):.4f}"
                                       for name, k in METRICS), file=sys.stderr)
  text = body(evals, args.steps, datetime.datetime.now(datetime.timezone.utc))
  print(readme_block.wrap(BLOCK, text))
  if args.readme:
    readme_block.rewrite(mq.README, BLOCK, text)
    print(f"rewrote the block in {mq.README}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
