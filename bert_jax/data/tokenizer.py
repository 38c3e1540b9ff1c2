"""WordPiece tokenizer (BERT's), built on HuggingFace `tokenizers`.

One `Tokenizer` is either trained on a corpus or loaded from a google-style
`vocab.txt`; both are rebuilt from the same token list so a saved and reloaded
tokenizer gives identical ids.

Speed: HF's full pipeline costs a few microseconds per token, mostly in its
normalizer and per-token bookkeeping (offsets, token strings). `encode_batch`
gets the same ids over 10x faster: the normalizer is applied per character
through a table filled from HF's own normalizer (context-free: cleaning,
lowercasing, accent stripping and CJK spacing work character by character),
text is split at whitespace and punctuation as BertPreTokenizer does (`str.split`,
then `re` within each chunk), and each distinct word goes through HF's
WordPiece model once; words and whitespace-delimited chunks are cached.
Texts where this could differ go through HF's full pipeline: combining marks
that NFD would reorder. Text that spells a special token (`[MASK]`) is ordinary
text, split into pieces as google-research/bert splits it. tests/test_tokenizer.py checks equality on the built-in corpus and
on random text.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

import numpy as np
import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

from bert_jax.storage import fs
from bert_jax.errors import ConfigError

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)
CONTINUATION_PREFIX = "##"


class SpecialIds(NamedTuple):
  """A vocabulary's ids of [PAD], [UNK], [CLS], [SEP] and [MASK]: the one record of them
  that masking, packing, the train step and an export's config.json read by name."""
  pad: int
  unk: int
  cls: int
  sep: int
  mask: int
VOCAB_FILE = "vocab.txt"
CONFIG_FILE = "tokenizer_config.json"
# Longer "words" (URLs, base64, ...) become [UNK] rather than dozens of pieces.
_MAX_CHARS_PER_WORD = 100
# Fast path: after the per-character table, text is split on whitespace into
# chunks ("end.", "(see"), and a chunk into words: runs of anything but ASCII
# punctuation, which is a word of its own (so is non-ASCII punctuation, which
# the table pads with spaces). "\x00" (a control character, so never in
# cleaned text) separates the texts of a batch and marks their ends.
_ASCII_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_WORDS = re.compile(r"[^!-/:-@\[-`{-~]+|[!-/:-@\[-`{-~]")
_TEXT_END = -1
_UNSAFE = "\x00"  # table value of a character the fast path cannot do exactly
# Distinct words and chunks kept; a cache is emptied when full (bounds memory).
_WORD_CACHE_SIZE = 1 << 18
_MAX_CACHED_CHUNK = 64  # characters; longer chunks (URLs, base64...) are split each time


def _continuation_chars(hf: tokenizers.Tokenizer, texts: Iterable[str]) -> set[str]:
  """The characters that follow another within a word of `texts`: the trainer's '##' pieces."""
  chars: set[str] = set()
  chunks: set[str] = set()

  def add_pending() -> None:
    for chunk in chunks:  # each distinct one once: most of a long sample repeats
      for word, _ in hf.pre_tokenizer.pre_tokenize_str(chunk):
        chars.update(word[1:])
    chunks.clear()

  def normalize(batch: list[str]) -> None:
    # Normalized text splits at whitespace as the pre-tokenizer does (the
    # normalizer has removed the control characters str.split() also splits at).
    chunks.update(hf.normalizer.normalize_str("\n".join(batch)).split())
    batch.clear()
    if len(chunks) > 100_000:  # bounded memory over a long sample
      add_pending()

  batch: list[str] = []
  size = 0
  for text in texts:
    batch.append(text)
    size += len(text)
    if size > 1 << 20:  # one normalizer call per megabyte, not per sentence
      normalize(batch)
      size = 0
  normalize(batch)
  add_pending()
  return chars


class Vocabulary:
  """What a tokenizer of either kind (this WordPiece, data/bpe's BPE) tells about its
  tokens: `_vocab` (tokens in id order) and `_ids` (token -> id), set by the subclass."""

  _vocab: list[str]
  _ids: dict[str, int]

  def id_to_token(self, i: int) -> str:
    return self._vocab[int(i)]

  def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
    return [self._vocab[int(i)] for i in ids]

  def token_to_id(self, token: str) -> int | None:
    return self._ids.get(token)

  @property
  def vocab(self) -> list[str]:
    """Tokens in id order."""
    return list(self._vocab)

  @property
  def vocab_size(self) -> int:
    return len(self._vocab)

  @property
  def pad_id(self) -> int:
    return self._ids[PAD]

  @property
  def unk_id(self) -> int:
    return self._ids[UNK]

  @property
  def cls_id(self) -> int:
    return self._ids[CLS]

  @property
  def sep_id(self) -> int:
    return self._ids[SEP]

  @property
  def mask_id(self) -> int:
    return self._ids[MASK]

  def special_ids(self) -> SpecialIds:
    """Ids of [PAD], [UNK], [CLS], [SEP], [MASK], by name."""
    return SpecialIds(*(self._ids[t] for t in SPECIAL_TOKENS))


