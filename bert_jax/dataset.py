"""Prepare pre-training data once (corpus -> WordPiece -> NSP pairs), store it
with TFDS as array_record, and reuse it on later runs.

Layout under `cache_dir`:

  <key>/                      `Prepared.directory`; key = hash of the settings
    settings.json             what the data was made from (for people)
    tokenizer/                vocab.txt + tokenizer_config.json
    bert_pretraining/seq<L>-<hash>/1.0.0/   TFDS dataset, splits 'train', 'eval'

`tokenizer/` is written last and atomically, so it marks a complete
preparation: a directory without it is debris of a failed run and is removed.
Each seq_len dataset is complete once TFDS has renamed its `incomplete.*` dir.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import logging
import os
import random
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any

import ml_collections
import numpy as np

from bert_jax import corpus
from bert_jax import pretraining_data
from bert_jax.errors import ConfigError, CorpusError
from bert_jax.tokenizer import VOCAB_FILE, Tokenizer

# Bump when the way examples are made changes, so old caches are not reused.
DATA_VERSION = 1
TOKENIZER_DIR = "tokenizer"
SETTINGS_FILE = "settings.json"
MIN_DOCS_PER_SPLIT = 2  # NotNext takes its B from another document of the split
_TOKENIZE_CHUNK = 10_000  # sentences per encode_batch call, bounds memory


@dataclasses.dataclass
class Prepared:
  """Prepared data: sources are random-access (`len(src)`, `src[i]` -> dict)."""
  tokenizer: Tokenizer
  train: dict[int, Any]
  eval: dict[int, Any]
  directory: str


def prepare(data_config: ml_collections.ConfigDict, seq_lens: Sequence[int], cache_dir: str,
            seed: int) -> Prepared:
  """Returns the data for every seq_len, preparing (only) what is not stored yet."""
  settings = _settings(data_config, seed)
  seq_lens = sorted({int(l) for l in seq_lens})
  for l in seq_lens:
    if l < 5:
      raise ConfigError(f"train.seq_lens must all be at least 5 ([CLS] a [SEP] b [SEP]), got {l}")
  directory = os.path.join(os.path.abspath(cache_dir), _hash(settings))
  tokenizer_dir = os.path.join(directory, TOKENIZER_DIR)
  complete = os.path.isfile(os.path.join(tokenizer_dir, VOCAB_FILE))
  with _quiet_tfds():
    missing = seq_lens if not complete else [
        l for l in seq_lens if not _builder(directory, settings, l).is_prepared()]
  if missing:
    print(f"Preparing pre-training data from '{data_config.corpus}' for seq_len "
          f"{', '.join(map(str, missing))} in {directory}", flush=True)
    if not complete and os.path.exists(directory):
      shutil.rmtree(directory)  # debris of a run that failed before finishing
    try:
      with _quiet_tfds():
        _build(data_config, settings, directory, missing, seed, reuse_tokenizer=complete)
    except BaseException:
      if complete:  # keep the good data of earlier runs, drop only this attempt's
        for l in missing:
          _remove_incomplete(_builder(directory, settings, l))
      else:
        shutil.rmtree(directory, ignore_errors=True)
      raise
  tokenizer = Tokenizer.load(tokenizer_dir)
  train, eval_ = {}, {}
  with _quiet_tfds():
    for l in seq_lens:
      sources = _builder(directory, settings, l).as_data_source()
      train[l], eval_[l] = sources["train"], sources["eval"]
  return Prepared(tokenizer=tokenizer, train=train, eval=eval_, directory=directory)


# --- settings ---


def _settings(c: ml_collections.ConfigDict, seed: int) -> dict:
  """Everything that determines the data, validated; hashed into the cache key."""
  if not 0.0 < c.eval_fraction < 1.0:
    raise ConfigError(f"data.eval_fraction must be in (0, 1), got {c.eval_fraction}")
  if c.max_eval_examples < 0:
    raise ConfigError(f"data.max_eval_examples must be >= 0 (0 = no cap), "
                      f"got {c.max_eval_examples}")
  if c.dupe_factor < 1:
    raise ConfigError(f"data.dupe_factor must be >= 1, got {c.dupe_factor}")
  if not 0.0 <= c.short_seq_prob <= 1.0:
    raise ConfigError(f"data.short_seq_prob must be in [0, 1], got {c.short_seq_prob}")
  if c.max_documents < 0:
    raise ConfigError(f"data.max_documents must be >= 0 (0 = all), got {c.max_documents}")
  if c.format not in corpus.FORMATS:
    raise ConfigError(f"data.format must be one of {', '.join(corpus.FORMATS)}; "
                      f"got {c.format!r}")
  if c.vocab_file:
    if not os.path.isfile(c.vocab_file):
      raise ConfigError(f"data.vocab_file '{c.vocab_file}' does not exist or is not a file")
    with open(c.vocab_file, "rb") as f:
      vocab = {"file_sha256": hashlib.sha256(f.read()).hexdigest()}
  else:
    vocab = {"trained_size": int(c.vocab_size)}
  vocab["lowercase"] = bool(c.lowercase)
  return {
      "data_version": DATA_VERSION,
      "corpus": corpus.fingerprint(c.corpus),
      "format": c.format,
      "max_documents": int(c.max_documents),
      "vocab": vocab,
      "short_seq_prob": float(c.short_seq_prob),
      "dupe_factor": int(c.dupe_factor),
      "eval_fraction": float(c.eval_fraction),
      "max_eval_examples": int(c.max_eval_examples),
      "seed": int(seed),
  }


def _hash(obj: Any) -> str:
  return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:12]


# --- building ---


def _build(c: ml_collections.ConfigDict, settings: dict, directory: str, seq_lens: list[int],
           seed: int, reuse_tokenizer: bool) -> None:
  docs = list(corpus.read_documents(c.corpus, c.format, c.max_documents))
  train_docs, eval_docs = _split(docs, c.eval_fraction, seed, c.corpus)
  del docs
  tokenizer_dir = os.path.join(directory, TOKENIZER_DIR)
  if reuse_tokenizer:
    tokenizer = Tokenizer.load(tokenizer_dir)
  elif c.vocab_file:
    tokenizer = Tokenizer.from_vocab_file(c.vocab_file, c.lowercase)
  else:
    # Train split only: the eval text must stay unseen, vocabulary included.
    tokenizer = Tokenizer.train((s for d in train_docs for s in d), c.vocab_size, c.lowercase)
  train_ids = _tokenize(tokenizer, train_docs)
  eval_ids = _tokenize(tokenizer, eval_docs)
  del train_docs, eval_docs
  for name, split in (("training", train_ids), ("evaluation", eval_ids)):
    if len(split) < MIN_DOCS_PER_SPLIT:
      raise CorpusError(
          f"corpus '{c.corpus}' has {len(split)} {name} document(s) with any tokens; "
          f"need at least {MIN_DOCS_PER_SPLIT}")

  if _is_tab_format(c):
    make = pretraining_data.create_pair_examples
    kwargs = {}
  else:
    make = pretraining_data.create_examples
    kwargs = dict(short_seq_prob=c.short_seq_prob)
  for seq_len in seq_lens:
    kwargs.update(max_seq_length=seq_len, dupe_factor=c.dupe_factor, cls_id=tokenizer.cls_id,
                  sep_id=tokenizer.sep_id)
    train = make(train_ids, seed=seed, **kwargs)
    # A different seed so eval pairs are not drawn in lockstep with train pairs.
    evals = make(eval_ids, seed=seed + 1, **kwargs)
    if c.max_eval_examples:
      evals = itertools.islice(evals, c.max_eval_examples)
    splits = {}
    for split_name, examples in (("train", train), ("eval", evals)):
      first = next(examples, None)
      if first is None:  # e.g. tab lines whose halves tokenize to nothing
        raise CorpusError(f"corpus '{c.corpus}' makes no {split_name} examples at "
                          f"seq_len {seq_len}; it needs 2 documents with text per split")
      splits[split_name] = itertools.chain([first], examples)
    builder = _builder(directory, settings, seq_len, splits)
    _remove_incomplete(builder)
    with tempfile.TemporaryDirectory() as downloads:  # nothing is downloaded
      builder.download_and_prepare(download_dir=downloads,
                                   download_config=_download_config())

  if not reuse_tokenizer:
    # Last step, atomic: its presence marks the whole preparation complete.
    staging = tempfile.mkdtemp(prefix=".tokenizer-", dir=directory)
    tokenizer.save(staging)
    with open(os.path.join(staging, SETTINGS_FILE), "w", encoding="utf-8") as f:
      json.dump(settings, f, indent=2, sort_keys=True)
    os.replace(os.path.join(staging, SETTINGS_FILE), os.path.join(directory, SETTINGS_FILE))
    os.rename(staging, tokenizer_dir)


def _is_tab_format(c: ml_collections.ConfigDict) -> bool:
  if c.format == "tab":
    return True
  is_file = c.corpus != corpus.BUILTIN and not c.corpus.startswith(corpus.TFDS_PREFIX)
  return c.format == "auto" and is_file and corpus.detect_format(c.corpus) == "tab"


def _split(docs: list[list[str]], eval_fraction: float, seed: int,
           spec: str) -> tuple[list[list[str]], list[list[str]]]:
  """Deterministic document-level split (no document is in both)."""
  need = 2 * MIN_DOCS_PER_SPLIT
  if len(docs) < need:
    n_sentences = sum(len(d) for d in docs)
    raise CorpusError(
        f"corpus '{spec}' is too small: {len(docs)} document(s), {n_sentences} sentence(s); "
        f"need at least {need} documents ({MIN_DOCS_PER_SPLIT} to train on, "
        f"{MIN_DOCS_PER_SPLIT} held out for eval)")
  order = list(range(len(docs)))
  random.Random(seed).shuffle(order)
  n_eval = min(max(MIN_DOCS_PER_SPLIT, round(eval_fraction * len(docs))),
               len(docs) - MIN_DOCS_PER_SPLIT)
  # Sorted so each split keeps corpus order (neighbouring documents stay close).
  eval_docs = [docs[i] for i in sorted(order[:n_eval])]
  train_docs = [docs[i] for i in sorted(order[n_eval:])]
  return train_docs, eval_docs


def _tokenize(tokenizer: Tokenizer, docs: list[list[str]]) -> list[list[list[int]]]:
  """Documents of sentences -> documents of token-id sentences (empty ones dropped)."""
  flat = [s for d in docs for s in d]
  ids: list[list[int]] = []
  for start in range(0, len(flat), _TOKENIZE_CHUNK):
    ids.extend(tokenizer.encode_batch(flat[start:start + _TOKENIZE_CHUNK]))
  out, pos = [], 0
  for d in docs:
    sentences = [s for s in ids[pos:pos + len(d)] if s]
    pos += len(d)
    if sentences:
      out.append(sentences)
  return out


# --- TFDS ---


def _builder(directory: str, settings: dict, seq_len: int,
             splits: dict[str, Iterator[dict]] | None = None):
  import tensorflow_datasets as tfds
  name = f"seq{seq_len}-{_hash({'settings': settings, 'seq_len': seq_len})}"
  config = tfds.core.BuilderConfig(name=name, description=json.dumps(settings, sort_keys=True))
  return _builder_class()(seq_len=seq_len, splits=splits, config=config, data_dir=directory,
                          file_format="array_record")


@contextlib.contextmanager
def _quiet_tfds():
  """TFDS logs warnings and progress bars that mean nothing to our users."""
  from tensorflow_datasets.core.utils import tqdm_utils
  absl_logger = logging.getLogger("absl")
  old_level, old_bar = absl_logger.level, tqdm_utils._active
  absl_logger.setLevel(logging.ERROR)
  tqdm_utils._active = False
  try:
    yield
  finally:
    absl_logger.setLevel(old_level)
    tqdm_utils._active = old_bar


def _download_config():
  import tensorflow_datasets as tfds
  # Statistics would need TensorFlow and we never read them.
  return tfds.download.DownloadConfig(compute_stats=tfds.download.ComputeStatsMode.SKIP)


def _remove_incomplete(builder) -> None:
  """Deletes TFDS `incomplete.*` dirs left by an interrupted write of this config."""
  config_dir = os.path.dirname(os.fspath(builder.data_path))
  if os.path.isdir(config_dir):
    for entry in os.listdir(config_dir):
      if entry.startswith("incomplete."):
        shutil.rmtree(os.path.join(config_dir, entry), ignore_errors=True)


_BUILDER_CLASS = None


def _builder_class():
  """The TFDS builder, defined on first use so importing this module stays cheap."""
  global _BUILDER_CLASS
  if _BUILDER_CLASS is not None:
    return _BUILDER_CLASS
  import tensorflow_datasets as tfds

  class BertPretraining(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """NSP sentence pairs of one seq_len; config name = hash of the settings."""

    VERSION = tfds.core.Version("1.0.0")

    # TFDS looks for a checksums file next to the builder's source through
    # `importlib_resources`, which it does not depend on; we download nothing.
    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls):
      return None

    def __init__(self, *, seq_len: int, splits: dict[str, Iterator[dict]] | None, **kwargs):
      self._seq_len = seq_len
      self._splits = splits
      super().__init__(**kwargs)

    def _info(self):
      seq = lambda: tfds.features.Tensor(shape=(self._seq_len,), dtype=np.int32)
      return tfds.core.DatasetInfo(
          builder=self,
          description="BERT pre-training sentence pairs (masking is done at train time).",
          features=tfds.features.FeaturesDict({
              "input_ids": seq(),
              "segment_ids": seq(),
              "input_mask": seq(),
              "next_sentence_label": tfds.features.Tensor(shape=(), dtype=np.int32),
          }),
          # Stored in generation order; the input pipeline shuffles each epoch.
          disable_shuffling=True,
      )

    def _split_generators(self, dl_manager):
      del dl_manager
      if self._splits is None:
        raise RuntimeError("BertPretraining built without examples cannot be prepared")
      return {name: self._generate_examples(ex) for name, ex in self._splits.items()}

    def _generate_examples(self, examples):
      for i, example in enumerate(examples):
        yield i, example

    # The builder prints two bold lines of its own; prepare() prints one.
    def _log_download_bytes(self) -> None:
      pass

    def _log_download_done(self) -> None:
      pass

  _BUILDER_CLASS = BertPretraining
  return _BUILDER_CLASS
