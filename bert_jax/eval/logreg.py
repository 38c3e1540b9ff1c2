"""Linear probes: L2-regularised multinomial logistic regression fitted on device, and ridge.

`fit_logreg` minimises scikit-learn's LogisticRegression objective (lbfgs,
multinomial, intercept not penalised), divided by the number of examples N:

  mean_i CE(softmax(x_i W + b), y_i) + ||W||^2 / (2 C N)

so C means what it means in scikit-learn (it multiplies the summed loss).
Full batch, float32, in one jitted lax.while_loop per penalty that stops when
the largest absolute gradient entry is below `tol` (scikit-learn's convergence
test; TOL = 1e-5, checked on the final iterate and reported as `grad_max`) or
after `max_iter` steps. Up to NEWTON_MAX_PARAMS parameters ((D+1)*K) the steps
are Newton's (exact Hessian, Cholesky, Levenberg-Marquardt damping, Armijo
backtracking): a handful of iterations per penalty even on separable data.
Larger problems use optax.lbfgs. A grid of C values is fitted from the
strongest penalty to the weakest, each fit starting from the previous one.

`fit_probe` standardises features (train statistics), picks C from a grid on
a seeded 20% held-out part of train, refits on all of train and predicts the
eval sets; the held-out rows stay in the first fit with weight 0, so both fits
run the same compiled program. `fit_ridge_probe` does the same for regression
targets with closed-form ridge regression (numpy float64), its penalty picked
the same way.

Shape legend: N examples, D features, K classes, G grid values.
"""

from __future__ import annotations

import contextlib
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
# Newton's method when the (D+1)*K parameters' Hessian is at most this wide (its
# Cholesky costs P^3/3 flops, forming it N*P^2); L-BFGS above it.
NEWTON_MAX_PARAMS = 2560
_LINE_SEARCH_STEPS = 24  # Newton's step sizes 1, 1/2, ... 2^-23
_ARMIJO = 1e-4  # sufficient-decrease constant of the line search
# Newton's Hessian gets damp * diag(H) added to its diagonal (Levenberg-Marquardt):
# at least _DAMP_MIN (float32 rounding), raised 100x whenever the factorisation fails,
# lowered 10x after each step; past _DAMP_MAX the fit gives up (it is then a gradient step).
_DAMP_MIN = 1e-6
_DAMP_MAX = 1e6

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
  converged: bool  # grad_max < tol (not stopped by max_iter or float32's limits)

  def logits(self, X_NxD: np.ndarray) -> np.ndarray:
    return np.asarray(X_NxD, np.float32) @ self.W_DxK + self.b_K

  def predict(self, X_NxD: np.ndarray) -> np.ndarray:
    return self.logits(X_NxD).argmax(axis=1)


def _objective(Wb_D1xK, X_NxD1, c_N, y_N, l2):
  """Weighted mean cross-entropy plus the L2 term; the last row of Wb (the bias) is free."""
  logits_NxK = X_NxD1 @ Wb_D1xK
  ce_N = jax.nn.logsumexp(logits_NxK, axis=1) - jnp.take_along_axis(
      logits_NxK, y_N[:, None], axis=1)[:, 0]
  W_DxK = Wb_D1xK[:-1]
  return c_N @ ce_N + 0.5 * l2 * jnp.sum(W_DxK * W_DxK)


def _grad_max(g):
  return jnp.abs(g).max()


