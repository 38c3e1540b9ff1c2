"""MLM and NSP losses/accuracies as (sum, count) pairs, in float32.

Sums and counts (not means) compose across micro-batches, devices, hosts and
evaluation batches; divide once at the end.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp


def cross_entropy(logits_NxC: jax.Array, labels_N: jax.Array) -> jax.Array:
  """-log softmax(logits)[label] per row: optax's softmax_cross_entropy_with_integer_labels,
  written out so the model package needs no optimizer library (same operations)."""
  label_logits_N = jnp.take_along_axis(logits_NxC, labels_N[..., None], axis=-1)[..., 0]
  return jax.nn.logsumexp(logits_NxC, axis=-1) - label_logits_N


class Sums(NamedTuple):
  loss: jax.Array
  correct: jax.Array
  count: jax.Array


def mlm_sums(logits_BxPxV: jax.Array, labels_BxP: jax.Array, weights_BxP: jax.Array) -> Sums:
  """Cross-entropy and accuracy on the masked positions only (weight > 0)."""
  logits_BxPxV = logits_BxPxV.astype(jnp.float32)
  nll_BxP = cross_entropy(logits_BxPxV, labels_BxP)
  hit_BxP = (jnp.argmax(logits_BxPxV, -1) == labels_BxP).astype(jnp.float32)
  return Sums((nll_BxP * weights_BxP).sum(), (hit_BxP * weights_BxP).sum(), weights_BxP.sum())


def nsp_sums(logits_Bx2: jax.Array, labels_B: jax.Array, weights_B: jax.Array) -> Sums:
  """Next-sentence cross-entropy and accuracy (label 0 = IsNext, 1 = NotNext)."""
  logits_Bx2 = logits_Bx2.astype(jnp.float32)
  nll_B = cross_entropy(logits_Bx2, labels_B)
  hit_B = (jnp.argmax(logits_Bx2, -1) == labels_B).astype(jnp.float32)
  return Sums((nll_B * weights_B).sum(), (hit_B * weights_B).sum(), weights_B.sum())
