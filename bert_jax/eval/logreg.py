"""Linear probes: L2-regularised multinomial logistic regression fitted on device, and ridge.

`fit_logreg` minimises scikit-learn's LogisticRegression objective (lbfgs,
multinomial, intercept not penalised), divided by the number of examples N:

  mean_i CE(softmax(x_i W + b), y_i) + ||W||^2 / (2 C N)

so C means what it means in scikit-learn (it multiplies the summed loss).
Full batch, optax.lbfgs with its zoom line search, in one jitted
lax.while_loop that stops when the largest absolute gradient entry is below
`tol` (scikit-learn's convergence test) or after `max_iter` steps. A grid of C
values is fitted at once (vmapped: one compiled program per data shape).

`fit_probe` standardises features (train statistics), picks C from a grid on
a seeded 20% held-out part of train, refits on all of train and predicts the
eval sets. `fit_ridge_probe` does the same for regression targets with
closed-form ridge regression (numpy float64), its penalty picked the same way.

Shape legend: N examples, D features, K classes, G grid values.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Union

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.tree_utils as otu

DEFAULT_CS = tuple(10.0 ** k for k in range(-3, 4))  # 0.001 ... 1000
DEFAULT_ALPHAS = tuple(10.0 ** k for k in range(-3, 4))  # ridge penalty per example
MAX_ITER = 1000
TOL = 1e-5  # on max |gradient| of the per-example objective above

Arrays = Union[np.ndarray, Mapping[str, np.ndarray]]


@dataclasses.dataclass(frozen=True)
class Standardizer:
  """Zero mean, unit variance per feature, with the fitting set's statistics."""
  mean_D: np.ndarray
  scale_D: np.ndarray

  @classmethod
  def fit(cls, X_NxD: np.ndarray) -> Standardizer:
    X = np.asarray(X_NxD, np.float64)
    std = X.std(axis=0)
    # Constant features stay constant (0) rather than dividing by zero.
    return cls(X.mean(axis=0), np.where(std > 1e-12, std, 1.0))

  def __call__(self, X_NxD: np.ndarray) -> np.ndarray:
    return ((np.asarray(X_NxD, np.float64) - self.mean_D) / self.scale_D).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class LogReg:
  W_DxK: np.ndarray
  b_K: np.ndarray
  C: float
  iterations: int
  grad_max: float  # largest |gradient| entry at the end
  converged: bool  # stopped by the gradient test, not by max_iter

  def logits(self, X_NxD: np.ndarray) -> np.ndarray:
    return np.asarray(X_NxD, np.float32) @ self.W_DxK + self.b_K

  def predict(self, X_NxD: np.ndarray) -> np.ndarray:
    return self.logits(X_NxD).argmax(axis=1)


def _objective(params, X_NxD, y_N, l2):
  W_DxK, b_K = params
  logits_NxK = X_NxD @ W_DxK + b_K
  ce_N = jax.nn.logsumexp(logits_NxK, axis=1) - jnp.take_along_axis(
      logits_NxK, y_N[:, None], axis=1)[:, 0]
  return ce_N.mean() + 0.5 * l2 * jnp.sum(W_DxK * W_DxK)


@functools.partial(jax.jit, static_argnames=("num_classes", "max_iter"))
def _fit_grid(X_NxD, y_N, l2_G, tol, *, num_classes: int, max_iter: int):
  """(W_GxDxK, b_GxK, iterations_G, grad_max_G) for each penalty in l2_G."""
  D = X_NxD.shape[1]
  opt = optax.lbfgs()  # zoom line search by default

  def fit_one(l2):
    loss = lambda p: _objective(p, X_NxD, y_N, l2)
    value_and_grad = optax.value_and_grad_from_state(loss)

    def step(carry):
      params, state = carry
      value, grad = value_and_grad(params, state=state)
      updates, state = opt.update(grad, state, params, value=value, grad=grad, value_fn=loss)
      return optax.apply_updates(params, updates), state

    def grad_max(state):
      g = otu.tree_get(state, "grad")
      return jnp.maximum(jnp.abs(g[0]).max(), jnp.abs(g[1]).max())

    def keep_going(carry):
      _, state = carry
      k = otu.tree_get(state, "count")
      return (k == 0) | ((k < max_iter) & (grad_max(state) >= tol))

    params = (jnp.zeros((D, num_classes), jnp.float32), jnp.zeros((num_classes,), jnp.float32))
    params, state = jax.lax.while_loop(keep_going, step, (params, opt.init(params)))
    # The state's gradient is of the previous iterate: report the final one's.
    g = jax.grad(loss)(params)
    return (params[0], params[1], otu.tree_get(state, "count"),
            jnp.maximum(jnp.abs(g[0]).max(), jnp.abs(g[1]).max()))

  return jax.vmap(fit_one)(l2_G)


def fit_logreg(X_NxD: np.ndarray, y_N: np.ndarray, Cs: Sequence[float], num_classes: int,
               max_iter: int = MAX_ITER, tol: float = TOL) -> list[LogReg]:
  """One model per C in `Cs`, fitted together on the default device (X as given)."""
  X = jnp.asarray(X_NxD, jnp.float32)
  y = jnp.asarray(y_N, jnp.int32)
  l2_G = jnp.asarray([1.0 / (C * len(y_N)) for C in Cs], jnp.float32)
  W, b, its, gmax = jax.device_get(_fit_grid(X, y, l2_G, jnp.float32(tol),
                                             num_classes=num_classes, max_iter=max_iter))
  return [LogReg(np.asarray(W[g]), np.asarray(b[g]), float(C), int(its[g]), float(gmax[g]),
                 bool(its[g] < max_iter)) for g, C in enumerate(Cs)]