# long: one traced while_loop (gradient, Hessian, damped Cholesky, vectorised line search) whose parts share its carry
def _newton(X_NxD1, c_N, y_N, l2, tol, Wb0_D1xK, max_iter: int):
  """Newton's method with an exact Hessian (Cholesky) and a backtracking line search.

  One lax.while_loop; the line search tries the steps 1, 1/2, ... 2^-(S-1) all at
  once (each costs only N*K work given Z = X @ direction) and takes the largest
  one meeting Armijo's condition. The loss differences are computed directly
  (log1p/expm1 of the change), not as f(new) - f(old), so that float32 can still
  see the tiny decreases of the last, quadratically converging steps.
  """
  N, D1 = X_NxD1.shape
  K = Wb0_D1xK.shape[1]
  P = D1 * K
  Y_NxK = jax.nn.one_hot(y_N, K, dtype=X_NxD1.dtype)
  # The L2 term covers the weights, not the bias row.
  pen_D1 = jnp.ones((D1,), X_NxD1.dtype).at[-1].set(0.0)
  ts_S = 0.5 ** jnp.arange(_LINE_SEARCH_STEPS, dtype=X_NxD1.dtype)

  def grad(Wb, P_NxK):
    return X_NxD1.T @ (c_N[:, None] * (P_NxK - Y_NxK)) + l2 * pen_D1[:, None] * Wb

  def probs(Wb):
    return jax.nn.softmax(X_NxD1 @ Wb, axis=1)

  def hessian(P_NxK):
    """(K*D1, K*D1), class-major: block (k, l) = X^T diag(c (p_k [k=l] - p_k p_l)) X."""
    rows = []
    for k in range(K):
      row = []
      for l in range(K):
        a_N = c_N * (P_NxK[:, k] * ((k == l) - P_NxK[:, l]))
        row.append(X_NxD1.T @ (a_N[:, None] * X_NxD1))
      rows.append(jnp.concatenate(row, axis=1))
    H = jnp.concatenate(rows, axis=0)
    diag = jnp.tile(l2 * pen_D1, K)
    # Adding the same constant to every class's bias changes nothing (the bias is not
    # penalised): the Hessian is singular along that direction. Penalising it in the
    # Hessian only makes it positive definite; the gradient is orthogonal to that
    # direction (its bias part sums to 0 over classes), so the step is the same as
    # the pseudo-inverse's and the bias keeps summing to what it started at.
    bias_idx = jnp.arange(K) * D1 + D1 - 1
    H = H + jnp.diag(diag)
    return H.at[bias_idx[:, None], bias_idx[None, :]].add(1.0)

  def decrease(Wb, P_NxK, dWb, t_S):
    """f(Wb + t dWb) - f(Wb) for each t, computed as a difference, not of two values."""
    Z_NxK = X_NxD1 @ dWb
    tZ_SxNxK = t_S[:, None, None] * Z_NxK
    s_SxN = jnp.sum(P_NxK * jnp.expm1(tZ_SxNxK), axis=2)  # sum_k p_k e^{tz_k} - 1
    logits_NxK = X_NxD1 @ Wb
    direct_SxN = (jax.nn.logsumexp(logits_NxK + tZ_SxNxK, axis=2)
                  - jax.nn.logsumexp(logits_NxK, axis=1))
    dlse_SxN = jnp.where(s_SxN > -0.5, jnp.log1p(jnp.maximum(s_SxN, -0.5)), direct_SxN)
    dce_SxN = dlse_SxN - t_S[:, None] * jnp.take_along_axis(Z_NxK, y_N[:, None], axis=1)[:, 0]
    W, dW = Wb * pen_D1[:, None], dWb * pen_D1[:, None]
    return dce_SxN @ c_N + l2 * (t_S * jnp.sum(W * dW) + 0.5 * t_S ** 2 * jnp.sum(dW * dW))

  def keep_going(carry):
    _, g, it, _, stalled = carry
    return (it < max_iter) & (_grad_max(g) >= tol) & ~stalled

  def step(carry):
    Wb, g, it, damp, _ = carry
    P_NxK = probs(Wb)
    g_P = g.T.reshape(P)  # class-major, as the Hessian
    H = hessian(P_NxK)
    H = H + jnp.diag(damp * jnp.diagonal(H))  # Marquardt: relative to each entry's scale
    d_P = -jax.scipy.linalg.cho_solve(jax.scipy.linalg.cho_factor(H), g_P)
    slope = g_P @ d_P
    # Float32 sees the Hessian as indefinite when the penalty is below its rounding:
    # the factorisation fails (NaN) or the step is no descent. Then damp more and retry.
    failed = ~jnp.all(jnp.isfinite(d_P)) | ~(slope < 0)
    d_P = jnp.where(failed, 0.0, d_P)
    dWb = d_P.reshape(K, D1).T
    dec_S = decrease(Wb, P_NxK, dWb, ts_S)
    ok_S = dec_S <= _ARMIJO * ts_S * slope
    # The largest Armijo step; failing that, the best decrease if there is one.
    i = jnp.where(ok_S.any(), jnp.argmax(ok_S), jnp.argmin(dec_S))
    moved = ~failed & (dec_S[i] < 0)
    Wb = jnp.where(moved, Wb + ts_S[i] * dWb, Wb)
    damp = jnp.where(failed, jnp.maximum(100.0 * damp, _DAMP_MIN),
                     jnp.maximum(0.1 * damp, _DAMP_MIN))
    # No decrease along a valid Newton step: float32 cannot improve on this point.
    stalled = (~failed & ~moved) | (damp > _DAMP_MAX)
    return Wb, jnp.where(moved, grad(Wb, probs(Wb)), g), it + 1, damp, stalled

  g0 = grad(Wb0_D1xK, probs(Wb0_D1xK))
  Wb, g, it, _, _ = jax.lax.while_loop(
      keep_going, step, (Wb0_D1xK, g0, jnp.int32(0), jnp.float32(_DAMP_MIN), False))
  return Wb, it, _grad_max(g)


