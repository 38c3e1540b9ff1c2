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
  pick_rng, action_rng, random_rng = jax.random.split(rng, 3)
  ids_BxL = ids_BxL.astype(jnp.int32)
  candidate_BxL = ~jnp.isin(ids_BxL, jnp.asarray(list(special_ids), jnp.int32))
  num_to_predict_B = _num_to_predict(candidate_BxL, mask_prob, max_predictions)
  word_BxL = _word_index(ids_BxL, candidate_BxL, is_continuation_V)
  chosen_BxL = _choose_words(pick_rng, word_BxL, candidate_BxL, num_to_predict_B)
  positions_BxP, original_BxP, real_BxP = _chosen_positions(chosen_BxL, ids_BxL,
                                                             max_predictions)
  labels_BxP = jnp.where(real_BxP, original_BxP, 0)
  weights_BxP = real_BxP.astype(jnp.float32)
  new_BxP = _corrupt(action_rng, random_rng, original_BxP, real_BxP,
                     vocab_size=vocab_size, mask_id=mask_id)
  rows_Bx1 = jnp.arange(ids_BxL.shape[0])[:, None]
  masked_BxL = ids_BxL.at[rows_Bx1, positions_BxP].set(new_BxP)
  return MaskedBatch(masked_BxL, positions_BxP, labels_BxP, weights_BxP)


def _num_to_predict(candidate_BxL: jax.Array, mask_prob: float,
                    max_predictions: int) -> jax.Array:
  """int32 [B]: min(P, max(1, round(mask_prob * candidates))), 0 without candidates."""
  num_cand_B = candidate_BxL.sum(-1)
  return jnp.where(
      num_cand_B > 0,
      jnp.clip(jnp.round(num_cand_B * mask_prob), 1, max_predictions),
      0,
  ).astype(jnp.int32)


def _word_index(ids_BxL: jax.Array, candidate_BxL: jax.Array,
                is_continuation_V: Optional[jax.Array]) -> jax.Array:
  """The word of each candidate position (0, 1, ...); L for non-candidates.

  Without whole-word masking every candidate starts its own word.
  """
  length = ids_BxL.shape[1]
  if is_continuation_V is None:
    starts_BxL = candidate_BxL
  else:
    cont_BxL = jnp.asarray(is_continuation_V)[ids_BxL]
    prev_cand_BxL = jnp.pad(candidate_BxL[:, :-1], ((0, 0), (1, 0)))
    # A `##` piece with no word before it starts a word of its own.
    starts_BxL = candidate_BxL & ~(cont_BxL & prev_cand_BxL)
  word_BxL = jnp.cumsum(starts_BxL, axis=-1) - 1  # word index of each position
  return jnp.where(candidate_BxL, word_BxL, length)  # non-candidates -> dummy


def _choose_words(pick_rng: jax.Array, word_BxL: jax.Array, candidate_BxL: jax.Array,
                  num_to_predict_B: jax.Array) -> jax.Array:
  """bool [B, L]: the positions of words taken in random order while they fit.

  A word's pieces share one random score, so they are chosen together.
  """
  batch, length = word_BxL.shape
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
  return jnp.take_along_axis(
      jnp.pad(take_BxW, ((0, 0), (0, 1))), word_BxL, axis=-1) & candidate_BxL


def _chosen_positions(chosen_BxL: jax.Array, ids_BxL: jax.Array,
                      max_predictions: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(positions, original ids, is real) [B, P]: chosen positions in increasing order,
  padded with position 0."""
  length = chosen_BxL.shape[1]
  idx_L = jnp.arange(length)
  key_BxL = jnp.where(chosen_BxL, length - idx_L, 0)
  top_BxP, positions_BxP = jax.lax.top_k(key_BxL, max_predictions)
  real_BxP = top_BxP > 0
  positions_BxP = jnp.where(real_BxP, positions_BxP, 0).astype(jnp.int32)
  original_BxP = jnp.take_along_axis(ids_BxL, positions_BxP, axis=-1)
  return positions_BxP, original_BxP, real_BxP


def _corrupt(action_rng: jax.Array, random_rng: jax.Array, original_BxP: jax.Array,
             real_BxP: jax.Array, *, vocab_size: int, mask_id: int) -> jax.Array:
  """int32 [B, P]: [MASK] (80%), a random id (10%) or the original (10%) per prediction."""
  action_BxP = jax.random.uniform(action_rng, original_BxP.shape)
  random_BxP = jax.random.randint(random_rng, original_BxP.shape, 0, vocab_size)
  new_BxP = jnp.where(action_BxP < 0.8, mask_id,
                      jnp.where(action_BxP < 0.9, random_BxP, original_BxP))
  return jnp.where(real_BxP, new_BxP, original_BxP).astype(jnp.int32)
