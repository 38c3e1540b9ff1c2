"""Fine-tuning results: one row per (learning rate, seed), the median over seeds, the table.

What MosaicBERT and Cramming report: every run, and the median over seeds of
the best learning rate.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from bert_jax.eval import tasks as tasks_lib

RESULTS_FILE = "results.json"


@dataclasses.dataclass
class RunResult:
  learning_rate: float
  seed: int
  metrics: dict  # {eval split: {metric: value}} after the last epoch
  per_epoch: list  # [{eval split: {metric: value}}] after each epoch
  train_loss: float  # mean over the last epoch's steps (skipped steps left out)
  steps: int
  skipped_steps: int  # non-finite loss or gradient (optim.skip_nonfinite)
  seconds: float

  def to_json(self) -> dict:
    return dataclasses.asdict(self)


def median(values: Sequence[float]) -> float:
  return float(np.median(np.asarray(values, np.float64)))


def summarize(task: tasks_lib.Task, runs: Sequence[RunResult]) -> dict:
  """Medians over seeds per learning rate; the best learning rate and the best run.

  Selection is by the task's first metric on its first eval split (MNLI:
  matched accuracy), the median over seeds for the learning rate.
  """
  split, metric = task.eval_splits[0], task.metric_names[0]
  by_lr: dict[float, list[RunResult]] = {}
  for r in runs:
    by_lr.setdefault(r.learning_rate, []).append(r)
  medians = {lr: {s: {m: median([r.metrics[s][m] for r in rs]) for m in task.metric_names}
                  for s in task.eval_splits} for lr, rs in by_lr.items()}
  # NaN (e.g. a correlation of constant predictions) never wins.
  score = lambda v: v if math.isfinite(v) else -math.inf
  best_lr = max(medians, key=lambda lr: score(medians[lr][split][metric]))
  best_run = max(runs, key=lambda r: score(r.metrics[split][metric]))
  return {"selection": {"split": split, "metric": metric},
          "median_by_learning_rate": [{"learning_rate": lr, "metrics": m,
                                       "seeds": [r.seed for r in by_lr[lr]]}
                                      for lr, m in medians.items()],
          "best_learning_rate": best_lr, "best": medians[best_lr],
          "best_run": {"learning_rate": best_run.learning_rate, "seed": best_run.seed,
                       "metrics": best_run.metrics}}


def majority_accuracy(task: tasks_lib.Task) -> dict[str, float]:
  """{eval split: accuracy of always answering train's most common class}: the best
  constant guess (classification only)."""
  if task.kind != tasks_lib.CLASSIFICATION:
    return {}
  labels = [e.label for e in task.splits["train"]]
  common = max(set(labels), key=labels.count)
  return {n: float(np.mean([e.label == common for e in task.splits[n]]))
          for n in task.eval_splits}


def format_table(results: dict) -> str:
  """The console report: every run, the medians per learning rate, the best."""
  splits, names = results["eval_splits"], results["metric_names"]
  cols = [(s, m) for s in splits for m in names]
  head = [f"{s} {m}" if len(splits) > 1 or s != "dev" else m for s, m in cols]
  width = [max(9, len(h)) for h in head]
  fmt = lambda values: "  ".join(f"{v:>{w}.4f}" for v, w in zip(values, width))
  lines = [f"{'lr':>8}  {'seed':>4}  {'train loss':>10}  " + "  ".join(
      f"{h:>{w}}" for h, w in zip(head, width))]
  for r in results["runs"]:
    lines.append(f"{r['learning_rate']:>8.1e}  {r['seed']:>4}  {r['train_loss']:>10.4f}  "
                 + fmt([r["metrics"][s][m] for s, m in cols]))
  summary = results["summary"]
  for row in summary["median_by_learning_rate"]:
    lines.append(f"{row['learning_rate']:>8.1e}  {'med':>4}  {'':>10}  "
                 + fmt([row["metrics"][s][m] for s, m in cols]))
  sel = summary["selection"]
  best = summary["best"]
  lines.append(
      f"best learning rate {summary['best_learning_rate']:g} (by the median of "
      f"{sel['split']} {sel['metric']} over {len(results['recipe']['seeds'])} seed(s)): "
      + ", ".join(f"{s} {m} {_with_baseline(results, s, m, best[s][m])}" for s, m in cols))
  return "\n".join(lines)


def _with_baseline(results: dict, split: str, metric: str, value: float) -> str:
  """An accuracy with its binomial standard error and the majority class beside it, and
  a word when it is not above that (the answer to "is my model any good?")."""
  n = results.get("num_examples", {}).get(split, 0)
  base = results.get("majority_accuracy", {}).get(split)
  if metric != "accuracy" or not n or not 0 <= value <= 1:
    return f"{value:.4f}"
  text = f"{value:.4f} ± {math.sqrt(value * (1 - value) / n):.4f}"
  if base is not None:
    verdict = "; not above it" if value <= base else ""
    text += f" (majority class {base:.4f}{verdict})"
  return text


def run_name(lr: float, seed: int) -> str:
  return f"lr{lr:g}_seed{seed}"