def _accuracy(y_true, y_pred) -> float:
  return float(np.mean(np.asarray(y_true) == np.asarray(y_pred)))


def _holdout_split(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
  perm = np.random.RandomState(seed).permutation(n)
  n_hold = max(1, int(round(n * fraction)))
  if n - n_hold < 2:
    raise ValueError(f"{n} training examples are too few to hold out {fraction:.0%} of them")
  return perm[n_hold:], perm[:n_hold]


@dataclasses.dataclass
class ProbeFit:
  predictions: Arrays  # like eval_X: class ids (logreg) or floats (ridge)
  penalty: float  # the chosen C (logreg) or alpha (ridge)
  holdout_scores: dict[float, float]  # penalty -> score on the held-out part of train
  model: object  # LogReg or Ridge, fitted on all of train (standardized features)
  standardizer: Standardizer


def _map(eval_X: Arrays, fn) -> Arrays:
  if isinstance(eval_X, Mapping):
    return {k: fn(v) for k, v in eval_X.items()}
  return fn(eval_X)


def fit_probe(train_X: np.ndarray, train_y: np.ndarray, eval_X: Arrays, *,
              num_classes: int | None = None, Cs: Sequence[float] = DEFAULT_CS,
              holdout: float = 0.2, seed: int = 0,
              score: Callable[[np.ndarray, np.ndarray], float] = _accuracy,
              max_iter: int = MAX_ITER, tol: float = TOL) -> ProbeFit:
  """Logistic-regression probe: C picked on a held-out part of train, then refit on all of it.

  `eval_X` is one array or a {split: array} mapping; predictions come back alike.
  `score(y_true, y_pred)` ranks the C values (accuracy by default; ties: the smaller C).
  """
  train_X = np.asarray(train_X)
  train_y = np.asarray(train_y).astype(np.int64)
  K = int(num_classes if num_classes is not None else train_y.max() + 1)
  fit_idx, hold_idx = _holdout_split(len(train_y), holdout, seed)
  std = Standardizer.fit(train_X[fit_idx])
  models = fit_logreg(std(train_X[fit_idx]), train_y[fit_idx], Cs, K, max_iter, tol)
  X_hold = std(train_X[hold_idx])
  scores = {m.C: score(train_y[hold_idx], m.predict(X_hold)) for m in models}
  best = max(Cs, key=lambda C: (scores[C], -C))
  std = Standardizer.fit(train_X)
  (model,) = fit_logreg(std(train_X), train_y, [best], K, max_iter, tol)
  return ProbeFit(_map(eval_X, lambda X: model.predict(std(X))), best, scores, model, std)


# ----------------------------------------------------------------------------
# Ridge regression (regression tasks)


@dataclasses.dataclass(frozen=True)
class Ridge:
  w_D: np.ndarray
  b: float
  alpha: float

  def predict(self, X_NxD: np.ndarray) -> np.ndarray:
    return np.asarray(X_NxD, np.float64) @ self.w_D + self.b


def fit_ridge(X_NxD: np.ndarray, y_N: np.ndarray, alpha: float) -> Ridge:
  """argmin_w,b mean((Xw + b - y)^2) + alpha ||w||^2, closed form (b not penalised)."""
  X = np.asarray(X_NxD, np.float64)
  y = np.asarray(y_N, np.float64)
  mu, y_mu = X.mean(axis=0), y.mean()
  Xc = X - mu
  N, D = X.shape
  w = np.linalg.solve(Xc.T @ Xc + alpha * N * np.eye(D), Xc.T @ (y - y_mu))
  return Ridge(w, float(y_mu - mu @ w), alpha)


def _pearson(y_true, y_pred) -> float:
  a = np.asarray(y_true, np.float64) - np.mean(y_true)
  b = np.asarray(y_pred, np.float64) - np.mean(y_pred)
  d = np.sqrt((a @ a) * (b @ b))
  return float(a @ b / d) if d > 0 else 0.0


def fit_ridge_probe(train_X: np.ndarray, train_y: np.ndarray, eval_X: Arrays, *,
                    alphas: Sequence[float] = DEFAULT_ALPHAS, holdout: float = 0.2,
                    seed: int = 0,
                    score: Callable[[np.ndarray, np.ndarray], float] = _pearson) -> ProbeFit:
  """Ridge probe for float targets: alpha picked on held-out train (Pearson), refit on all."""
  train_X = np.asarray(train_X)
  train_y = np.asarray(train_y, np.float64)
  fit_idx, hold_idx = _holdout_split(len(train_y), holdout, seed)
  std = Standardizer.fit(train_X[fit_idx])
  X_fit, X_hold = std(train_X[fit_idx]), std(train_X[hold_idx])
  scores = {a: score(train_y[hold_idx], fit_ridge(X_fit, train_y[fit_idx], a).predict(X_hold))
            for a in alphas}
  best = max(alphas, key=lambda a: (scores[a], a))  # ties: the stronger penalty
  std = Standardizer.fit(train_X)
  model = fit_ridge(std(train_X), train_y, best)
  return ProbeFit(_map(eval_X, lambda X: model.predict(std(X))), best, scores, model, std)
