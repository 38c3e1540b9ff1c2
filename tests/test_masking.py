"""Masking statistics and guarantees (reference: google-research/bert)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.model.masking import mask_tokens

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
SPECIALS = (PAD, UNK, CLS, SEP, MASK)
VOCAB = 1000


def _batch(batch=128, length=128, seed=0):
  """[CLS] A [SEP] B [SEP] [PAD]... with random real lengths."""
  rs = np.random.RandomState(seed)
  ids = rs.randint(5, VOCAB, size=(batch, length)).astype(np.int32)
  for row in ids:
    n = rs.randint(20, length + 1)
    a = rs.randint(2, n - 2)
    row[0], row[a], row[n - 1] = CLS, SEP, SEP
    row[n:] = PAD
  return ids


def _mask(key, ids, max_predictions=80, **kw):
  return jax.jit(lambda k, x: mask_tokens(
      k, x, vocab_size=VOCAB, mask_id=MASK, special_ids=SPECIALS,
      max_predictions=max_predictions, **kw))(key, ids)


def test_fifteen_percent_of_candidates_are_chosen():
  ids = _batch(batch=256)
  m = _mask(jax.random.key(0), ids)
  n_cand = (~np.isin(ids, SPECIALS)).sum(-1)
  assert n_cand.sum() > 10_000
  expected = np.clip(np.round(n_cand * 0.15), 1, 80)
  np.testing.assert_array_equal(np.asarray(m.weights_BxP).sum(-1), expected)
  assert abs(np.asarray(m.weights_BxP).sum() / n_cand.sum() - 0.15) < 0.01


def test_eighty_ten_ten_split():
  ids = _batch(batch=256)
  m = _mask(jax.random.key(1), ids)
  w = np.asarray(m.weights_BxP) > 0
  pos, labels = np.asarray(m.positions_BxP), np.asarray(m.labels_BxP)
  new = np.take_along_axis(np.asarray(m.ids_BxL), pos, axis=-1)[w]
  orig = labels[w]
  assert w.sum() > 2000
  frac_mask = (new == MASK).mean()
  frac_same = (new == orig).mean()
  frac_random = ((new != MASK) & (new != orig)).mean()
  assert abs(frac_mask - 0.8) < 0.03
  assert abs(frac_same - 0.1) < 0.02  # + 1/VOCAB from random draws of the same id
  assert abs(frac_random - 0.1) < 0.02


def test_specials_and_padding_are_never_chosen():
  ids = _batch()
  m = _mask(jax.random.key(2), ids)
  w = np.asarray(m.weights_BxP) > 0
  chosen = np.take_along_axis(ids, np.asarray(m.positions_BxP), axis=-1)[w]
  assert not np.isin(chosen, SPECIALS).any()
  # Specials and padding are unchanged in the corrupted ids.
  special = np.isin(ids, SPECIALS)
  np.testing.assert_array_equal(np.asarray(m.ids_BxL)[special], ids[special])


def test_only_chosen_positions_change():
  ids = _batch()
  m = _mask(jax.random.key(3), ids)
  changed = np.asarray(m.ids_BxL) != ids
  chosen = np.zeros_like(changed)
  w = np.asarray(m.weights_BxP) > 0
  for b in range(ids.shape[0]):
    chosen[b, np.asarray(m.positions_BxP)[b][w[b]]] = True
  assert not (changed & ~chosen).any()


def test_labels_are_the_original_ids():
  ids = _batch()
  m = _mask(jax.random.key(4), ids)
  w = np.asarray(m.weights_BxP) > 0
  np.testing.assert_array_equal(
      np.take_along_axis(ids, np.asarray(m.positions_BxP), -1)[w], np.asarray(m.labels_BxP)[w])
  assert (np.asarray(m.labels_BxP)[~w] == 0).all()


def test_max_predictions_caps_each_sequence():
  ids = _batch()
  m = _mask(jax.random.key(5), ids, max_predictions=5)
  assert m.positions_BxP.shape == (ids.shape[0], 5)
  assert (np.asarray(m.weights_BxP).sum(-1) <= 5).all()


def test_all_padding_sequence_gets_no_predictions():
  ids = np.zeros((4, 32), np.int32)
  m = _mask(jax.random.key(6), ids, max_predictions=5)
  assert float(np.asarray(m.weights_BxP).sum()) == 0.0
  np.testing.assert_array_equal(np.asarray(m.ids_BxL), ids)


def test_mask_is_a_function_of_seed_and_step():
  ids = _batch(batch=8)
  root = jax.random.key(42)
  a = _mask(jax.random.fold_in(root, 7), ids)
  b = _mask(jax.random.fold_in(jax.random.key(42), 7), ids)
  c = _mask(jax.random.fold_in(root, 8), ids)
  np.testing.assert_array_equal(np.asarray(a.ids_BxL), np.asarray(b.ids_BxL))
  assert (np.asarray(a.positions_BxP) != np.asarray(c.positions_BxP)).any()


def test_mask_does_not_depend_on_device_sharding():
  ids = _batch(batch=16)
  key = jax.random.key(9)
  single = _mask(key, ids)
  mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
  sharded_ids = jax.device_put(ids, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data")))
  sharded = _mask(key, sharded_ids)
  np.testing.assert_array_equal(np.asarray(single.ids_BxL), np.asarray(sharded.ids_BxL))


def test_whole_word_masking_takes_every_piece_of_a_word():
  rs = np.random.RandomState(0)
  is_cont = np.zeros(VOCAB, bool)
  is_cont[500:] = True  # ids >= 500 are `##` continuation pieces
  ids = _batch(batch=64)
  starts = rs.randint(5, 500, size=ids.shape)
  real = ~np.isin(ids, SPECIALS)
  # Make every other real token a word start so words have 1-3 pieces.
  ids = np.where(real & (rs.rand(*ids.shape) < 0.5), starts, ids).astype(np.int32)
  m = _mask(jax.random.key(10), ids, max_predictions=80, is_continuation_V=jnp.asarray(is_cont))
  w = np.asarray(m.weights_BxP) > 0
  assert w.sum() > 500
  for b in range(ids.shape[0]):
    chosen = set(np.asarray(m.positions_BxP)[b][w[b]].tolist())
    word = -1
    words: dict = {}
    for i, t in enumerate(ids[b]):
      if t in SPECIALS:
        word = -1
        continue
      if not (is_cont[t] and word >= 0):
        word = i
      words.setdefault(word, []).append(i)
    for pieces in words.values():
      taken = [p in chosen for p in pieces]
      assert all(taken) or not any(taken), (b, pieces, taken)
    n_cand = real[b].sum()
    assert len(chosen) <= min(80, max(1, round(n_cand * 0.15)))
