"""NSP sentence pairs: structure, labels, lengths, determinism (reference algorithm)."""

import random

import numpy as np
import pytest

from bert_jax.data import pretraining_data as pd
from bert_jax.errors import ConfigError

CLS, SEP = 2, 3
DOC_RANGE = 1000  # document d uses token ids [1000*(d+1), 1000*(d+2))


def make_documents(num_docs=30, sentences=(3, 9), words=(4, 15), seed=0):
  """Documents with disjoint token ranges, ids increasing through each document."""
  rng = random.Random(seed)
  docs = []
  for d in range(num_docs):
    next_id = DOC_RANGE * (d + 1)
    doc = []
    for _ in range(rng.randint(*sentences)):
      n = rng.randint(*words)
      doc.append(list(range(next_id, next_id + n)))
      next_id += n
    docs.append(doc)
  return docs


def examples(docs=None, max_seq_length=64, short_seq_prob=0.1, dupe_factor=3, seed=1):
  docs = make_documents() if docs is None else docs
  return list(pd.create_examples(docs, max_seq_length=max_seq_length,
                                 short_seq_prob=short_seq_prob, dupe_factor=dupe_factor,
                                 seed=seed, cls_id=CLS, sep_id=SEP))


def split_ab(example):
  """(tokens A, tokens B) of `[CLS] A [SEP] B [SEP] pad...`."""
  n = int(example["input_mask"].sum())
  ids = example["input_ids"][:n].tolist()
  first_sep = ids.index(SEP)
  return ids[1:first_sep], ids[first_sep + 1:n - 1]


def doc_of(token):
  return token // DOC_RANGE - 1


def test_example_has_fixed_shapes_and_int32_dtypes():
  ex = examples()[0]
  assert sorted(ex) == sorted(pd.FEATURES)
  for key in ("input_ids", "segment_ids", "input_mask"):
    assert ex[key].dtype == np.int32 and ex[key].shape == (64,)
  assert ex["next_sentence_label"].dtype == np.int32 and ex["next_sentence_label"].shape == ()


def test_structure_is_cls_a_sep_b_sep_then_zero_padding():
  for ex in examples():
    n = int(ex["input_mask"].sum())
    ids = ex["input_ids"]
    assert ids[0] == CLS and ids[n - 1] == SEP
    assert (ids[1:n] == SEP).sum() == 2 and (ids[1:n] == CLS).sum() == 0
    assert (ex["input_mask"][:n] == 1).all() and (ex["input_mask"][n:] == 0).all()
    assert (ids[n:] == 0).all()


def test_segment_ids_are_zero_for_cls_a_sep_and_one_for_b_sep():
  for ex in examples():
    a, b = split_ab(ex)
    n = len(a) + len(b) + 3
    expected = [0] * (len(a) + 2) + [1] * (len(b) + 1) + [0] * (64 - n)
    assert ex["segment_ids"].tolist() == expected


def test_both_segments_are_never_empty():
  for ex in examples(short_seq_prob=1.0, max_seq_length=8):
    a, b = split_ab(ex)
    assert a and b


@pytest.mark.parametrize("max_seq_length", [5, 16, 64])
def test_lengths_never_exceed_max_seq_length(max_seq_length):
  for ex in examples(max_seq_length=max_seq_length):
    assert ex["input_ids"].shape == (max_seq_length,)
    assert ex["input_mask"].sum() <= max_seq_length


def test_nsp_labels_are_roughly_balanced():
  # short_seq_prob=0: as in the reference, a short target is drawn per document
  # and can make all its chunks single sentences, which are always NotNext.
  docs = make_documents(num_docs=40, sentences=(30, 50))
  labels = [int(ex["next_sentence_label"])
            for ex in examples(docs, max_seq_length=32, short_seq_prob=0.0, dupe_factor=1)]
  assert len(labels) >= 300
  assert 0.4 <= np.mean(labels) <= 0.6


def test_not_next_b_comes_from_a_different_document():
  not_next = [ex for ex in examples() if ex["next_sentence_label"] == pd.NOT_NEXT]
  assert not_next
  for ex in not_next:
    a, b = split_ab(ex)
    assert {doc_of(t) for t in a}.isdisjoint(doc_of(t) for t in b)


def test_is_next_b_continues_a_in_the_same_document():
  is_next = [ex for ex in examples() if ex["next_sentence_label"] == pd.IS_NEXT]
  assert is_next
  for ex in is_next:
    a, b = split_ab(ex)
    assert len({doc_of(t) for t in a + b}) == 1
    assert a[-1] < b[0]  # B comes after A (ids increase through a document)


def test_not_next_works_with_exactly_two_documents():
  two = make_documents(num_docs=2)
  not_next = [ex for ex in examples(two, dupe_factor=20) if ex["next_sentence_label"] == 1]
  assert not_next
  for ex in not_next:
    a, b = split_ab(ex)
    assert doc_of(a[0]) != doc_of(b[0])


def test_short_seq_prob_produces_shorter_examples():
  long_docs = make_documents(num_docs=20, sentences=(40, 60))
  lengths = lambda p: np.mean([ex["input_mask"].sum() for ex in examples(long_docs, 128, p)])
  full, short = lengths(0.0), lengths(1.0)
  assert full > 0.85 * 128  # without short targets, chunks mostly fill the sequence
  assert short < 0.75 * full


def test_same_seed_gives_identical_examples_and_other_seed_differs():
  first, again, other = examples(seed=7), examples(seed=7), examples(seed=8)
  same = lambda x, y: len(x) == len(y) and all(
      (p["input_ids"] == q["input_ids"]).all() for p, q in zip(x, y))
  assert same(first, again)
  assert not same(first, other)


