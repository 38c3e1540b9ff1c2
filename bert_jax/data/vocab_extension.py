"""Vocabulary extension of a continued run (`--config.data.extend_vocab=N`).

A general vocabulary shreds domain words into many pieces. Extension learns up
to N new WordPieces from the corpus: whole words that occur at least
`MIN_COUNT` times and that the source vocabulary splits into two or more pieces
(none of them [UNK]), most frequent first (ties: alphabetical). They are
appended after the source's ids, so no existing id moves, and since WordPiece
matches the longest prefix first, a new word now is one piece wherever it
stands as a word of its own (it is added without `##`).

A new word's embedding row (and its MLM output bias) starts as the mean of the
source rows of the pieces the source used for it (`extend_hf_state`).

Data side: no JAX. Words are counted with the source tokenizer's own
normalizer and pre-tokenizer, on the training split's text (the sample a
trained vocabulary would learn from: `data.vocab_sample_bytes`).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Mapping

import numpy as np

from bert_jax.data.tokenizer import CONTINUATION_PREFIX, Tokenizer

MIN_COUNT = 2  # a word seen once is not "frequent"
_MAX_WORD_CHARS = 100  # longer "words" are [UNK] to WordPiece (tokenizer._MAX_CHARS_PER_WORD)
# HF names of the tensors with one row per token (BertModel and BertForPreTraining spellings).
_EMBEDDINGS = ("bert.embeddings.word_embeddings.weight", "embeddings.word_embeddings.weight")
_BIASES = ("cls.predictions.bias", "cls.predictions.decoder.bias")


@dataclasses.dataclass(frozen=True)
class Extension:
  """The new words, in new-id order, with the source piece ids of each; and what was asked."""
  words: tuple[str, ...]
  pieces: tuple[tuple[int, ...], ...]
  counts: tuple[int, ...]
  asked: int
  offered: int  # candidate words the corpus had (>= len(words))

  def describe(self, first_id: int) -> str:
    shown = ", ".join(f"{w!r} ({c}x, was {len(p)} pieces)"
                      for w, c, p in list(zip(self.words, self.counts, self.pieces))[:8])
    more = f" and {len(self.words) - 8} more" if len(self.words) > 8 else ""
    short = ("" if len(self.words) == self.asked else
             f" (asked for {self.asked}; the corpus offers only {self.offered} words seen "
             f">= {MIN_COUNT} times that the source vocabulary splits)")
    ids = f" as ids {first_id}-{first_id + len(self.words) - 1}" if self.words else ""
    return f"added {len(self.words)} new WordPieces{short}{ids}: {shown}{more}"


def count_words(tokenizer: Tokenizer, texts: Iterable[str]) -> collections.Counter:
  """Words as the tokenizer sees them (normalized, split at whitespace and punctuation)."""
  normalize = tokenizer.backend.normalizer.normalize_str
  split = tokenizer.backend.pre_tokenizer.pre_tokenize_str
  counts: collections.Counter = collections.Counter()
  for text in texts:
    counts.update(w for w, _ in split(normalize(text)))
  return counts


def learn(tokenizer: Tokenizer, texts: Iterable[str], n: int,
          min_count: int = MIN_COUNT) -> Extension:
  """Up to `n` frequent words of `texts` that `tokenizer` splits into >= 2 known pieces."""
  model, unk = tokenizer.backend.model, tokenizer.unk_id
  candidates = []
  for word, count in count_words(tokenizer, texts).items():
    if count < min_count or len(word) > _MAX_WORD_CHARS or word.startswith(CONTINUATION_PREFIX):
      continue
    ids = tuple(t.id for t in model.tokenize(word))
    if len(ids) >= 2 and unk not in ids:
      candidates.append((-count, word, ids))
  candidates.sort()
  chosen = candidates[:n]
  return Extension(tuple(w for _, w, _ in chosen), tuple(p for _, _, p in chosen),
                   tuple(-c for c, _, _ in chosen), n, len(candidates))


def extended_tokenizer(tokenizer: Tokenizer, ext: Extension) -> Tokenizer:
  """`tokenizer` with the new words appended after its ids."""
  return Tokenizer(tokenizer.vocab + list(ext.words), tokenizer.lowercase,
                   source="extended vocabulary")


def extend_hf_state(state: Mapping[str, np.ndarray], ext: Extension) -> dict[str, np.ndarray]:
  """A HF state dict whose per-token tensors have one more row per new word: the mean
  of the rows of its source pieces (in float32). Other tensors are passed as they are."""
  out = dict(state)
  if not ext.words:
    return out
  for name in _EMBEDDINGS + _BIASES:
    if name in out:
      x = np.asarray(out[name], np.float32)
      new = np.stack([x[list(p)].mean(axis=0) for p in ext.pieces]).astype(np.float32)
      out[name] = np.concatenate([x, new])
  return out
