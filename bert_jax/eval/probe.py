"""Linear probe of a model's features on a task: how much of the task is linearly readable?

  ex = Extractor.from_checkpoint("runs/tiny")            # or Extractor(params, config, tokenizer)
  probe(ex, tasks.load_task("word_order"))
  -> {"word_order/accuracy": 0.71, "word_order/num_eval": 123.0,
      "word_order/majority_accuracy": 0.504, "C": 1.0, "seconds": 1.2, "num_train": 287}

Features are `Extractor.extract` pooled vectors of each split (several layers
are concatenated); a classification task gets an L2 logistic regression, a
regression task ridge regression (bert_jax.eval.logreg), the penalty picked
on a held-out 20% of train by the task's first metric, then refit on all of
train. The task's metrics (bert_jax.eval.metrics) are reported on each eval
split: `<task>/<metric>`, or `<task>/<split>/<metric>` when there are several
(MNLI's dev_matched and dev_mismatched).

From a training loop, keep one Extractor (its compiled programs are reused)
and hand it the current parameters with `Extractor.set_params` before each probe.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Optional


import numpy as np

from bert_jax.errors import ConfigError, TaskError
from bert_jax.eval import logreg, metrics, tasks
from bert_jax.eval.task_types import REGRESSION, Example, Task
from bert_jax.features.extract import Extractor


# Besides `<task>/<metric>`: how many eval examples, and the majority-class accuracy.
NUM_EVAL, MAJORITY = "num_eval", "majority_accuracy"


def is_metric(key: str) -> bool:
  """A `<task>[/<split>]/<metric>` key of `probe`'s result (not a count or baseline)."""
  return "/" in key and key.rsplit("/", 1)[1] not in (NUM_EVAL, MAJORITY)


def describe_metric(result: dict[str, float], key: str) -> str:
  """A metric as people read it: an accuracy with its binomial standard error and the
  majority class beside it, so a number below the baseline says so."""
  value = result[key]
  prefix = key.rsplit("/", 1)[0]
  n, base = result.get(f"{prefix}/{NUM_EVAL}", 0.0), result.get(f"{prefix}/{MAJORITY}")
  text = f"{value:.4f}"
  if key.endswith("accuracy") and n > 0 and 0 <= value <= 1:
    text += f" ± {math.sqrt(value * (1 - value) / n):.4f}"
    if base is not None:
      text += (f" (majority class {base:.4f}{', below it' if value < base else ''}; "
               f"{int(n)} examples)")
  return text


def describe(result: dict[str, float]) -> str:
  """Every metric of `result` on one line (describe_metric)."""
  return ", ".join(f"{k.replace('/', ' ')} {describe_metric(result, k)}"
                   for k in result if is_metric(k))


def _subset(examples: list[Example], max_examples: Optional[int], seed: int) -> list[Example]:
  """At most `max_examples`, a seeded random subset kept in file order."""
  if not max_examples or len(examples) <= max_examples:
    return examples
  keep = np.sort(np.random.RandomState(seed).permutation(len(examples))[:max_examples])
  return [examples[i] for i in keep]


def _features(extractor: Extractor, examples: Sequence[Example], layers,
              pooling: str) -> np.ndarray:
  f = extractor.extract(tasks.inputs(examples), layers=layers, pooling=pooling, progress=False)
  return f.pooled_NxYxD.reshape(len(examples), -1)  # layers side by side


def probe(extractor: Extractor, task: Task, layers: Sequence[int] | str = (-1,),
          pooling: str = "mean", max_examples: Optional[int] = None,
          seed: int = 0) -> dict[str, float]:
  """The task's metric(s) of a linear probe on `extractor`'s features (module docstring).

  `max_examples` caps each split (a seeded random subset); `seed` also picks
  the held-out part of train that chooses the penalty.
  """
  start = time.perf_counter()
  if pooling == "none":
    raise ConfigError("pooling 'none': a probe needs one vector per example; expected one of "
                      "cls, mean, pooler")
  if max_examples is not None and (not isinstance(max_examples, int) or max_examples < 5):
    raise ConfigError(f"max_examples={max_examples!r}: expected an integer >= 5, or None")
  train = _subset(task.splits.get("train", []), max_examples, seed)
  evals = {s: _subset(task.splits.get(s, []), max_examples, seed) for s in task.eval_splits}
  for split, exs in [("train", train)] + list(evals.items()):
    if len(exs) < (5 if split == "train" else 1):
      raise TaskError(f"task {task.name}: split '{split}' has {len(exs)} examples; expected "
                      f"at least {5 if split == 'train' else 1}")
    if any(e.label is None for e in exs):
      raise TaskError(f"task {task.name}: split '{split}' has unlabelled examples; expected "
                      "labels in train and in the eval splits")
  X_train = _features(extractor, train, layers, pooling)
  X_eval = {s: _features(extractor, exs, layers, pooling) for s, exs in evals.items()}
  y_train = np.array([e.label for e in train])
  primary = task.metric_names[0]
  score = lambda y_true, y_pred: metrics.compute(task, y_pred, y_true)[primary]
  if task.kind == REGRESSION:
    fit = logreg.fit_ridge_probe(X_train, y_train, X_eval, seed=seed, score=score)
    penalty = {"alpha": float(fit.penalty)}
  else:
    fit = logreg.fit_probe(X_train, y_train, X_eval, num_classes=task.num_classes, seed=seed,
                           score=score)
    penalty = {"C": float(fit.penalty)}
  out = {}
  # The best constant guess: train's most common class, scored on each eval split.
  common = int(np.bincount(y_train.astype(np.int64)).argmax()) if task.kind != REGRESSION else None
  for split, exs in evals.items():
    labels = np.array([e.label for e in exs])
    prefix = task.name if len(evals) == 1 else f"{task.name}/{split}"
    for name, value in metrics.compute(task, fit.predictions[split], labels).items():
      out[f"{prefix}/{name}"] = float(value)
    out[f"{prefix}/{NUM_EVAL}"] = float(len(exs))
    if common is not None:
      out[f"{prefix}/{MAJORITY}"] = float(np.mean(labels == common))
  out.update(penalty)
  out["num_train"] = float(len(train))
  out["seconds"] = time.perf_counter() - start
  return out
