"""MLM/NSP sums against the textbook formulas (gather + log-softmax, argmax)."""

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.model import losses


def _batch(seed=0, B=3, P=4, V=37):
  rng = np.random.default_rng(seed)
  logits = jnp.asarray(rng.normal(0, 3, (B, P, V)), jnp.float32)
  labels = jnp.asarray(rng.integers(0, V, (B, P)), jnp.int32)
  weights = jnp.asarray(rng.integers(0, 2, (B, P)), jnp.float32).at[0, 0].set(1.0)
  return logits, labels, weights


def _reference_loss(logits, labels, weights):
  logp = jax.nn.log_softmax(logits, axis=-1)
  nll = -jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]
  return (nll * weights).sum()


def test_mlm_loss_matches_gather_log_softmax():
  logits, labels, weights = _batch()
  got = losses.mlm_sums(logits, labels, weights)
  np.testing.assert_allclose(got.loss, _reference_loss(logits, labels, weights), rtol=1e-6)
  assert float(got.count) == float(weights.sum())


def test_mlm_loss_gradient_matches_softmax_minus_one_hot():
  logits, labels, weights = _batch(seed=1)
  got = jax.grad(lambda x: losses.mlm_sums(x, labels, weights).loss)(logits)
  want = (jax.nn.softmax(logits, -1) - jax.nn.one_hot(labels, logits.shape[-1])) * weights[..., None]
  np.testing.assert_allclose(got, want, atol=1e-6)


def test_mlm_loss_is_stable_for_large_logits():
  logits, labels, weights = _batch(seed=2)
  got = losses.mlm_sums(logits * 1e4, labels, weights).loss
  assert np.isfinite(float(got))
  np.testing.assert_allclose(got, _reference_loss(logits * 1e4, labels, weights), rtol=1e-5)


def test_mlm_accuracy_counts_weighted_argmax_hits():
  logits, labels, weights = _batch(seed=3)
  labels = labels.at[:, :2].set(jnp.argmax(logits[:, :2], -1))  # some certain hits
  got = losses.mlm_sums(logits, labels, weights).correct
  want = ((jnp.argmax(logits, -1) == labels) * weights).sum()
  assert float(got) == float(want) and float(want) > 0


def test_nsp_sums_match_log_softmax_and_argmax():
  logits = jnp.asarray([[2.0, -1.0], [0.5, 1.5], [0.0, 3.0]])
  labels = jnp.asarray([0, 0, 1])
  got = losses.nsp_sums(logits, labels, jnp.ones(3))
  logp = jax.nn.log_softmax(logits, -1)
  np.testing.assert_allclose(got.loss, -(logp[0, 0] + logp[1, 0] + logp[2, 1]), rtol=1e-6)
  assert float(got.correct) == 2.0 and float(got.count) == 3.0
