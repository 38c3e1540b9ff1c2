"""GLUE's metrics, numpy only: accuracy, binary F1, Matthews correlation, Pearson, Spearman.

`compute(task, predictions, labels)` returns the task's metric(s) by
`Task.metric_names` ("mcc" for CoLA, "f1" and "accuracy" for MRPC/QQP,
"pearson" and "spearman" for STS-B and other regressions, else "accuracy").
Each function equals scikit-learn's / scipy's (tests/test_eval_metrics.py);
degenerate inputs (a constant prediction or label) give 0.0 where those
libraries give 0.0 or nan, so a logged curve never holds nan.
"""

from __future__ import annotations

import numpy as np

from bert_jax.eval.task_types import Task


def _pair(y_true, y_pred) -> tuple[np.ndarray, np.ndarray]:
  a, b = np.asarray(y_true).reshape(-1), np.asarray(y_pred).reshape(-1)
  if a.shape != b.shape or a.size == 0:
    raise ValueError(f"expected two equally long, non-empty 1-D arrays; got {a.shape}, {b.shape}")
  return a, b


def accuracy(y_true, y_pred) -> float:
  a, b = _pair(y_true, y_pred)
  return float(np.mean(a == b))


def f1_binary(y_true, y_pred, positive: int = 1) -> float:
  """F1 of class `positive` (GLUE's MRPC/QQP: class 1); 0.0 with no true or predicted positive."""
  a, b = _pair(y_true, y_pred)
  tp = float(np.sum((a == positive) & (b == positive)))
  denom = float(np.sum(a == positive) + np.sum(b == positive))
  return 2 * tp / denom if denom else 0.0


def matthews_corrcoef(y_true, y_pred) -> float:
  """Multi-class Matthews correlation (Gorodkin's R_K, as scikit-learn computes it)."""
  a, b = _pair(y_true, y_pred)
  classes, both = np.unique(np.concatenate([a, b]), return_inverse=True)
  ia, ib = both[:a.size], both[a.size:]
  K = len(classes)
  C_KxK = np.zeros((K, K), np.float64)
  np.add.at(C_KxK, (ia, ib), 1.0)
  t_K, p_K = C_KxK.sum(axis=1), C_KxK.sum(axis=0)  # true / predicted counts per class
  n, c = C_KxK.sum(), np.trace(C_KxK)
  cov_ytyp = c * n - t_K @ p_K
  cov_ypyp = n * n - p_K @ p_K
  cov_ytyt = n * n - t_K @ t_K
  if cov_ypyp * cov_ytyt == 0:
    return 0.0
  return float(cov_ytyp / np.sqrt(cov_ytyt * cov_ypyp))


def pearson(x, y) -> float:
  a, b = _pair(x, y)
  a, b = a.astype(np.float64) - a.mean(), b.astype(np.float64) - b.mean()
  denom = np.sqrt((a @ a) * (b @ b))
  return float(a @ b / denom) if denom > 0 else 0.0


def rankdata(x) -> np.ndarray:
  """Ranks 1..n, ties sharing their average rank (scipy.stats.rankdata's 'average')."""
  x = np.asarray(x).reshape(-1)
  order = np.argsort(x, kind="stable")
  sorted_x = x[order]
  # Start of each run of equal values, and the average of ranks start+1..end.
  new_run = np.concatenate([[True], sorted_x[1:] != sorted_x[:-1]])
  starts = np.flatnonzero(new_run)
  ends = np.concatenate([starts[1:], [x.size]])
  avg = (starts + 1 + ends) / 2.0
  ranks = np.empty(x.size, np.float64)
  ranks[order] = np.repeat(avg, ends - starts)
  return ranks


def spearman(x, y) -> float:
  a, b = _pair(x, y)
  return pearson(rankdata(a), rankdata(b))


_METRICS = {"accuracy": accuracy, "f1": f1_binary, "mcc": matthews_corrcoef,
            "pearson": pearson, "spearman": spearman}


def compute(task: Task, predictions, labels) -> dict[str, float]:
  """{metric name: value} for `task.metric_names`: class ids, or floats for regression."""
  preds, labels = _pair(predictions, labels)
  out = {}
  for name in task.metric_names:
    if name not in _METRICS:
      raise ValueError(f"unknown metric {name!r}; expected one of {', '.join(_METRICS)}")
    # (y_true, y_pred): scikit-learn's argument order.
    out[name] = _METRICS[name](labels, preds)
  return out
