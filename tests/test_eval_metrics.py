"""GLUE metrics equal scikit-learn's / scipy's on random inputs."""

import numpy as np
import pytest
import scipy.stats
from sklearn import metrics as skm

from bert_jax.eval import metrics
from bert_jax.eval.tasks import Task


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("num_classes", [2, 3, 5])
def test_classification_metrics_equal_sklearn(seed, num_classes):
  rs = np.random.RandomState(seed)
  n = rs.randint(5, 200)
  y = rs.randint(0, num_classes, n)
  # Predictions correlated with the labels, so the metrics are not all near 0.
  p = np.where(rs.rand(n) < 0.6, y, rs.randint(0, num_classes, n))
  assert metrics.accuracy(y, p) == pytest.approx(skm.accuracy_score(y, p), abs=1e-12)
  assert metrics.matthews_corrcoef(y, p) == pytest.approx(skm.matthews_corrcoef(y, p), abs=1e-12)
  if num_classes == 2:
    assert metrics.f1_binary(y, p) == pytest.approx(skm.f1_score(y, p), abs=1e-12)


def test_degenerate_cases_equal_sklearn_and_stay_finite():
  y = np.array([0, 1, 1, 0])
  for p in (np.zeros(4, int), np.ones(4, int), y):
    assert metrics.matthews_corrcoef(y, p) == pytest.approx(skm.matthews_corrcoef(y, p))
    assert metrics.f1_binary(y, p) == pytest.approx(skm.f1_score(y, p, zero_division=0))
  assert metrics.f1_binary(np.zeros(3), np.zeros(3)) == 0.0
  assert metrics.pearson([1, 2, 3], [5, 5, 5]) == 0.0  # scipy: nan


@pytest.mark.parametrize("seed", range(5))
def test_correlations_equal_scipy_with_ties(seed):
  rs = np.random.RandomState(seed)
  n = rs.randint(3, 300)
  x = rs.normal(size=n)
  y = 0.5 * x + rs.normal(size=n)
  assert metrics.pearson(x, y) == pytest.approx(scipy.stats.pearsonr(x, y)[0], abs=1e-10)
  assert metrics.spearman(x, y) == pytest.approx(scipy.stats.spearmanr(x, y)[0], abs=1e-10)
  # STS-B-like scores: many ties, which take their average rank.
  xt, yt = np.round(x * 2) / 2, rs.randint(0, 6, n).astype(float)
  np.testing.assert_allclose(metrics.rankdata(xt), scipy.stats.rankdata(xt))
  assert metrics.spearman(xt, yt) == pytest.approx(scipy.stats.spearmanr(xt, yt)[0], abs=1e-10)


def _task(name, kind, metric_names):
  return Task(name, kind, ("0", "1") if kind == "classification" else (), {}, metric_names,
              ("dev",))


def test_compute_reports_the_tasks_metrics():
  y, p = np.array([1, 0, 1, 1, 0, 0]), np.array([1, 0, 0, 1, 1, 0])
  assert metrics.compute(_task("mrpc", "classification", ("f1", "accuracy")), p, y) == {
      "f1": pytest.approx(skm.f1_score(y, p)), "accuracy": pytest.approx(4 / 6)}
  assert set(metrics.compute(_task("cola", "classification", ("mcc",)), p, y)) == {"mcc"}
  s = metrics.compute(_task("stsb", "regression", ("pearson", "spearman")),
                      [0.1, 2.5, 4.0, 3.0], [0.0, 2.0, 5.0, 2.5])
  assert s["spearman"] == pytest.approx(1.0) and 0.9 < s["pearson"] < 1.0


def test_mismatched_lengths_are_refused():
  with pytest.raises(ValueError, match="equally long"):
    metrics.accuracy([0, 1], [0])
