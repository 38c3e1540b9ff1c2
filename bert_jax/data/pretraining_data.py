"""Documents of token ids -> next-sentence-prediction sentence pairs.

A port of google-research/bert `create_pretraining_data.py`
(`create_instances_from_document` and `truncate_seq_pair`) without the
masking, which happens on device. It works on a `Window`: a bounded group of
documents stored flat, so a corpus of any size is processed window by window
(`dataset.py` streams them). NotNext text comes from another document of the
same window; the reference draws it from the whole corpus.

Pairs are computed on sentence lengths only, as spans into the window's
tokens, with the reference's random draws in the reference's order; the
tokens are gathered once at the end, vectorized (`input_ids`). Differences
from the reference, all deliberate: the NotNext document is drawn uniformly
from the *other* documents (the reference retries 10 times and may fall back
to the same one), examples come out in generation order rather than shuffled
(the input pipeline shuffles every epoch), and the `dupe_factor` passes run
per window. Tab-format corpora (one `A<TAB>B` pair per line) use
`pair_spans`, the tutorial's simpler scheme.

Besides the reference's NSP pairs (objective 'mlm+nsp'), `document_spans`
makes the examples of two later objectives, from the same windows:

- 'mlm' (RoBERTa's DOC-SENTENCES): whole consecutive sentences of one
  document, as many as fit, in a single segment `[CLS] tokens [SEP]`; no
  pair and no label. A sentence longer than the sequence is cut, as the
  reference cuts a pair.
- 'mlm+sop' (ALBERT's sentence-order prediction): A and B are consecutive
  parts of one chunk of one document, as IsNext; with probability 0.5 they
  are swapped (label SWAPPED). Both halves always come from one document:
  a chunk of a single sentence (a document's last, or a one-sentence
  document) is split inside the sentence; ALBERT would take B from another
  document there.

Shapes: K examples, L = max_seq_length, T tokens in a window.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from bert_jax.errors import ConfigError
from bert_jax.settings.data import OBJECTIVES

IS_NEXT = 0
NOT_NEXT = 1
IN_ORDER, SWAPPED = 0, 1  # sentence-order labels ('mlm+sop'), stored like NSP's
# What examples teach besides MLM (`config.objective`); the first is the default.
# b_len of a one-segment span (objective 'mlm'): no B and no second [SEP]. The
# pair formulas then give the single-segment layout unchanged: n = a_len + b_len
# + 3 = a_len + 2 = n_a, so every segment id is 0.
NO_SEGMENT_B = -1
FEATURES = ("input_ids", "segment_ids", "input_mask", "next_sentence_label")


class Batch(NamedTuple):
  """Examples stacked along B: numpy arrays on the host, jax.Arrays on devices.

  A NamedTuple is a JAX pytree, so a batch crosses `jit` as it is.
  """
  input_ids_BxL: Any  # int32
  segment_ids_BxL: Any  # int32: 0 for [CLS] A [SEP], 1 for B [SEP], 0 for padding
  input_mask_BxL: Any  # int32: 1 for tokens, 0 for padding
  next_sentence_label_B: Any  # int32: IS_NEXT or NOT_NEXT
  example_mask_B: Any  # float32: 1 for a real example, 0 for padding (last eval batch)

  @classmethod
  def from_features(cls, arrays: dict, example_mask_B: Any = None) -> "Batch":
    """From stacked FEATURES arrays; every example real unless a mask is given."""
    n = len(arrays["input_ids"])
    mask = np.ones(n, np.float32) if example_mask_B is None else example_mask_B
    return cls(*(np.asarray(arrays[k], np.int32) for k in FEATURES), mask)
_SPECIALS_PER_PAIR = 3  # [CLS] A [SEP] B [SEP]
_BLOCK = 4096  # examples gathered per vectorized step in the list API

# A span is (a_start, a_len, b_start, b_len, label): offsets into Window.tokens.
# b_len == NO_SEGMENT_B: a single segment `[CLS] A [SEP]` (label 0, unused).
Span = tuple[int, int, int, int, int]


@dataclasses.dataclass
class Window:
  """Documents with their sentences, flat: tokens_T int32 plus sentence lengths."""
  tokens_T: np.ndarray
  sentence_lengths: list[list[int]]  # per document, every length > 0
  doc_starts: list[int]  # offset of each document in tokens_T

  @property
  def num_documents(self) -> int:
    return len(self.sentence_lengths)

  @classmethod
  def from_flat(cls, tokens_T: np.ndarray, sentence_lengths: list[list[int]]) -> Window:
    """`tokens_T` holds the documents' sentences in order; no empty sentence or document."""
    sizes = [sum(d) for d in sentence_lengths]
    starts = list(itertools.accumulate(sizes, initial=0))
    if starts[-1] != len(tokens_T):
      raise ValueError(f"sentence lengths add up to {starts[-1]}, tokens are {len(tokens_T)}")
    return cls(np.asarray(tokens_T, np.int32), sentence_lengths, starts[:-1])

  @classmethod
  def from_documents(cls, documents: Iterable[Sequence[Sequence[int]]]) -> Window:
    """Documents of sentences of ids; empty sentences and documents are dropped."""
    lengths, flat = [], []
    for doc in documents:
      sentences = [s for s in doc if len(s)]
      if sentences:
        lengths.append([len(s) for s in sentences])
        flat.extend(t for s in sentences for t in s)
    return cls.from_flat(np.asarray(flat, np.int32), lengths)