def test_dupe_factor_adds_passes_over_the_documents_with_fresh_pairs():
  ids = lambda exs: [ex["input_ids"].tolist() for ex in exs]
  one, three = ids(examples(dupe_factor=1)), ids(examples(dupe_factor=3))
  assert three[:len(one)] == one  # the first pass is the dupe_factor=1 data
  assert len(three) > 2 * len(one)
  assert three[len(one):2 * len(one)] != one  # later passes pair differently


def test_fewer_than_two_nonempty_documents_yield_no_examples():
  docs = make_documents(num_docs=1) + [[], [[]]]
  assert examples(docs) == []


def test_max_seq_length_below_five_raises_before_iterating():
  with pytest.raises(ConfigError, match="max_seq_length"):
    pd.create_examples(make_documents(), 4, 0.1, 1, 0, CLS, SEP)


def test_truncate_seq_pair_trims_the_longer_until_it_fits():
  a, b = list(range(10)), list(range(100, 103))
  pd.truncate_seq_pair(a, b, 8, random.Random(0))
  assert len(a) + len(b) == 8 and b == [100, 101, 102]
  assert a == list(range(a[0], a[0] + 5))  # a contiguous slice: trimmed at the ends only


# --- tab-format pairs ---


def pair_examples(num_pairs=40, dupe_factor=10):
  pairs = [[[DOC_RANGE * (d + 1) + i for i in range(4)],
            [DOC_RANGE * (d + 1) + 500 + i for i in range(3)]] for d in range(num_pairs)]
  return list(pd.create_pair_examples(pairs, max_seq_length=16, dupe_factor=dupe_factor,
                                      seed=0, cls_id=CLS, sep_id=SEP))


def test_pair_examples_make_one_example_per_line_per_dupe():
  assert len(pair_examples(num_pairs=40, dupe_factor=10)) == 400


def test_pair_examples_b_is_own_second_half_or_another_lines():
  for ex in pair_examples():
    a, b = split_ab(ex)
    assert a == list(range(a[0], a[0] + 4)) and b == list(range(b[0], b[0] + 3))
    assert b[0] % DOC_RANGE == 500  # always a second half
    same_line = doc_of(a[0]) == doc_of(b[0])
    assert same_line == (ex["next_sentence_label"] == pd.IS_NEXT)


def test_pair_examples_labels_are_roughly_balanced():
  assert 0.4 <= np.mean([ex["next_sentence_label"] for ex in pair_examples()]) <= 0.6


# --- windows and hostile sizes ---


def test_one_sentence_documents_pair_with_each_other_as_not_next():
  docs = make_documents(num_docs=6, sentences=(1, 1))
  exs = examples(docs, dupe_factor=2)
  assert len(exs) == 12
  for ex in exs:
    a, b = split_ab(ex)
    assert ex["next_sentence_label"] == pd.NOT_NEXT and doc_of(a[0]) != doc_of(b[0])


def test_a_sentence_of_200k_tokens_is_truncated_to_fit_in_linear_time():
  import time
  docs = [[list(range(DOC_RANGE, DOC_RANGE + 200_000))],
          [list(range(2 * DOC_RANGE, 2 * DOC_RANGE + 5))]]
  start = time.process_time()
  exs = examples(docs, max_seq_length=32, dupe_factor=1)
  assert time.process_time() - start < 5.0  # one token at a time from the front: minutes
  for ex in exs:
    a, b = split_ab(ex)
    assert len(a) + len(b) == 29 and a == list(range(a[0], a[0] + len(a)))



def _trim_one_at_a_time(a_len, b_len, max_num_tokens, rng):
  """The reference's truncate_seq_pair, on lengths: one cut and one draw per token."""
  a_front = a_back = b_front = b_back = 0
  while a_len + b_len > max_num_tokens:
    front = rng.random() < 0.5
    if a_len > b_len:
      a_front, a_back, a_len = a_front + front, a_back + (not front), a_len - 1
    else:
      b_front, b_back, b_len = b_front + front, b_back + (not front), b_len - 1
  return a_front, a_back, b_front, b_back


@pytest.mark.parametrize("a_len,b_len,max_num_tokens", [
    (3, 2, 10), (10, 3, 8), (3, 10, 8), (7, 7, 5), (8, 7, 5), (7, 8, 5), (100, 1, 61),
    (1, 100, 61), (40, 41, 3), (41, 40, 3), (500, 480, 125), (480, 500, 125),
    (20_000, 19_990, 509), (3, 60_000, 125), (30_000, 30_001, 125)])
def test_trimming_draws_as_cutting_one_token_at_a_time(a_len, b_len, max_num_tokens):
  fast, slow = random.Random(a_len * 7 + b_len), random.Random(a_len * 7 + b_len)
  assert (pd._trim_counts(a_len, b_len, max_num_tokens, fast)
          == _trim_one_at_a_time(a_len, b_len, max_num_tokens, slow))
  assert fast.random() == slow.random()  # and leaves the generator in the same state


def test_two_sentences_of_a_million_tokens_trim_in_constant_time():
  # Two similar lengths used to take one loop step per token (2-5 s a pair; a 52 MB
  # line makes thousands of such pairs): now O(1) Python steps a pair.
  import time
  rng = random.Random(0)
  start = time.process_time()
  for _ in range(200):
    a_front, a_back, b_front, b_back = pd._trim_counts(1_000_000, 1_000_003, 125, rng)
    a_len, b_len = 1_000_000 - a_front - a_back, 1_000_003 - b_front - b_back
    assert (a_len, b_len) == (63, 62)  # the longer side first, then turns: as the reference
    assert min(a_front, a_back, b_front, b_back) > 400_000  # fronts and backs both drawn
  assert time.process_time() - start < 2.0  # 200 pairs; before: 400 s or more