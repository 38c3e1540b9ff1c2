"""The shipped probe task on a checkpoint next to the same architecture with random weights.

  python tools/measure_probe.py --checkpoint runs/tiny
  python tools/measure_probe.py --checkpoint runs/minilm --random_seeds 3 --json probe.json
  python tools/measure_probe.py --checkpoint runs/tiny --checkpoint runs/minilm --readme

`--checkpoint` may be given several times (one table, each checkpoint followed by its
random-weight copies); `--readme` also writes the table between the
`<!-- probe:start -->` / `<!-- probe:end -->` markers of README.md, with the date and
the machine.

Restores the checkpoint's params (any bert-jax checkpoint: trained by train.py
or imported by `bert_jax.io.convert from-hf`), then builds the same model config
with freshly initialised weights (the model's own initialisation, one per
`--random_seeds` seed) and the same vocabulary, and runs the same linear
probe (bert_jax.eval.probe: mean-pooled last layer by default, L2 logistic
regression with C picked on held-out train) on each. Prints a Markdown table
of dev accuracy ± its standard error (sqrt(p(1 - p) / n)) beside the
majority-class baseline, so the README's numbers come from this script.

The default task is `word_order` (bert_jax.eval.word_order): bigram shift,
which the words alone cannot solve; random weights sit near 0.5 on it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402  (run as a script: the repo root first)

from bert_jax.errors import BertJaxError  # noqa: E402
from bert_jax.eval import probe, tasks  # noqa: E402
from bert_jax.features.extract import Extractor  # noqa: E402
from bert_jax.commands import common  # noqa: E402
from bert_jax.model.build import init_params  # noqa: E402
from tools import readme_block  # noqa: E402
from tools.measure_quickstart import cpu_name  # noqa: E402

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def _stderr(p: float, n: int) -> float:
  return math.sqrt(max(p * (1 - p), 0.0) / n)


def measure(checkpoint: str, task_spec: str = "word_order", layers=(-1,), pooling: str = "mean",
            random_seeds: int = 1, seed: int = 0, data_dir=None) -> dict:
  """Probe results of the checkpoint and of `random_seeds` random-weight copies."""
  task = tasks.load_task(task_spec, data_dir=data_dir)
  ex = Extractor.from_checkpoint(checkpoint)
  rows = [{"model": f"{checkpoint}", **probe.probe(ex, task, layers, pooling, seed=seed)}]
  for s in range(random_seeds):
    params = jax.device_get(init_params(ex.config, jax.random.key(s)))["bert"]
    rand = Extractor(params, ex.config, ex.tokenizer)
    rows.append({"model": f"same architecture, random weights (init seed {s})",
                 **probe.probe(rand, task, layers, pooling, seed=seed)})
  dev = {s: task.splits[s] for s in task.eval_splits}
  majority = {}
  if task.kind == "classification":
    for s, exs in dev.items():
      majority[s] = Counter(e.label for e in exs).most_common(1)[0][1] / len(exs)
  return {"task": task.name, "metric_names": list(task.metric_names), "layers": list(layers),
          "pooling": pooling, "num_dev": {s: len(v) for s, v in dev.items()},
          "majority": majority, "rows": rows}


def markdown(result: dict) -> str:
  keys = [k for k in result["rows"][0] if "/" in k]
  # "<task>/<metric>" (one eval split) or "<task>/<split>/<metric>".
  split_of = lambda k: k.split("/")[1] if k.count("/") == 2 else next(iter(result["num_dev"]))
  lines = ["| model | " + " | ".join(keys) + " |", "| --- |" + " --- |" * len(keys)]
  for r in result["rows"]:
    cells = []
    for k in keys:
      n = result["num_dev"][split_of(k)]
      cells.append(f"{r[k]:.3f} ± {_stderr(r[k], n):.3f}" if k.endswith("accuracy")
                   else f"{r[k]:.3f}")
    lines.append(f"| {r['model']} | " + " | ".join(cells) + " |")
  if result["majority"]:
    lines.append("| majority class | " + " | ".join(
        f"{result['majority'][split_of(k)]:.3f}" if k.endswith("accuracy") else ""
        for k in keys) + " |")
  n = ", ".join(f"{s} {v}" for s, v in result["num_dev"].items())
  lines.append("")
  lines.append(f"Linear probe of `{result['task']}` ({n} examples), {result['pooling']}-pooled "
               f"layers {result['layers']}; ± is the standard error sqrt(p(1 - p) / n). "
               "Written by `python tools/measure_probe.py`.")
  return "\n".join(lines)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--checkpoint", required=True, action="append",
                 help="a bert-jax workdir or checkpoint folder (may be repeated)")
  p.add_argument("--task", default="word_order",
                 help="any bert_jax.probe task (default word_order)")
  p.add_argument("--layers", default="-1")
  p.add_argument("--pooling", default="mean")
  p.add_argument("--random_seeds", type=int, default=1,
                 help="random-weight copies to probe (different initialisations)")
  p.add_argument("--seed", type=int, default=0, help="the probe's held-out split")
  p.add_argument("--data_dir", default=None)
  p.add_argument("--json", default=None, help="also write the results here")
  p.add_argument("--readme", action="store_true", help="rewrite the probe block of README.md")
  args = p.parse_args(common.join_negative_values(list(sys.argv[1:] if argv is None else argv)))
  try:
    if args.readme:
      readme_block.check(README, "probe")  # before the long run, not after
    results = [measure(c, args.task, common.parse_layers(args.layers), args.pooling,
                       args.random_seeds, args.seed, args.data_dir) for c in args.checkpoint]
  except BertJaxError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  result = {**results[0], "rows": [r for res in results for r in res["rows"]]}
  table = markdown(result)
  print(table)
  if args.readme:
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    readme_block.rewrite(README, "probe", f"**Measured** on {cpu_name()} ({os.cpu_count()} "
                         f"cores), {when}: `python tools/measure_probe.py "
                         + " ".join(f"--checkpoint {c}" for c in args.checkpoint)
                         + f" --random_seeds {args.random_seeds} --readme`.\n\n" + table)
    print(f"rewrote the probe block of {README}", file=sys.stderr)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(result, f, indent=2)
  return 0


if __name__ == "__main__":
  sys.exit(main())
