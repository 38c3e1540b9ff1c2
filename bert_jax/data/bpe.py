"""Byte-level BPE (ModernBERT's kind of tokenizer), and which tokenizer a run has.

A `BpeTokenizer` is a HuggingFace `tokenizer.json` (a published ModernBERT's, passed as
`data.vocab_file`) or one trained on the corpus's train split during preparation
(`data.tokenizer='bpe'`: byte-level, so no text is ever [UNK], with the five special
tokens first, [PAD] at id 0). It offers what the rest of bert-jax asks of the WordPiece
`Tokenizer`: ids without special tokens, the special ids, the vocabulary in id order,
save and load.

Text that spells a special token ("[CLS]") is ordinary text here too
(`encode_special_tokens`): special ids come only from where bert-jax places them.
The functions at the bottom pick the kind: from a prepared folder (`load`), from a
checkpoint's meta (`from_meta`, `to_meta`) and from a vocabulary file (`from_file`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Union

import numpy as np
import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

from bert_jax.data.tokenizer import CONFIG_FILE, SPECIAL_TOKENS, Tokenizer, Vocabulary
from bert_jax.errors import ConfigError, stoppable
from bert_jax.storage import fs

KIND = "bpe"
TOKENIZER_JSON = "tokenizer.json"
KINDS = ("wordpiece", KIND)  # data.tokenizer


class BpeTokenizer(Vocabulary):
  """A HuggingFace BPE tokenizer with BERT's five special tokens somewhere in it."""

  def __init__(self, hf_json: str, source: str = "tokenizer.json"):
    try:
      hf = tokenizers.Tokenizer.from_str(hf_json)
    except Exception as e:  # pylint: disable=broad-except  # tokenizers raises its own
      raise ConfigError(f"{source}: not a HuggingFace tokenizer.json ({e})") from None
    if not isinstance(hf.model, models.BPE):
      raise ConfigError(f"{source}: a {type(hf.model).__name__} tokenizer; expected BPE (a "
                        "WordPiece vocabulary is a vocab.txt)")
    ids = hf.get_vocab(with_added_tokens=True)
    vocab = [None] * len(ids)
    for tok, i in ids.items():
      if not 0 <= i < len(vocab):
        raise ConfigError(f"{source}: token ids are not 0..{len(ids) - 1} (id {i} of {tok!r})")
      if vocab[i] is not None:  # else a gap (None) in the vocabulary a checkpoint keeps
        first, second = sorted((vocab[i], tok))
        raise ConfigError(f"{source}: tokens {first!r} and {second!r} share id {i}; expected "
                          "one token per id")
      vocab[i] = tok
    missing = [t for t in SPECIAL_TOKENS if t not in ids]
    if missing:
      raise ConfigError(f"{source} has no {missing[0]} token (bert-jax needs "
                        f"{', '.join(SPECIAL_TOKENS)})")
    hf.encode_special_tokens = True  # "[CLS]" in text is text, as with WordPiece
    hf.no_padding()
    hf.no_truncation()
    self._hf, self._json, self._vocab, self._ids = hf, hf_json, vocab, ids
    # Read once: the file's text is megabytes for a 50k vocabulary.
    self._lowercase = "Lowercase" in json.dumps(json.loads(hf_json).get("normalizer"))

  @classmethod
  def train(cls, texts: Union[Iterable[str], Callable[[], Iterable[str]]], vocab_size: int,
            lowercase: bool) -> BpeTokenizer:
    """Learns a byte-level BPE of at most `vocab_size` tokens: the special tokens, the 256
    bytes, then merges in the order learned (the same text gives the same vocabulary)."""
    if vocab_size <= len(SPECIAL_TOKENS) + 256:
      raise ConfigError(f"data.vocab_size must be more than {len(SPECIAL_TOKENS) + 256} for "
                        f"data.tokenizer='bpe' (5 special tokens and 256 bytes), got {vocab_size}")
    hf = tokenizers.Tokenizer(models.BPE())
    if lowercase:
      hf.normalizer = normalizers.Lowercase()
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    hf.train_from_iterator(texts() if callable(texts) else texts, trainer=trainer)
    # For its users after export (transformers' tokenizer(text) adds them): bert-jax
    # itself encodes without special tokens and places them where they belong.
    cls_, sep = SPECIAL_TOKENS[2], SPECIAL_TOKENS[3]
    hf.post_processor = processors.TemplateProcessing(
        single=f"{cls_} $A {sep}", pair=f"{cls_} $A {sep} $B:1 {sep}:1",
        special_tokens=[(t, hf.token_to_id(t)) for t in (cls_, sep)])
    return cls(hf.to_str(), source="trained BPE")

  @classmethod
  def from_file(cls, path: str) -> BpeTokenizer:
    try:
      with fs.open(path, encoding="utf-8") as f:
        return cls(f.read(), source=f"vocab file '{path}'")
    except (OSError, UnicodeDecodeError) as e:
      raise ConfigError(f"vocab file '{path}': cannot read it ({e}); expected a HuggingFace "
                        "tokenizer.json") from None

  def save(self, directory: str) -> str:
    """Writes tokenizer.json and tokenizer_config.json; returns the tokenizer.json path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, TOKENIZER_JSON)
    fs.write_text(path, self._json)
    fs.write_text(os.path.join(directory, CONFIG_FILE),
                  json.dumps({"kind": KIND, "lowercase": self.lowercase}) + "\n")
    return path

  @property
  def json(self) -> str:
    """The tokenizer.json text (what a checkpoint's meta and an export keep)."""
    return self._json

  # --- encoding ---

  def encode(self, text: str) -> list[int]:
    return self._hf.encode(text, add_special_tokens=False).ids

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return [e.ids for e in self._hf.encode_batch(list(texts), add_special_tokens=False)]

  def encode_batch_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """All texts' ids concatenated, int32 [T], and each text's length, int64 [N]."""
    ids = self.encode_batch(texts)
    lengths = np.array([len(x) for x in ids], np.int64)
    flat = np.fromiter((i for x in ids for i in x), np.int32, int(lengths.sum()))
    return flat, lengths

  def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
    skip = set(self.special_ids()) if skip_special_tokens else set()
    return self._hf.decode([int(i) for i in ids if int(i) not in skip],
                           skip_special_tokens=False)

  @property
  def backend(self) -> tokenizers.Tokenizer:
    return self._hf

  # --- vocabulary facts ---

  @property
  def lowercase(self) -> bool:
    """Whether the normalizer lowercases (the file decides, not data.lowercase)."""
    return self._lowercase

  def is_continuation(self) -> np.ndarray:
    """No piece is marked as continuing a word (whole-word masking is WordPiece's)."""
    return np.zeros(self.vocab_size, bool)

  def __repr__(self) -> str:
    return f"BpeTokenizer(vocab_size={self.vocab_size})"


AnyTokenizer = Union[Tokenizer, BpeTokenizer]


def load(directory: str) -> AnyTokenizer:
  """What `save` (of either kind) wrote in `directory`."""
  if fs.exists(os.path.join(directory, TOKENIZER_JSON)):
    return BpeTokenizer.from_file(os.path.join(directory, TOKENIZER_JSON))
  return Tokenizer.load(directory)


def from_file(path: str, lowercase: bool) -> AnyTokenizer:
  """`data.vocab_file`: a HuggingFace tokenizer.json (any name ending in .json), else a
  WordPiece vocab.txt (with `lowercase`)."""
  if str(path).endswith(".json"):
    return BpeTokenizer.from_file(path)
  return Tokenizer.from_vocab_file(path, lowercase)


def train(kind: str, texts: Callable[[], Iterable[str]], vocab_size: int,
          lowercase: bool) -> AnyTokenizer:
  """A vocabulary of `kind` learned from `texts`, in a thread this one watches: native
  work that SIGTERM stops at once (a preemption notice gives 30 s), not when it ends."""
  return stoppable(lambda: (BpeTokenizer if kind == KIND else Tokenizer).train(
      texts, vocab_size, lowercase), "training the vocabulary")


def to_meta(tokenizer: AnyTokenizer) -> dict:
  """The tokenizer in a checkpoint's meta: the vocabulary and lowercase flag (both kinds),
  and a BPE's whole tokenizer.json (its merges)."""
  out = {"vocab": tokenizer.vocab, "lowercase": tokenizer.lowercase}
  if isinstance(tokenizer, BpeTokenizer):
    out["tokenizer_json"] = tokenizer.json
  return out


def from_meta(meta: dict, source: str) -> AnyTokenizer:
  """The tokenizer `to_meta` described; `source` names it in errors."""
  if meta.get("tokenizer_json"):
    return BpeTokenizer(meta["tokenizer_json"], source=source)
  return Tokenizer(meta["vocab"], bool(meta["lowercase"]), source=source)