class Tokenizer(Vocabulary):
  """BERT WordPiece: normalize, split on whitespace/punctuation, word pieces."""

  def __init__(self, vocab: Sequence[str], lowercase: bool, source: str = "vocabulary"):
    """Builds from tokens in id order; `source` names the vocab in errors."""
    self._vocab = list(vocab)
    self._lowercase = bool(lowercase)
    ids: dict[str, int] = {}
    for i, tok in enumerate(self._vocab):
      if tok in ids:
        raise ConfigError(f"{source}: token {tok!r} at id {i} repeats id {ids[tok]}")
      ids[tok] = i
    missing = [t for t in SPECIAL_TOKENS if t not in ids]
    if missing:
      raise ConfigError(
          f"{source} has no {missing[0]} token (BERT needs {', '.join(SPECIAL_TOKENS)})")
    if ids[PAD] != 0:
      raise ConfigError(f"{source} has {PAD} at id {ids[PAD]}; expected id 0 (padding is 0)")
    self._ids = ids
    hf = tokenizers.Tokenizer(models.WordPiece(
        vocab=ids, unk_token=UNK, continuing_subword_prefix=CONTINUATION_PREFIX,
        max_input_chars_per_word=_MAX_CHARS_PER_WORD))
    hf.normalizer = _normalizer(self._lowercase)
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    hf.decoder = decoders.WordPiece(prefix=CONTINUATION_PREFIX)
    # No added tokens: text that spells "[CLS]", "[SEP]", "[MASK]" or "[PAD]" becomes
    # ordinary pieces ("[", "cl", "##s", "]"), as google-research/bert's tokenizer makes
    # them. Special ids come only from where bert-jax places them (a row's [CLS] and
    # [SEP], masking's [MASK], padding), so a packed row's [CLS] tokens are exactly the
    # document starts its preparation wrote.
    self._hf = hf
    self._chunks = _ChunkCache(_WordCache(hf.model, ids[UNK]))
    self._chars = _CharTable(hf, self._lowercase)

  # --- construction ---

  @classmethod
  def train(cls, texts: Iterable[str] | Callable[[], Iterable[str]], vocab_size: int,
            lowercase: bool) -> Tokenizer:
    """Learns a WordPiece vocab of at most `vocab_size` tokens, specials first.

    The same text gives the same vocabulary in every process. `texts` is read
    twice: pass a function that returns a fresh iterable to stream a large
    sample (a one-shot iterator is kept in memory).
    """
    if vocab_size <= len(SPECIAL_TOKENS):
      raise ConfigError(
          f"data.vocab_size must be more than {len(SPECIAL_TOKENS)}, got {vocab_size}")
    if callable(texts):
      read = texts
    else:
      kept = texts if iter(texts) is not texts else list(texts)
      read = lambda: kept  # noqa: E731
    hf = tokenizers.Tokenizer(models.WordPiece(
        unk_token=UNK, continuing_subword_prefix=CONTINUATION_PREFIX))
    hf.normalizer = _normalizer(lowercase)
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    # The trainer numbers the '##' pieces it makes in hash-map order, which
    # differs in every process and call, and those numbers break ties between
    # equally frequent merges (huggingface/tokenizers#1794): two trainings on
    # the same text gave different vocabularies. Named up front, in sorted
    # order, the pieces get fixed numbers and the result is always the same.
    pieces = [CONTINUATION_PREFIX + ch for ch in sorted(_continuation_chars(hf, read()))]
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS) + pieces,
        continuing_subword_prefix=CONTINUATION_PREFIX, show_progress=False)
    hf.train_from_iterator(read(), trainer=trainer)
    by_id = sorted(hf.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
    specials, rest = [t for t, _ in by_id[:len(SPECIAL_TOKENS)]], [t for t, _ in by_id[len(SPECIAL_TOKENS):]]
    seeded = set(pieces)
    # The order an unseeded trainer gives: the alphabet, its '##' pieces, the merges.
    vocab = (specials + [t for t in rest if len(t) == 1] + [t for t in rest if t in seeded]
             + [t for t in rest if len(t) > 1 and t not in seeded])
    # The trainer can exceed the target when the corpus alphabet alone is bigger.
    return cls(vocab[:vocab_size], lowercase, source="trained vocabulary")

  @classmethod
  def from_vocab_file(cls, path: str, lowercase: bool) -> Tokenizer:
    """Loads a google-style vocab.txt (one token per line; line number = id)."""
    if not os.path.exists(path):
      raise ConfigError(f"vocab file '{path}' does not exist")
    if os.path.isdir(path):
      raise ConfigError(f"vocab file '{path}' is a directory; expected a vocab.txt file")
    try:  # utf-8-sig: a byte order mark (some editors write one) is not part of token 0
      with fs.open(path, encoding="utf-8-sig") as f:
        lines = f.read().splitlines()
    except UnicodeDecodeError as e:
      raise ConfigError(f"vocab file '{path}' is not UTF-8 (byte offset {e.start}); expected "
                        "UTF-8 text, one token per line") from None
    vocab: list[str] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(lines, start=1):
      tok = line.strip()
      if not tok:
        raise ConfigError(f"vocab file '{path}' line {lineno} is blank; expected one token")
      if tok in seen:
        raise ConfigError(
            f"vocab file '{path}' line {lineno} repeats token {tok!r} (first on line {seen[tok]}); "
            "expected each token once")
      seen[tok] = lineno
      vocab.append(tok)
    return cls(vocab, lowercase, source=f"vocab file '{path}'")

  @classmethod
  def load(cls, directory: str) -> Tokenizer:
    """Reads back what `save` wrote."""
    config_path = os.path.join(directory, CONFIG_FILE)
    try:
      with fs.open(config_path, encoding="utf-8") as f:
        config = json.load(f)
      lowercase = config["lowercase"]
    except (OSError, ValueError, KeyError, TypeError):
      raise ConfigError(
          f"tokenizer config '{config_path}' is missing or not JSON with a 'lowercase' field"
      ) from None
    return cls.from_vocab_file(os.path.join(directory, VOCAB_FILE), bool(lowercase))

  def save(self, directory: str) -> str:
    """Writes vocab.txt and tokenizer_config.json; returns the vocab.txt path."""
    os.makedirs(directory, exist_ok=True)
    vocab_path = os.path.join(directory, VOCAB_FILE)
    _write_atomic(vocab_path, "".join(tok + "\n" for tok in self._vocab))
    _write_atomic(os.path.join(directory, CONFIG_FILE),
                  json.dumps({"lowercase": self._lowercase}) + "\n")
    return vocab_path

  # --- encoding ---

  def encode(self, text: str) -> list[int]:
    """Word-piece ids of `text`, no special tokens added."""
    return self.encode_batch([text])[0]

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """Like `encode` for many texts (fast path for ASCII, see the module doc)."""
    ids, lengths = self.encode_batch_flat(texts)
    ends = np.cumsum(lengths)
    return [ids[e - n:e].tolist() for e, n in zip(ends.tolist(), lengths.tolist())]

  def encode_batch_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """All texts' ids concatenated, int32 [T], and each text's length, int64 [N]."""
    ready: list[str] = []
    slow: list[int] = []
    for i, text in enumerate(texts):
      if not text.isascii():
        text = text.translate(self._chars)
        if _UNSAFE in text:
          text, _ = "", slow.append(i)
      elif "\n" in text:
        text = text.replace("\n", " ")  # "\n" separates the texts below
      ready.append(text)
    flat, lengths = self._encode_ready(ready)
    if not slow:
      return flat, lengths
    # Full pipeline in Rust for the few texts the fast path cannot do.
    slow_ids = dict(zip(slow, (e.ids for e in self._hf.encode_batch(
        [texts[i] for i in slow], add_special_tokens=False))))
    pieces = np.split(flat, np.cumsum(lengths)[:-1])
    for i, ids in slow_ids.items():
      pieces[i] = np.asarray(ids, np.int32)
    lengths = np.array([len(p) for p in pieces], np.int64)
    return np.concatenate(pieces).astype(np.int32, copy=False), lengths

  def _encode_ready(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Texts that are ASCII or went through the table, none with "\n"."""
    if not texts:
      return np.zeros(0, np.int32), np.zeros(0, np.int64)
    # ASCII texts still need cleaning and lowercasing; for table output both
    # are no-ops, so one pass over the joined text does all.
    joined = _ASCII_CONTROL.sub("", "\n".join(texts))
    if self._lowercase:
      joined = joined.lower()
    chunks = joined.replace("\n", " \x00 ").split()
    chunks.append("\x00")
    flat = np.array(list(itertools.chain.from_iterable(map(self._chunks.lookup, chunks))),
                    np.int32)
    ends = np.flatnonzero(flat == _TEXT_END)
    lengths = np.diff(ends, prepend=-1) - 1
    return flat[flat != _TEXT_END], lengths

  def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
    """Text of `ids` with word pieces joined (without [PAD], [UNK], [CLS], [SEP], [MASK]
    when `skip_special_tokens`)."""
    skip = set(self.special_ids()) if skip_special_tokens else set()
    return self._hf.decode([int(i) for i in ids if int(i) not in skip])

  def hf_json(self) -> str:
    """This vocabulary as the tokenizer.json transformers' fast BERT tokenizer saves:
    BERT's normalizer and pre-tokenizer, `[CLS] A [SEP] B [SEP]` added by its post-
    processor, the five special tokens as special added tokens (transformers 5 saves
    only this file; 4.x reads it beside vocab.txt)."""
    from tokenizers.implementations import BertWordPieceTokenizer  # pylint: disable=import-outside-toplevel
    hf = BertWordPieceTokenizer(dict(self._ids), lowercase=self._lowercase,
                                strip_accents=self._lowercase, clean_text=True,
                                handle_chinese_chars=True, wordpieces_prefix=CONTINUATION_PREFIX)
    return hf.to_str()

  @property
  def backend(self) -> tokenizers.Tokenizer:
    """The HF `tokenizers.Tokenizer` behind this one (its full pipeline; read only)."""
    return self._hf

  @property
  def lowercase(self) -> bool:
    return self._lowercase

  def is_continuation(self) -> np.ndarray:
    """bool [vocab_size]: True for `##` pieces (they continue the previous word)."""
    return np.array([t.startswith(CONTINUATION_PREFIX) for t in self._vocab], dtype=bool)

  def __repr__(self) -> str:
    return f"Tokenizer(vocab_size={self.vocab_size}, lowercase={self._lowercase})"


class _CharTable(dict):
  """`str.translate` table: code point -> what HF's normalizer and pre-tokenizer make of it.

  Filled on first sight of each character, from HF's own normalizer (so the
  Unicode tables are HF's). Punctuation is padded with spaces, whitespace
  becomes " ". ASCII stays as is except control characters (dropped) and
  "\t\n\r" (" "); `encode_batch_flat` lowercases the joined text.
  """

  def __init__(self, hf: tokenizers.Tokenizer, lowercase: bool):
    super().__init__()
    self._normalizer = hf.normalizer
    self._pre_tokenizer = hf.pre_tokenizer
    for c in range(128):
      ch = chr(c)
      self[c] = " " if ch in "\t\n\r" else "" if _ASCII_CONTROL.match(ch) else (
          ch.lower() if lowercase else ch)

  def __missing__(self, code: int) -> str:
    out = []
    for ch in self._normalizer.normalize_str(chr(code)):
      words = [w for w, _ in self._pre_tokenizer.pre_tokenize_str(f"a{ch}a")]
      if len(words) == 2:  # whitespace
        out.append(" ")
      elif len(words) == 3:  # punctuation: a word of its own
        out.append(f" {ch} ")
      elif ch.isspace() or unicodedata.combining(ch) or unicodedata.category(ch) == "Cn":
        # Whitespace to str.split() but not to HF would split a word in two;
        # NFD may reorder a combining mark with its neighbours; "Cn": a
        # character newer than Python's Unicode tables, which cannot tell.
        out = [_UNSAFE]
        break
      else:
        out.append(ch)
    self[code] = value = "".join(out)
    return value


class _WordCache(dict):
  """word -> tuple of WordPiece ids, from the HF model itself (so ids are HF's)."""

  def __init__(self, model: models.WordPiece, unk_id: int):
    super().__init__()
    self._model = model
    self._unk = (unk_id,)
    self.lookup = self.__getitem__

  def __missing__(self, word: str) -> tuple[int, ...]:
    if len(word) > _MAX_CHARS_PER_WORD:
      return self._unk  # what WordPiece gives; not cached (could be megabytes)
    ids = tuple(t.id for t in self._model.tokenize(word))
    if len(self) >= _WORD_CACHE_SIZE:
      self.clear()
    self[word] = ids
    return ids


class _ChunkCache(dict):
  """Whitespace-delimited chunk ("end.") -> ids of its words; most text is a hit."""

  def __init__(self, words: _WordCache):
    super().__init__()
    self._words = words
    self[_UNSAFE] = (_TEXT_END,)
    self.lookup = self.__getitem__

  def __missing__(self, chunk: str) -> tuple[int, ...]:
    ids = tuple(itertools.chain.from_iterable(map(self._words.lookup, _WORDS.findall(chunk))))
    if len(chunk) <= _MAX_CACHED_CHUNK:
      if len(self) >= _WORD_CACHE_SIZE:
        self.clear()
        self[_UNSAFE] = (_TEXT_END,)
      self[chunk] = ids
    return ids


def _normalizer(lowercase: bool) -> normalizers.Normalizer:
  return normalizers.BertNormalizer(
      clean_text=True, handle_chinese_chars=True, strip_accents=lowercase, lowercase=lowercase)


def _write_atomic(path: str, text: str) -> None:
  # A crash mid-write must never leave a truncated vocab that a later run loads.
  fs.write_atomic_local(path, lambda f: f.write(text.encode("utf-8")))
