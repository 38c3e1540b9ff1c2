"""Linear probes: the JAX logistic regression equals scikit-learn's; ridge; C picked on held-out train."""

import time

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression, Ridge as SkRidge

from bert_jax.eval import logreg


def _problem(seed, n=600, d=20, k=4, noise=2.0, sample=0):
  """Gaussian classes with overlapping means: accuracy well between chance and 1.

  `seed` draws the class means, `sample` the examples (train and test share means).
  """
  means = np.random.RandomState(seed).normal(0, 1, (k, d))
  rs = np.random.RandomState(1000 + 7 * seed + sample)
  y = rs.randint(0, k, n)
  X = means[y] + noise * rs.normal(0, 1, (n, d))
  X[:, 0] = 3.0  # a constant feature: standardisation must not divide by zero
  X[:, 1] *= 50  # badly scaled
  return X, y


@pytest.mark.parametrize("seed", [0, 1])
def test_logreg_accuracy_equals_sklearn_on_the_same_standardized_features(seed):
  X, y = _problem(seed)
  Xt, yt = _problem(seed, sample=1)
  std = logreg.Standardizer.fit(X)
  Cs = [0.001, 0.1, 10.0]
  models = logreg.fit_logreg(std(X), y, Cs, num_classes=4)
  for m in models:
    sk = LogisticRegression(C=m.C, max_iter=10000, tol=1e-8).fit(std(X), y)
    assert m.converged and m.grad_max < logreg.TOL
    for A, b in ((X, y), (Xt, yt)):
      ours = np.mean(m.predict(std(A)) == b)
      theirs = sk.score(std(A), b)
      assert abs(ours - theirs) <= 0.005, (m.C, ours, theirs)
    # The same objective, hence the same coefficients (sklearn's C scaling).
    np.testing.assert_allclose(m.W_DxK, sk.coef_.T, atol=2e-3 * max(1, np.abs(sk.coef_).max()))
  # A weak penalty fits the training set better than a strong one.
  assert np.mean(models[-1].predict(std(X)) == y) > np.mean(models[0].predict(std(X)) == y)


def test_fit_probe_picks_C_on_held_out_train_and_predicts_each_eval_split():
  X, y = _problem(3, n=400, d=60, noise=3.0)
  Xa, ya = _problem(3, n=200, d=60, noise=3.0, sample=1)
  fit = logreg.fit_probe(X, y, {"a": Xa, "b": Xa[:7]}, num_classes=4, seed=0)
  assert set(fit.holdout_scores) == set(logreg.DEFAULT_CS)
  assert fit.holdout_scores[fit.penalty] == max(fit.holdout_scores.values())
  assert fit.predictions["a"].shape == (200,) and fit.predictions["b"].shape == (7,)
  np.testing.assert_array_equal(fit.predictions["b"], fit.predictions["a"][:7])
  # Refit on all of train with the chosen C; features standardized with train statistics.
  std = logreg.Standardizer.fit(X)
  sk = LogisticRegression(C=fit.penalty, max_iter=10000, tol=1e-8).fit(std(X), y)
  assert abs(np.mean(fit.predictions["a"] == ya) - sk.score(std(Xa), ya)) <= 0.005
  assert np.mean(fit.predictions["a"] == ya) > 0.5  # chance is 0.25
  # Seeded: the same split and choice again.
  again = logreg.fit_probe(X, y, Xa, num_classes=4, seed=0)
  np.testing.assert_array_equal(again.predictions, fit.predictions["a"])


def test_ridge_equals_sklearn_and_probe_picks_alpha():
  rs = np.random.RandomState(0)
  X = rs.normal(size=(300, 10))
  y = X @ rs.normal(size=10) + 0.5 * rs.normal(size=300) + 2.0
  for alpha in (0.01, 1.0):
    ours = logreg.fit_ridge(X, y, alpha)
    sk = SkRidge(alpha=alpha * len(y)).fit(X, y)  # sklearn's alpha multiplies the summed loss
    np.testing.assert_allclose(ours.w_D, sk.coef_, atol=1e-8)
    assert ours.b == pytest.approx(sk.intercept_)
  fit = logreg.fit_ridge_probe(X, y, X[:5])
  assert fit.penalty in logreg.DEFAULT_ALPHAS
  assert np.corrcoef(fit.predictions, y[:5])[0, 1] > 0.9