def create_examples(documents: Sequence[Sequence[Sequence[int]]], max_seq_length: int,
                    short_seq_prob: float, dupe_factor: int, seed: int, cls_id: int,
                    sep_id: int, objective: str = "mlm+nsp") -> Iterator[dict[str, np.ndarray]]:
  """Yields `[CLS] A [SEP] B [SEP]` examples, zero-padded to `max_seq_length`.

  Each example: `input_ids`, `segment_ids`, `input_mask` int32 [max_seq_length]
  and `next_sentence_label` int32 scalar (0 = IsNext, 1 = NotNext). Empty
  sentences and documents are ignored; with fewer than two non-empty
  documents nothing is yielded (NotNext needs another document), so callers
  detect an unusable corpus by getting no examples. All documents form one
  window. Objective 'mlm' yields `[CLS] tokens [SEP]` (segment ids 0, label
  0), 'mlm+sop' pairs labelled IN_ORDER / SWAPPED (see `document_spans`).
  """
  _check_args(max_seq_length, short_seq_prob, dupe_factor)
  window = Window.from_documents(documents)
  spans = document_spans(window, max_seq_length, short_seq_prob, dupe_factor,
                         random.Random(seed), objective)
  return _examples(window, spans, max_seq_length, cls_id, sep_id)


def create_pair_examples(documents: Sequence[Sequence[Sequence[int]]], max_seq_length: int,
                         dupe_factor: int, seed: int, cls_id: int,
                         sep_id: int) -> Iterator[dict[str, np.ndarray]]:
  """Examples from documents that are one (first half, second half) pair each.

  For tab-format corpora (the tutorial's toy format): A is a line's first
  half; B is its own second half (IsNext) or, with probability 0.5, the second
  half of another line (NotNext). `create_examples` would instead put an
  unused second half back as a chunk of its own (always NotNext: 2/3 of all
  labels) and take NotNext text from a random sentence onwards, often a whole
  other line. Documents without exactly two non-empty sentences are skipped;
  same example format and empty-input behaviour as `create_examples`.
  """
  _check_args(max_seq_length, 0.0, dupe_factor)
  pairs = [d for d in documents if len(d) == 2 and len(d[0]) and len(d[1])]
  window = Window.from_documents(pairs)
  spans = pair_spans(window, max_seq_length, dupe_factor, random.Random(seed))
  return _examples(window, spans, max_seq_length, cls_id, sep_id)


