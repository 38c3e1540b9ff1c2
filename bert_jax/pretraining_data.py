"""Documents of token ids -> next-sentence-prediction sentence pairs.

A port of google-research/bert `create_pretraining_data.py`
(`create_instances_from_document` and `truncate_seq_pair`) without the
masking, which happens on device. Differences from the reference, both
deliberate: the NotNext document is drawn uniformly from the *other*
documents (the reference retries 10 times and may fall back to the same
one), and examples are streamed in generation order rather than shuffled
(the input pipeline shuffles every epoch). Tab-format corpora (one `A<TAB>B`
pair per line) use `create_pair_examples`, the tutorial's simpler scheme.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

import numpy as np

from bert_jax.errors import ConfigError

IS_NEXT = 0
NOT_NEXT = 1
FEATURES = ("input_ids", "segment_ids", "input_mask", "next_sentence_label")
_SPECIALS_PER_PAIR = 3  # [CLS] A [SEP] B [SEP]


def create_examples(documents: Sequence[Sequence[Sequence[int]]], max_seq_length: int,
                    short_seq_prob: float, dupe_factor: int, seed: int, cls_id: int,
                    sep_id: int) -> Iterator[dict[str, np.ndarray]]:
  """Yields `[CLS] A [SEP] B [SEP]` examples, zero-padded to `max_seq_length`.

  Each example: `input_ids`, `segment_ids`, `input_mask` int32 [max_seq_length]
  and `next_sentence_label` int32 scalar (0 = IsNext, 1 = NotNext). Empty
  sentences and documents are ignored; with fewer than two non-empty
  documents nothing is yielded (NotNext needs another document), so callers
  detect an unusable corpus by getting no examples.
  """
  _check_args(max_seq_length, short_seq_prob, dupe_factor)
  # Sentences are only read (pairs are built in fresh lists), so no copies.
  docs = [[s for s in d if len(s)] for d in documents]
  docs = [d for d in docs if d]
  return _examples(docs, max_seq_length, short_seq_prob, dupe_factor, seed, cls_id, sep_id)


def _examples(docs: list[list[Sequence[int]]], max_seq_length: int, short_seq_prob: float,
              dupe_factor: int, seed: int, cls_id: int,
              sep_id: int) -> Iterator[dict[str, np.ndarray]]:
  if len(docs) < 2:
    return
  rng = random.Random(seed)
  for _ in range(dupe_factor):
    for doc_index in range(len(docs)):
      for a, b, label in _pairs_from_document(docs, doc_index, max_seq_length, short_seq_prob,
                                              rng):
        yield _to_example(a, b, label, max_seq_length, cls_id, sep_id)


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
  return _pair_examples(pairs, max_seq_length, dupe_factor, seed, cls_id, sep_id)


def _pair_examples(pairs: list[Sequence[Sequence[int]]], max_seq_length: int,
                   dupe_factor: int, seed: int, cls_id: int,
                   sep_id: int) -> Iterator[dict[str, np.ndarray]]:
  if len(pairs) < 2:
    return
  rng = random.Random(seed)
  for _ in range(dupe_factor):
    for index, (first, second) in enumerate(pairs):
      label = NOT_NEXT if rng.random() < 0.5 else IS_NEXT
      if label == NOT_NEXT:
        other = rng.randint(0, len(pairs) - 2)
        if other >= index:
          other += 1
        second = pairs[other][1]
      tokens_a, tokens_b = list(first), list(second)
      truncate_seq_pair(tokens_a, tokens_b, max_seq_length - _SPECIALS_PER_PAIR, rng)
      yield _to_example(tokens_a, tokens_b, label, max_seq_length, cls_id, sep_id)


def _check_args(max_seq_length: int, short_seq_prob: float, dupe_factor: int) -> None:
  if max_seq_length < _SPECIALS_PER_PAIR + 2:
    raise ConfigError(f"max_seq_length must be at least 5 ([CLS] a [SEP] b [SEP]), "
                      f"got {max_seq_length}")
  if not 0.0 <= short_seq_prob <= 1.0:
    raise ConfigError(f"data.short_seq_prob must be in [0, 1], got {short_seq_prob}")
  if dupe_factor < 1:
    raise ConfigError(f"data.dupe_factor must be >= 1, got {dupe_factor}")


def _pairs_from_document(docs: list[list[list[int]]], doc_index: int, max_seq_length: int,
                         short_seq_prob: float,
                         rng: random.Random) -> Iterator[tuple[list[int], list[int], int]]:
  document = docs[doc_index]
  max_num_tokens = max_seq_length - _SPECIALS_PER_PAIR
  # Mostly fill the sequence (efficient), sometimes shorter so the model also
  # sees short inputs as at fine-tuning time. Chosen once per document, as in
  # the reference.
  target_seq_length = max_num_tokens
  if rng.random() < short_seq_prob:
    target_seq_length = rng.randint(2, max_num_tokens)

  chunk: list[list[int]] = []
  chunk_length = 0
  i = 0
  while i < len(document):
    chunk.append(document[i])
    chunk_length += len(document[i])
    if i == len(document) - 1 or chunk_length >= target_seq_length:
      a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
      tokens_a = [t for s in chunk[:a_end] for t in s]
      if len(chunk) == 1 or rng.random() < 0.5:
        label = NOT_NEXT
        target_b_length = target_seq_length - len(tokens_a)
        other = rng.randint(0, len(docs) - 2)
        if other >= doc_index:  # uniform over the *other* documents
          other += 1
        random_document = docs[other]
        tokens_b: list[int] = []
        for sentence in random_document[rng.randint(0, len(random_document) - 1):]:
          tokens_b.extend(sentence)
          if len(tokens_b) >= target_b_length:
            break
        # The unused rest of this chunk is not wasted: it starts the next one.
        i -= len(chunk) - a_end
      else:
        label = IS_NEXT
        tokens_b = [t for s in chunk[a_end:] for t in s]
      truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
      yield tokens_a, tokens_b, label
      chunk = []
      chunk_length = 0
    i += 1


def truncate_seq_pair(tokens_a: list[int], tokens_b: list[int], max_num_tokens: int,
                      rng: random.Random) -> None:
  """Trims the longer list, from the front or back at random, until the pair fits."""
  while len(tokens_a) + len(tokens_b) > max_num_tokens:
    longer = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
    # Random side so the model does not learn that text always ends at a boundary.
    if rng.random() < 0.5:
      del longer[0]
    else:
      longer.pop()


def _to_example(tokens_a: list[int], tokens_b: list[int], label: int, max_seq_length: int,
                cls_id: int, sep_id: int) -> dict[str, np.ndarray]:
  n_a = len(tokens_a) + 2  # [CLS] A [SEP]
  n = n_a + len(tokens_b) + 1
  input_ids = np.zeros(max_seq_length, np.int32)
  input_ids[:n] = [cls_id, *tokens_a, sep_id, *tokens_b, sep_id]
  segment_ids = np.zeros(max_seq_length, np.int32)
  segment_ids[n_a:n] = 1
  input_mask = np.zeros(max_seq_length, np.int32)
  input_mask[:n] = 1
  return {
      "input_ids": input_ids,
      "segment_ids": segment_ids,
      "input_mask": input_mask,
      "next_sentence_label": np.asarray(label, np.int32),
  }
