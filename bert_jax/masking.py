"""Masked-LM corruption as a pure `jax.numpy` function of (rng, ids).

Runs inside the jitted train step, so the host never touches masking and the
mask of step s is a function of (seed, s) alone.

Shape legend: B batch, L sequence length, P max predictions per sequence,
V vocabulary (token table) size, W words per sequence (W == L).
"""

from typing import NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp


class MaskedBatch(NamedTuple):
  ids_BxL: jax.Array  # input ids after corruption
  positions_BxP: jax.Array  # int32; 0 where weights_BxP == 0
  labels_BxP: jax.Array  # original ids at positions; 0 where weight is 0
  weights_BxP: jax.Array  # float32 1.0 for a real prediction, 0.0 for padding


def mask_tokens(
    rng: jax.Array,
    ids_BxL: jax.Array,
    *,
    vocab_size: int,
    mask_id: int,
    special_ids: Sequence[int],
    max_predictions: int,
    mask_prob: float = 0.15,
    is_continuation_V: Optional[jax.Array] = None,
) -> MaskedBatch:
  """Chooses `mask_prob` of the non-special tokens and corrupts them 80/10/10.

  Following google-research/bert: n = min(P, max(1, round(mask_prob * n_cand)))
  predictions per sequence (0 for a sequence with no candidates); each chosen
  token becomes [MASK] (80%), a uniformly random vocabulary id (10%) or stays
  (10%). With `is_continuation_V` (True for `##` word pieces) whole words are
  chosen: a word is taken only if all its pieces fit into the n predictions.
  Special ids (which must include padding) are never chosen.
  """
  batch, length = ids_BxL.shape
  pick_rng, action_rng, random_rng = jax.random.split(rng, 3)
  ids_BxL = ids_BxL.astype(jnp.int32)

  special_BxL = jnp.isin(ids_BxL, jnp.asarray(list(special_ids), jnp.int32))
  candidate_BxL = ~special_BxL
  num_cand_B = candidate_BxL.sum(-1)
  num_to_predict_B = jnp.where(
      num_cand_B > 0,
      jnp.clip(jnp.round(num_cand_B * mask_prob), 1, max_predictions),
      0,
  ).astype(jnp.int32)

  # Group candidates into words; without whole-word masking every candidate
  # starts its own word. A word's pieces share one random score, so they are
  # chosen together.
  if is_continuation_V is None:
    starts_BxL = candidate_BxL
  else:
    cont_BxL = jnp.asarray(is_continuation_V)[ids_BxL]
    prev_cand_BxL = jnp.pad(candidate_BxL[:, :-1], ((0, 0), (1, 0)))
    # A `##` piece with no word before it starts a word of its own.
    starts_BxL = candidate_BxL & ~(cont_BxL & prev_cand_BxL)
  word_BxL = jnp.cumsum(starts_BxL, axis=-1) - 1  # word index of each position
  word_BxL = jnp.where(candidate_BxL, word_BxL, length)  # non-candidates -> dummy
  word_len_BxW = jax.vmap(
      lambda w: jnp.zeros(length + 1, jnp.int32).at[w].add(1)[:length])(word_BxL)

  score_BxW = jax.random.uniform(pick_rng, (batch, length))
  score_BxW = jnp.where(word_len_BxW > 0, score_BxW, -1.0)
  order_BxW = jnp.argsort(-score_BxW, axis=-1)
  len_sorted_BxW = jnp.take_along_axis(word_len_BxW, order_BxW, axis=-1)
  take_sorted_BxW = (jnp.cumsum(len_sorted_BxW, axis=-1)
                     <= num_to_predict_B[:, None]) & (len_sorted_BxW > 0)
  take_BxW = jax.vmap(lambda o, t: jnp.zeros(length, bool).at[o].set(t))(
      order_BxW, take_sorted_BxW)
  chosen_BxL = jnp.take_along_axis(
      jnp.pad(take_BxW, ((0, 0), (0, 1))), word_BxL, axis=-1) & candidate_BxL

  # Chosen positions in increasing order, padded with position 0 / weight 0.
  idx_L = jnp.arange(length)
  key_BxL = jnp.where(chosen_BxL, length - idx_L, 0)
  top_BxP, positions_BxP = jax.lax.top_k(key_BxL, max_predictions)
  weights_BxP = (top_BxP > 0).astype(jnp.float32)
  positions_BxP = jnp.where(top_BxP > 0, positions_BxP, 0).astype(jnp.int32)
  original_BxP = jnp.take_along_axis(ids_BxL, positions_BxP, axis=-1)
  labels_BxP = jnp.where(top_BxP > 0, original_BxP, 0)

  action_BxP = jax.random.uniform(action_rng, positions_BxP.shape)
  random_BxP = jax.random.randint(random_rng, positions_BxP.shape, 0, vocab_size)
  new_BxP = jnp.where(action_BxP < 0.8, mask_id,
                      jnp.where(action_BxP < 0.9, random_BxP, original_BxP))
  new_BxP = jnp.where(top_BxP > 0, new_BxP, original_BxP).astype(jnp.int32)
  rows_Bx1 = jnp.arange(batch)[:, None]
  masked_BxL = ids_BxL.at[rows_Bx1, positions_BxP].set(new_BxP)
  return MaskedBatch(masked_BxL, positions_BxP, labels_BxP, weights_BxP)