def _examples(window: Window, spans: Iterator[Span], max_seq_length: int, cls_id: int,
              sep_id: int) -> Iterator[dict[str, np.ndarray]]:
  while block := list(itertools.islice(spans, _BLOCK)):
    spans_Kx5 = np.asarray(block, np.int64)
    arrays = examples_from_spans(window.tokens_T, spans_Kx5, max_seq_length, cls_id, sep_id)
    for k in range(len(block)):
      yield {name: arrays[name][k] for name in FEATURES}


def _check_args(max_seq_length: int, short_seq_prob: float, dupe_factor: int) -> None:
  if max_seq_length < _SPECIALS_PER_PAIR + 2:
    raise ConfigError(f"max_seq_length must be at least 5 ([CLS] a [SEP] b [SEP]), "
                      f"got {max_seq_length}")
  if not 0.0 <= short_seq_prob <= 1.0:
    raise ConfigError(f"data.short_seq_prob must be in [0, 1], got {short_seq_prob}")
  if dupe_factor < 1:
    raise ConfigError(f"data.dupe_factor must be >= 1, got {dupe_factor}")


# --- pairs as spans ---


def document_spans(window: Window, max_seq_length: int, short_seq_prob: float,
                   dupe_factor: int, rng: random.Random,
                   objective: str = "mlm+nsp") -> Iterator[Span]:
  """The examples of `objective` for every document of the window, `dupe_factor` passes.

  'mlm+nsp': the reference's pairs; nothing is yielded for a window of fewer
  than two documents. 'mlm': one-segment spans; 'mlm+sop': order pairs.
  """
  _check_args(max_seq_length, short_seq_prob, dupe_factor)
  per_document = {"mlm+nsp": _spans_from_document, "mlm": _single_spans,
                  "mlm+sop": _order_spans}.get(objective)
  if per_document is None:
    raise ConfigError(f"--config.objective={objective!r}: expected one of "
                      f"{', '.join(OBJECTIVES)}")
  if objective == "mlm+nsp" and window.num_documents < 2:
    return
  # Sentence start offsets within each document, computed once for all passes.
  cums = [list(itertools.accumulate(d, initial=0)) for d in window.sentence_lengths]
  for _ in range(dupe_factor):
    for doc_index in range(window.num_documents):
      yield from per_document(window, cums, doc_index, max_seq_length, short_seq_prob, rng)


def _target_length(max_num_tokens: int, short_seq_prob: float, rng: random.Random) -> int:
  """Mostly fill the sequence, sometimes shorter (once per document, as the reference)."""
  if rng.random() < short_seq_prob:
    return rng.randint(2, max_num_tokens)
  return max_num_tokens


def _single_spans(window: Window, cums: list[list[int]], doc_index: int, max_seq_length: int,
                  short_seq_prob: float, rng: random.Random) -> Iterator[Span]:
  """'mlm': whole consecutive sentences while they fit; the next example goes on from there."""
  lengths, cum = window.sentence_lengths[doc_index], cums[doc_index]
  start = window.doc_starts[doc_index]
  max_num_tokens = max_seq_length - 2  # [CLS] tokens [SEP]
  target = _target_length(max_num_tokens, short_seq_prob, rng)
  first = 0
  for i in range(len(lengths)):
    if i > first and cum[i + 1] - cum[first] > max_num_tokens:  # sentence i does not fit
      yield _single(start + cum[first], cum[i] - cum[first])
      first = i
    if i == len(lengths) - 1 or cum[i + 1] - cum[first] >= target:
      # Only a lone sentence can be over max_num_tokens: cut at random ends.
      a_start, a_len, *_ = _truncated(start + cum[first], cum[i + 1] - cum[first], 0, 0, 0,
                                      max_num_tokens, rng)
      yield _single(a_start, a_len)
      first = i + 1


def _single(a_start: int, a_len: int) -> Span:
  return (a_start, a_len, a_start + a_len, NO_SEGMENT_B, 0)