def _lbfgs(X_NxD1, c_N, y_N, l2, tol, Wb0_D1xK, max_iter: int):
  """optax.lbfgs (zoom line search) for problems too large for an exact Hessian."""
  opt = optax.lbfgs()
  loss = lambda Wb: _objective(Wb, X_NxD1, c_N, y_N, l2)
  value_and_grad = optax.value_and_grad_from_state(loss)

  def step(carry):
    params, state = carry
    value, grad = value_and_grad(params, state=state)
    updates, state = opt.update(grad, state, params, value=value, grad=grad, value_fn=loss)
    return optax.apply_updates(params, updates), state

  def keep_going(carry):
    _, state = carry
    k = otu.tree_get(state, "count")
    return (k == 0) | ((k < max_iter) & (_grad_max(otu.tree_get(state, "grad")) >= tol))

  Wb, state = jax.lax.while_loop(keep_going, step, (Wb0_D1xK, opt.init(Wb0_D1xK)))
  # The state's gradient is of the previous iterate: report the final one's.
  return Wb, otu.tree_get(state, "count"), _grad_max(jax.grad(loss)(Wb))


@functools.partial(jax.jit, static_argnames=("newton", "max_iter"))
def _fit_one(X_NxD1, c_N, y_N, l2, tol, Wb0_D1xK, *, newton: bool, max_iter: int):
  """(Wb_D1xK, iterations, grad_max) from the starting point Wb0 (one penalty)."""
  return (_newton if newton else _lbfgs)(X_NxD1, c_N, y_N, l2, tol, Wb0_D1xK, max_iter)


def _one_blas_thread() -> contextlib.AbstractContextManager:
  """On CPU, JAX's Cholesky runs in scipy's OpenBLAS, whose threads spin while they
  wait: for these small matrices that costs 5x the CPU time and, on a busy machine,
  seconds of wall time. One thread while fitting (when threadpoolctl is installed)."""
  if jax.default_backend() != "cpu":
    return contextlib.nullcontext()
  try:
    from threadpoolctl import threadpool_limits
  except ImportError:
    return contextlib.nullcontext()
  # JAX calls scipy's LAPACK: load it now, as only libraries already loaded are limited.
  import scipy.linalg  # noqa: F401
  return threadpool_limits(1, user_api="blas")


def _fit_path(X_NxD: np.ndarray, y_N: np.ndarray, weight_N: np.ndarray, Cs: Sequence[float],
              num_classes: int, max_iter: int, tol: float,
              Wb0_D1xK: np.ndarray | None = None) -> list[LogReg]:
  """One model per C, on the examples with weight 1 (weight 0: padding, ignored).

  The Cs are fitted one after another from the strongest penalty to the weakest,
  each starting from the previous solution (few iterations each), by one
  compiled program per data shape: the holdout fit pads its examples to the
  size of the refit's so that both share it.
  """
  N, D = X_NxD.shape
  n = float(np.sum(weight_N))
  X = jnp.asarray(np.concatenate([np.asarray(X_NxD, np.float32), np.ones((N, 1), np.float32)],
                                 axis=1))
  c = jnp.asarray(np.asarray(weight_N, np.float32) / n)
  y = jnp.asarray(y_N, jnp.int32)
  newton = (D + 1) * num_classes <= NEWTON_MAX_PARAMS
  Wb = (jnp.zeros((D + 1, num_classes), jnp.float32) if Wb0_D1xK is None
        else jnp.asarray(Wb0_D1xK, jnp.float32))
  fits = {}
  with _one_blas_thread():
    for g in sorted(range(len(Cs)), key=lambda g: Cs[g]):
      Wb, its, gmax = _fit_one(X, c, y, jnp.float32(1.0 / (Cs[g] * n)), jnp.float32(tol), Wb,
                               newton=newton, max_iter=max_iter)
      fits[g] = (Wb, its, gmax)
    fits = jax.device_get(fits)
  return [LogReg(np.asarray(Wb[:-1]), np.asarray(Wb[-1]), float(C), int(its), float(gmax),
                 bool(gmax < tol)) for g, C in enumerate(Cs) for Wb, its, gmax in [fits[g]]]


def fit_logreg(X_NxD: np.ndarray, y_N: np.ndarray, Cs: Sequence[float], num_classes: int,
               max_iter: int = MAX_ITER, tol: float = TOL) -> list[LogReg]:
  """One model per C in `Cs`, fitted on the default device (X as given)."""
  return _fit_path(X_NxD, y_N, np.ones(len(y_N)), Cs, num_classes, max_iter, tol)


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
  # The held-out rows stay in, with weight 0: the refit's shapes, hence its compiled program.
  weight = np.zeros(len(train_y))
  weight[fit_idx] = 1.0
  models = _fit_path(std(train_X), train_y, weight, Cs, K, max_iter, tol)
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