def _order_spans(window: Window, cums: list[list[int]], doc_index: int, max_seq_length: int,
                 short_seq_prob: float, rng: random.Random) -> Iterator[Span]:
  """'mlm+sop': chunks as the reference's, A and B its consecutive parts, half swapped.

  A chunk ends at the target length once it has two sentences, or at the
  document's end; a last chunk of one sentence is split inside it (a
  one-token sentence there gives no example).
  """
  lengths, cum = window.sentence_lengths[doc_index], cums[doc_index]
  start = window.doc_starts[doc_index]
  max_num_tokens = max_seq_length - _SPECIALS_PER_PAIR
  target = _target_length(max_num_tokens, short_seq_prob, rng)
  below = rng._randbelow  # pylint: disable=protected-access
  first = 0
  for i in range(len(lengths)):
    n_chunk = i - first + 1
    if i < len(lengths) - 1 and (n_chunk < 2 or cum[i + 1] - cum[first] < target):
      continue
    if n_chunk >= 2:
      a_len = cum[first + 1 + below(n_chunk - 1)] - cum[first]
    elif lengths[i] >= 2:
      a_len = 1 + below(lengths[i] - 1)
    else:
      return
    a_start = start + cum[first]
    b_start, b_len = a_start + a_len, cum[i + 1] - cum[first] - a_len
    if rng.random() < 0.5:  # B first, then A
      yield _truncated(b_start, b_len, a_start, a_len, SWAPPED, max_num_tokens, rng)
    else:
      yield _truncated(a_start, a_len, b_start, b_len, IN_ORDER, max_num_tokens, rng)
    first = i + 1


def _spans_from_document(window: Window, cums: list[list[int]], doc_index: int,
                         max_seq_length: int, short_seq_prob: float,
                         rng: random.Random) -> Iterator[Span]:
  lengths = window.sentence_lengths[doc_index]
  cum = cums[doc_index]
  start = window.doc_starts[doc_index]
  num_docs = window.num_documents
  max_num_tokens = max_seq_length - _SPECIALS_PER_PAIR
  # Mostly fill the sequence (efficient), sometimes shorter so the model also
  # sees short inputs as at fine-tuning time. Chosen once per document, as in
  # the reference.
  target_seq_length = max_num_tokens
  if rng.random() < short_seq_prob:
    target_seq_length = rng.randint(2, max_num_tokens)
  # randint(a, b) is a + _randbelow(b - a + 1) (same draws); called directly,
  # it costs a third, and this loop runs once per example.
  below = rng._randbelow  # pylint: disable=protected-access

  first = 0  # first sentence of the current chunk
  i = 0
  while i < len(lengths):
    n_chunk = i - first + 1
    if i == len(lengths) - 1 or cum[i + 1] - cum[first] >= target_seq_length:
      a_end = 1 + below(n_chunk - 1) if n_chunk >= 2 else 1
      a_start, a_len = start + cum[first], cum[first + a_end] - cum[first]
      if n_chunk == 1 or rng.random() < 0.5:
        label = NOT_NEXT
        target_b_length = target_seq_length - a_len
        other = below(num_docs - 1)
        if other >= doc_index:  # uniform over the *other* documents
          other += 1
        other_lengths = window.sentence_lengths[other]
        b_first = below(len(other_lengths))
        b_len = 0
        for n in other_lengths[b_first:]:
          b_len += n
          if b_len >= target_b_length:
            break
        b_start = window.doc_starts[other] + cums[other][b_first]
        # The unused rest of this chunk is not wasted: it starts the next one.
        i -= n_chunk - a_end
      else:
        label = IS_NEXT
        b_start, b_len = a_start + a_len, cum[i + 1] - cum[first + a_end]
      yield _truncated(a_start, a_len, b_start, b_len, label, max_num_tokens, rng)
      first = i + 1
    i += 1


def pair_spans(window: Window, max_seq_length: int, dupe_factor: int,
               rng: random.Random) -> Iterator[Span]:
  """Tab-format pairs: every document is exactly (first half, second half).

  B is the document's own second half (IsNext) or, with probability 0.5, the
  second half of another document of the window (NotNext).
  """
  _check_args(max_seq_length, 0.0, dupe_factor)
  if any(len(d) != 2 for d in window.sentence_lengths):
    raise ValueError("pair_spans needs documents of exactly two sentences")
  n = window.num_documents
  if n < 2:
    return
  max_num_tokens = max_seq_length - _SPECIALS_PER_PAIR
  starts, lengths = window.doc_starts, window.sentence_lengths
  for _ in range(dupe_factor):
    for index in range(n):
      label = NOT_NEXT if rng.random() < 0.5 else IS_NEXT
      other = index
      if label == NOT_NEXT:
        other = rng.randint(0, n - 2)
        if other >= index:
          other += 1
      a_len = lengths[index][0]
      b_start, b_len = starts[other] + lengths[other][0], lengths[other][1]
      yield _truncated(starts[index], a_len, b_start, b_len, label, max_num_tokens, rng)


def _truncated(a_start: int, a_len: int, b_start: int, b_len: int, label: int,
               max_num_tokens: int, rng: random.Random) -> Span:
  a_front, a_back, b_front, b_back = _trim_counts(a_len, b_len, max_num_tokens, rng)
  return (a_start + a_front, a_len - a_front - a_back, b_start + b_front,
          b_len - b_front - b_back, label)


# Up to this many cuts (~2 ms), the reference's draws; above, one binomial count per
# side, seeded by one draw (a deviation: docs/deviations.md).
EXACT_CUTS = 1 << 16


def _trim_counts(a_len: int, b_len: int, max_num_tokens: int,
                 rng: random.Random) -> tuple[int, int, int, int]:
  """(front, back) tokens to cut from A and from B: `truncate_seq_pair` on lengths.

  Which side loses each token does not depend on the draws: the longer side
  alone until the two are within one (ties cut B), then B and A in turn (after
  A's cuts the two are equal and a tie cuts B; after B's, B is one shorter). So
  the cuts per side are closed forms, and only each cut's front/back choice is
  random (one `random() < 0.5` per cut, in the reference's order): O(1) Python
  steps per pair, the draws of up to EXACT_CUTS cuts in one call.
  """
  excess = a_len + b_len - max_num_tokens
  if excess <= 0:
    return 0, 0, 0, 0
  first_is_a = a_len > b_len
  d1 = min(a_len - b_len, excess) if first_is_a else min(b_len - a_len + 1, excess)
  e2 = excess - d1
  turns_first, turns_second = (e2 + 1) // 2, e2 // 2  # B first if phase 1 cut A
  cuts_a = d1 + turns_second if first_is_a else turns_first
  cuts_b = excess - cuts_a
  if excess > EXACT_CUTS:
    sub = np.random.default_rng(rng.getrandbits(64))
    a_front, b_front = int(sub.binomial(cuts_a, 0.5)), int(sub.binomial(cuts_b, 0.5))
  else:
    front_N = _front_draws(excess, rng)
    # A's cuts: phase 1's if they were A's, and every other draw of phase 2
    # (the even turns when A went first there, the odd ones otherwise).
    a_turns = front_N[d1 + 1::2] if first_is_a else front_N[d1::2]
    a_front = int(np.count_nonzero(a_turns)) + (int(np.count_nonzero(front_N[:d1]))
                                                 if first_is_a else 0)
    b_front = int(np.count_nonzero(front_N)) - a_front
  return a_front, cuts_a - a_front, b_front, cuts_b - b_front


def _front_draws(k: int, rng: random.Random) -> np.ndarray:
  """bool [k]: k draws `rng.random() < 0.5` (a random side, so text does not always end
  at a boundary), leaving rng as those draws would. random() uses two 32-bit Mersenne
  Twister outputs and is < 0.5 exactly when the first one's top bit is 0;
  getrandbits(64 k) returns the same 2k outputs, first in the lowest 32 bits."""
  if k < 64:
    draw = rng.random
    return np.fromiter((draw() < 0.5 for _ in range(k)), bool, k)
  words = np.frombuffer(rng.getrandbits(64 * k).to_bytes(8 * k, "little"), dtype="<u4")
  return words[0::2] < 2**31


def truncate_seq_pair(tokens_a: list[int], tokens_b: list[int], max_num_tokens: int,
                      rng: random.Random) -> None:
  """Trims the longer list, from the front or back at random, until the pair fits."""
  a_front, a_back, b_front, b_back = _trim_counts(len(tokens_a), len(tokens_b),
                                                  max_num_tokens, rng)
  tokens_a[:] = tokens_a[a_front:len(tokens_a) - a_back]
  tokens_b[:] = tokens_b[b_front:len(tokens_b) - b_back]


# --- spans -> arrays ---


def examples_from_spans(tokens_T: np.ndarray, spans_Kx5: np.ndarray, max_seq_length: int,
                        cls_id: int, sep_id: int) -> dict[str, np.ndarray]:
  """`[CLS] A [SEP] B [SEP]` arrays: ids, segments, mask int32 [K, L], labels int32 [K]."""
  L = max_seq_length
  a_len_Kx1, b_len_Kx1 = spans_Kx5[:, 1:2], spans_Kx5[:, 3:4]
  n_a_Kx1 = a_len_Kx1 + 2  # [CLS] A [SEP]
  n_Kx1 = n_a_Kx1 + b_len_Kx1 + 1
  pos_1xL = np.arange(L)[None, :]
  return {
      "input_ids": input_ids(tokens_T, spans_Kx5, L, cls_id, sep_id),
      "segment_ids": ((pos_1xL >= n_a_Kx1) & (pos_1xL < n_Kx1)).astype(np.int32),
      "input_mask": (pos_1xL < n_Kx1).astype(np.int32),
      "next_sentence_label": spans_Kx5[:, 4].astype(np.int32),
  }


def input_ids(tokens_T: np.ndarray, spans_Kx5: np.ndarray, max_seq_length: int, cls_id: int,
              sep_id: int) -> np.ndarray:
  """int32 [K, L]: the spans' tokens laid out as `[CLS] A [SEP] B [SEP]`, zero-padded."""
  K, L = len(spans_Kx5), max_seq_length
  a_start_Kx1, a_len_Kx1 = spans_Kx5[:, 0:1], spans_Kx5[:, 1:2]
  b_start_Kx1, b_len_Kx1 = spans_Kx5[:, 2:3], spans_Kx5[:, 3:4]
  if K and (a_len_Kx1 + b_len_Kx1 + _SPECIALS_PER_PAIR).max() > L:
    raise ValueError(f"a span does not fit in max_seq_length {L}")
  pos_1xL = np.arange(L)[None, :]
  in_a_KxL = (pos_1xL >= 1) & (pos_1xL <= a_len_Kx1)
  b_pos_KxL = pos_1xL - a_len_Kx1 - 2
  in_b_KxL = (b_pos_KxL >= 0) & (b_pos_KxL < b_len_Kx1)
  source_KxL = np.where(in_a_KxL, a_start_Kx1 + pos_1xL - 1, b_start_Kx1 + b_pos_KxL)
  ids_KxL = np.where(in_a_KxL | in_b_KxL, tokens_T[np.where(in_a_KxL | in_b_KxL, source_KxL, 0)],
                     0).astype(np.int32)
  rows_K = np.arange(K)
  ids_KxL[:, 0] = cls_id
  ids_KxL[rows_K, a_len_Kx1[:, 0] + 1] = sep_id
  ids_KxL[rows_K, (a_len_Kx1 + b_len_Kx1)[:, 0] + 2] = sep_id
  return ids_KxL
