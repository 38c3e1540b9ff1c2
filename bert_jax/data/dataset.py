"""Prepare pre-training data once, streaming (corpus -> WordPiece -> NSP pairs ->
array_record), and reuse it on later runs.

One pass over the corpus, in bounded memory whatever its size:

  documents (corpus.py, read lazily)
    -> train/eval split, per block of up to 1000 documents (seeded shuffle)
    -> WordPiece, a chunk of ~8k sentences per `encode_batch_flat` call
    -> per split, windows of up to WINDOW_DOCUMENTS documents / WINDOW_TOKENS
       tokens; NSP pairs per window (NotNext text from another document of
       the same window), `dupe_factor` passes per window (`eval_dupe_factor`
       for the eval split)
    -> records appended to array_record files as they are made.

A WordPiece vocabulary, when trained, is learned first from the first
`data.vocab_sample_bytes` of training text, counted in characters (a second,
bounded read).

Layout under `cache_dir`:

  <key>/                  `Prepared.directory`; key = hash of the settings
    settings.json         what the data was made from (for people)
    stats.json            counts: documents, sentences, tokens, repaired input, examples
    tokenizer/            vocab.txt + tokenizer_config.json
    seq<L>/               info.json, train.<shard>.array_record, eval.<shard>.array_record

A fresh preparation is written to `.<key>.tmp-<host>-<pid>/` and renamed to
`<key>/` when complete; a seq_len added later is written to
`<key>/.seq<L>.tmp-<host>-<pid>/` and renamed to `seq<L>/`. So whatever
exists under its final name is complete, and a crash leaves only `.tmp`
debris, which is never read and is removed by a later run.

Record format (one record per example, dtype in info.json: uint16 when the
vocabulary fits, else int32): [n_a, n, label, input_ids[L]], where n_a is the
length of `[CLS] A [SEP]` and n the used length; segment ids and input mask
follow from them. A split is sharded every SHARD_RECORDS records (info.json
lists the records per shard).

Shapes: K examples, L = seq_len.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import os
import random
import shutil
import socket
import sys
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from array_record.python.array_record_module import ArrayRecordWriter

from bert_jax.data import corpus
from bert_jax.data import pretraining_data
from bert_jax.errors import ConfigError, CorpusError
from bert_jax.data.example_store import (  # noqa: F401  (re-exported: the data's public names)
    HEADER, INFO_FILE, MANIFEST_FILE, SETTINGS_FILE, STATS_FILE, TOKENIZER_DIR, ExampleSource,
    seq_dir, shard_path, write_json)
from bert_jax.data.prepared_check import (  # noqa: F401
    PreparedDataError, check_corpus_unchanged, check_seq_dir, is_complete, writable,
    write_manifest)
from bert_jax.data.tokenizer import Tokenizer

if TYPE_CHECKING:  # data code takes its typed part of the settings, never a config
  from bert_jax.settings import DataSettings

# Bump when the way examples are made or stored changes, so old caches are not reused.
DATA_VERSION = 2
MIN_DOCS_PER_SPLIT = 2  # NotNext takes its B from another document of the split
SPLIT_BLOCK_DOCUMENTS = 1000  # train/eval are drawn per block of documents
SPLIT_BLOCK_CHARS = 32 << 20
WINDOW_DOCUMENTS = 4096  # NotNext partners come from the same window
WINDOW_TOKENS = 4_000_000
TOKENIZE_SENTENCES = 8192  # per encode_batch_flat call
TOKENIZE_CHARS = 2 << 20
_SPANS_PER_BLOCK = 4096
SHARD_RECORDS = 1 << 19
# Random access: one record per chunk. Compressing records of a few hundred
# bytes one by one saves almost nothing and makes writing 7x slower.
_WRITER_OPTIONS = "group_size:1,uncompressed"
_PROGRESS_SECONDS = 30.0


@dataclasses.dataclass
class Prepared:
  """Prepared data: sources are random-access (`len(src)`, `src[i]` -> dict)."""
  tokenizer: Tokenizer
  train: dict[int, Any]
  eval: dict[int, Any]
  directory: str


def prepare(data_config: DataSettings, seq_lens: Sequence[int], cache_dir: str,
            seed: int) -> Prepared:
  """Returns the data for every seq_len, preparing (only) what is not stored yet."""
  settings = _settings(data_config, seed)
  seq_lens = sorted({int(l) for l in seq_lens})
  for l in seq_lens:
    if l < pretraining_data.MIN_SEQ_LEN:
      raise ConfigError(f"--config.train.seq_lens: {l} is too short; expected every seq_len "
                        f">= {pretraining_data.MIN_SEQ_LEN}")
  cache_dir = os.path.abspath(cache_dir)
  key = _hash(settings)
  directory = os.path.join(cache_dir, key)
  _remove_stale(cache_dir, f".{key}.tmp-")
  complete = is_complete(directory)
  if not complete and os.path.exists(directory):
    shutil.rmtree(directory)  # not made by this version's atomic rename: debris
  if complete:
    _remove_stale(directory, ".seq")
  missing = [l for l in seq_lens if not (complete and os.path.isdir(seq_dir(directory, l)))]
  if missing:
    print(f"Preparing pre-training data from '{data_config.corpus}' for seq_len "
          f"{', '.join(map(str, missing))} in {directory}", flush=True)
    if complete:
      _add_seq_lens(data_config, directory, missing, seed)
    else:
      _prepare_fresh(data_config, settings, cache_dir, directory, key, missing, seed)
  tokenizer = Tokenizer.load(os.path.join(directory, TOKENIZER_DIR))
  train, eval_ = {}, {}
  for l in seq_lens:
    train[l], eval_[l] = open_split(directory, l, "train"), open_split(directory, l, "eval")
  return Prepared(tokenizer=tokenizer, train=train, eval=eval_, directory=directory)


def _prepare_fresh(c, settings: dict, cache_dir: str, directory: str, key: str,
                   seq_lens: list[int], seed: int) -> None:
  staging = os.path.join(cache_dir, f".{key}.tmp-{_owner()}")
  made_cache_dir = not os.path.exists(cache_dir)
  try:
    with writable(cache_dir):
      os.makedirs(staging)
      tokenizer = make_tokenizer(c, seed)
      stats = _write_examples(c, tokenizer, {l: seq_dir(staging, l) for l in seq_lens}, seed)
      write_json(os.path.join(staging, STATS_FILE), stats)
      write_json(os.path.join(staging, SETTINGS_FILE), settings)
      tokenizer.save(os.path.join(staging, TOKENIZER_DIR))
      check_corpus_unchanged(c, settings["corpus"])
      write_manifest(staging)
      try:
        os.rename(staging, directory)  # atomic: the whole preparation appears at once
      except OSError:
        if not is_complete(directory, repair=False):  # not another process's finished copy
          raise
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)
    if made_cache_dir:  # a failed run leaves no trace, not even an empty folder
      with contextlib.suppress(OSError):
        os.rmdir(cache_dir)
    raise
  finally:
    shutil.rmtree(staging, ignore_errors=True)


def _add_seq_lens(c, directory: str, seq_lens: list[int], seed: int) -> None:
  """Adds seq_lens to a complete preparation, with its stored tokenizer."""
  tokenizer = Tokenizer.load(os.path.join(directory, TOKENIZER_DIR))
  with open(os.path.join(directory, SETTINGS_FILE), encoding="utf-8") as f:
    started_from = json.load(f)["corpus"]  # what the preparation's key was made from
  stagings = {l: os.path.join(directory, f".seq{l}.tmp-{_owner()}") for l in seq_lens}
  try:
    with writable(os.path.dirname(directory)):
      _write_examples(c, tokenizer, stagings, seed)
      check_corpus_unchanged(c, started_from)
      for l, staging in stagings.items():
        os.rename(staging, seq_dir(directory, l))
  finally:
    for staging in stagings.values():
      shutil.rmtree(staging, ignore_errors=True)


def _owner() -> str:
  return f"{socket.gethostname()}-{os.getpid()}"


def _remove_stale(directory: str, prefix: str) -> None:
  """Removes `<prefix>*.tmp-<host>-<pid>` debris of dead processes on this host."""
  if not os.path.isdir(directory):
    return
  host = socket.gethostname()
  for name in os.listdir(directory):
    if not name.startswith(prefix) or ".tmp-" not in name:
      continue
    owner_host, _, pid = name.rpartition(".tmp-")[2].rpartition("-")
    if owner_host == host and pid.isdigit() and not _alive(int(pid)):
      shutil.rmtree(os.path.join(directory, name), ignore_errors=True)


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


# --- settings ---


def _settings(c: DataSettings, seed: int) -> dict:
  """Everything that determines the data (checked in DataSettings); hashed into the cache key."""
  if c.vocab_file:
    with open(c.vocab_file, "rb") as f:
      vocab = {"file_sha256": hashlib.sha256(f.read()).hexdigest()}
  else:
    vocab = {"trained_size": int(c.vocab_size), "sample_bytes": int(c.vocab_sample_bytes)}
  vocab["lowercase"] = bool(c.lowercase)
  return {
      "data_version": DATA_VERSION,
      "corpus": corpus.fingerprint(c.corpus),
      "format": c.format,
      "max_documents": int(c.max_documents),
      "vocab": vocab,
      "short_seq_prob": float(c.short_seq_prob),
      "dupe_factor": int(c.dupe_factor),
      # Absent when equal to dupe_factor (as before it existed), so older data stays valid.
      **({"eval_dupe_factor": c.eval_passes} if c.eval_passes != c.dupe_factor else {}),
      "eval_fraction": float(c.eval_fraction),
      "max_eval_examples": int(c.max_eval_examples),
      "seed": int(seed),
      # Absent for the default, so data prepared before objectives existed stays valid.
      **({"objective": c.objective} if c.objective != "mlm+nsp" else {}),
      "blocks": {"split_documents": SPLIT_BLOCK_DOCUMENTS, "split_chars": SPLIT_BLOCK_CHARS,
                 "window_documents": WINDOW_DOCUMENTS, "window_tokens": WINDOW_TOKENS},
  }


def _hash(obj: Any) -> str:
  return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:12]


# --- documents: split, vocabulary, tokens ---


def documents(c: DataSettings, seed: int,
               stats: corpus.CorpusStats) -> Iterator[tuple[bool, list[str]]]:
  """(is_eval, document) for the whole corpus, in corpus order."""
  docs = corpus.read_documents(c.corpus, c.format, c.max_documents, stats=stats)
  return split_documents(docs, c.eval_fraction, seed, c.corpus)


def split_documents(docs: Iterator[list[str]], eval_fraction: float, seed: int,
                    spec: str) -> Iterator[tuple[bool, list[str]]]:
  """Deterministic document-level split: (is_eval, document), in corpus order.

  Documents are taken in blocks of SPLIT_BLOCK_DOCUMENTS (or SPLIT_BLOCK_CHARS
  of text); each block sends a seeded random choice of its documents to eval,
  as many as keep the running total at `eval_fraction` of all documents so far.
  The first block holds at least four documents and sends at least two to
  each split (NotNext needs two documents). A corpus of one block is split
  exactly as a whole-corpus shuffle would.
  """
  block: list[list[str]] = []
  chars = seen = n_eval = index = 0
  need = 2 * MIN_DOCS_PER_SPLIT
  for doc in docs:
    block.append(doc)
    chars += sum(map(len, doc))
    if len(block) >= max(need, SPLIT_BLOCK_DOCUMENTS) or (
        chars >= SPLIT_BLOCK_CHARS and len(block) >= need):
      seen += len(block)
      n_eval += yield from _assign(block, index, round(eval_fraction * seen) - n_eval, seed)
      block, chars, index = [], 0, index + 1
  if index == 0 and len(block) < need:
    raise CorpusError(
        f"corpus '{spec}' is too small: {len(block)} document(s), "
        f"{sum(map(len, block))} sentence(s); need at least {need} documents "
        f"({MIN_DOCS_PER_SPLIT} to train on, {MIN_DOCS_PER_SPLIT} held out for eval)")
  if block:
    seen += len(block)
    yield from _assign(block, index, round(eval_fraction * seen) - n_eval, seed)


def _assign(block: list[list[str]], index: int, n_eval: int,
            seed: int) -> Iterator[tuple[bool, list[str]]]:
  if index == 0:
    n_eval = min(max(MIN_DOCS_PER_SPLIT, n_eval), len(block) - MIN_DOCS_PER_SPLIT)
  n_eval = min(max(0, n_eval), len(block))
  order = list(range(len(block)))
  random.Random(seed if index == 0 else f"{seed}:split:{index}").shuffle(order)
  chosen = set(order[:n_eval])
  for i, doc in enumerate(block):
    yield i in chosen, doc
  return n_eval


def make_tokenizer(c: DataSettings, seed: int) -> Tokenizer:
  if c.vocab_file:
    return Tokenizer.from_vocab_file(c.vocab_file, c.lowercase)
  # Train split only: the eval text must stay unseen, vocabulary included.
  def texts() -> Iterator[str]:  # read twice by Tokenizer.train, streamed both times
    return vocab_sample(documents(c, seed, corpus.CorpusStats()), c.vocab_sample_bytes)
  return Tokenizer.train(texts, c.vocab_size, c.lowercase)


def vocab_sample(docs: Iterator[tuple[bool, list[str]]], max_chars: int) -> Iterator[str]:
  """Training sentences until `max_chars` of text; reading stops there."""
  n = 0
  for is_eval, doc in docs:
    if is_eval:
      continue
    for sentence in doc:
      yield sentence
      n += len(sentence)
    if n >= max_chars:
      return


def _tokenized(docs: Iterator[tuple[bool, list[str]]], tokenizer: Tokenizer, pairs: bool,
               counts: dict) -> Iterator[tuple[bool, np.ndarray, list[int]]]:
  """(is_eval, ids int32 [T], sentence lengths) per document with tokens, in chunks."""
  chunk: list[tuple[bool, list[str]]] = []
  sentences = chars = 0
  for is_eval, doc in docs:
    chunk.append((is_eval, doc))
    sentences += len(doc)
    chars += sum(map(len, doc))
    if sentences >= TOKENIZE_SENTENCES or chars >= TOKENIZE_CHARS:
      yield from _tokenize_chunk(chunk, tokenizer, pairs, counts)
      chunk, sentences, chars = [], 0, 0
  yield from _tokenize_chunk(chunk, tokenizer, pairs, counts)


def _tokenize_chunk(chunk: list[tuple[bool, list[str]]], tokenizer: Tokenizer, pairs: bool,
                    counts: dict) -> Iterator[tuple[bool, np.ndarray, list[int]]]:
  if not chunk:
    return
  flat, lengths = tokenizer.encode_batch_flat([s for _, doc in chunk for s in doc])
  lengths = lengths.tolist()
  counts["tokens"] += len(flat)
  tok = sent = 0
  for is_eval, doc in chunk:
    lens = lengths[sent:sent + len(doc)]
    sent += len(doc)
    n = sum(lens)
    # A copy: a view would keep the whole chunk alive as long as the document
    # waits in a window (eval documents wait long).
    ids = flat[tok:tok + n].copy()
    tok += n
    kept = [l for l in lens if l]
    if not kept or (pairs and len(kept) != 2):
      counts["documents_without_tokens" if not kept else "pairs_with_an_empty_half"] += 1
      continue
    yield is_eval, ids, kept


class _WindowBuffer:
  """Documents of one split until a window is full; the last two always wait.

  Holding two back means the final window has at least two documents too, so
  every document of a split with two or more gets a NotNext partner.
  """

  def __init__(self):
    self.docs: list[tuple[np.ndarray, list[int]]] = []
    self.tokens = 0
    self.total = 0

  def add(self, ids: np.ndarray, lengths: list[int]) -> pretraining_data.Window | None:
    self.docs.append((ids, lengths))
    self.tokens += len(ids)
    self.total += 1
    ready = len(self.docs) - 2
    ready_tokens = self.tokens - len(self.docs[-1][0]) - len(self.docs[-2][0]) if ready > 0 else 0
    if ready >= 2 and (ready >= WINDOW_DOCUMENTS or ready_tokens >= WINDOW_TOKENS):
      out, self.docs = self.docs[:-2], self.docs[-2:]
      self.tokens -= ready_tokens
      return _window(out)
    return None

  def finish(self) -> pretraining_data.Window | None:
    out, self.docs, self.tokens = self.docs, [], 0
    return _window(out) if len(out) >= 2 else None


def _window(docs: list[tuple[np.ndarray, list[int]]]) -> pretraining_data.Window:
  return pretraining_data.Window.from_flat(np.concatenate([ids for ids, _ in docs]),
                                           [lengths for _, lengths in docs])


# --- examples -> records ---


# long: one streaming pass from documents to records (docs/ARCHITECTURE.md)
def _write_examples(c: DataSettings, tokenizer: Tokenizer,
                    out_dirs: dict[int, str], seed: int) -> dict:
  """One streaming pass: every seq_len's train and eval records; returns the stats."""
  start = time.perf_counter()
  pairs = corpus.resolve_format(c.corpus, c.format) == "tab"
  # Tab lines are two-sentence documents: 'mlm' and 'mlm+sop' make theirs as from any document.
  pair_nsp = pairs and c.objective == "mlm+nsp"
  seq_lens = sorted(out_dirs)
  big = tokenizer.vocab_size > 65536 or max(seq_lens) + 1 > 65535
  dtype = np.dtype(np.int32 if big else np.uint16)
  cap = int(c.max_eval_examples) or None
  writers = {(l, s): _RecordWriter(os.path.join(out_dirs[l], s))
             for l in seq_lens for s in ("train", "eval")}
  corpus_stats = corpus.CorpusStats()
  counts = {"tokens": 0, "documents_without_tokens": 0, "pairs_with_an_empty_half": 0}
  buffers = {"train": _WindowBuffer(), "eval": _WindowBuffer()}
  windows = {"train": 0, "eval": 0}
  progress = _Progress(start, corpus_stats, counts)

  def emit(split: str, window: pretraining_data.Window | None) -> None:
    if window is None:
      return
    rng_seed = f"{seed}:{split}:{windows[split]}"
    windows[split] += 1
    for l in seq_lens:
      writer = writers[(l, split)]
      limit = cap if split == "eval" else None
      if limit is not None and writer.count >= limit:
        continue
      rng = random.Random(rng_seed)
      passes = c.eval_passes if split == "eval" else c.dupe_factor
      spans = (pretraining_data.pair_spans(window, l, passes, rng) if pair_nsp else
               pretraining_data.document_spans(window, l, c.short_seq_prob, passes, rng,
                                               c.objective))
      while block := list(itertools.islice(spans, _SPANS_PER_BLOCK)):
        if limit is not None:
          block = block[:limit - writer.count]
        rows = _rows(window.tokens_T, np.asarray(block, np.int64), l, tokenizer, dtype)
        writer.write_rows(rows)
        writer.tokens += int(rows[:, 1].sum(dtype=np.int64))
        if limit is not None and writer.count >= limit:
          break

  try:
    docs = documents(c, seed, corpus_stats)
    for is_eval, ids, lengths in _tokenized(docs, tokenizer, pairs, counts):
      split = "eval" if is_eval else "train"
      if split == "eval" and cap and all(writers[(l, "eval")].count >= cap for l in seq_lens):
        buffers[split].total += 1  # counted, but no more eval examples are needed
        continue
      emit(split, buffers[split].add(ids, lengths))
      progress.maybe_print()
    for split, buffer in buffers.items():
      if buffer.total < MIN_DOCS_PER_SPLIT:
        name = "training" if split == "train" else "evaluation"
        raise CorpusError(
            f"corpus '{c.corpus}' has {buffer.total} {name} document(s) with any tokens; "
            f"need at least {MIN_DOCS_PER_SPLIT}")
      emit(split, buffer.finish())
  finally:
    for writer in writers.values():
      writer.close()

  seconds = time.perf_counter() - start
  examples = {}
  for l in seq_lens:
    n = {s: writers[(l, s)].count for s in ("train", "eval")}
    examples[l] = n
    counts[f"example_tokens_seq{l}"] = sum(writers[(l, s)].tokens for s in ("train", "eval"))
    write_json(os.path.join(out_dirs[l], INFO_FILE), {
        "seq_len": l, "dtype": dtype.name, "train": n["train"], "eval": n["eval"],
        "shards": {s: writers[(l, s)].shards for s in ("train", "eval")},
        "files": {**writers[(l, "train")].files(), **writers[(l, "eval")].files()},
        "record": "[n_a, n, label, input_ids[seq_len]]"})
  stats = {**corpus_stats.to_dict(), **counts, "seconds": round(seconds, 3),
           "tokens_per_second": round(counts["tokens"] / max(seconds, 1e-9)),
           "windows": windows, "examples": {str(l): n for l, n in examples.items()},
           "documents_by_split": {s: b.total for s, b in buffers.items()}}
  summary = ", ".join(f"seq_len {l}: {n['train']} train / {n['eval']} eval examples"
                      for l, n in examples.items())
  print(f"Prepared {summary} from {corpus_stats.documents} documents "
        f"({corpus_stats.sentences} sentences, {counts['tokens']} tokens) in {seconds:.1f} s "
        f"({stats['tokens_per_second']} tokens/s)", flush=True)
  for warning in corpus_stats.warnings():
    print(f"warning: corpus: {warning}", file=sys.stderr, flush=True)
  # Not an error, but it skews NSP toward NotNext ('mlm' and 'mlm+sop' never leave a document).
  if corpus_stats.one_sentence_documents and c.objective == "mlm+nsp":
    print(f"warning: corpus '{c.corpus}': {corpus_stats.one_sentence_documents} of "
          f"{corpus_stats.documents} document(s) have a single sentence, so all their "
          "examples are NotNext (B from another document)", file=sys.stderr, flush=True)
  return stats


def _rows(tokens_T: np.ndarray, spans_Kx5: np.ndarray, seq_len: int, tokenizer: Tokenizer,
          dtype: np.dtype) -> np.ndarray:
  """Records [K, 3 + L]: n_a, n, label, input_ids (a one-segment span has n = n_a)."""
  rows = np.empty((len(spans_Kx5), HEADER + seq_len), dtype)
  rows[:, 0] = spans_Kx5[:, 1] + 2
  rows[:, 1] = spans_Kx5[:, 1] + spans_Kx5[:, 3] + 3
  rows[:, 2] = spans_Kx5[:, 4]
  rows[:, HEADER:] = pretraining_data.input_ids(tokens_T, spans_Kx5, seq_len,
                                                 tokenizer.cls_id, tokenizer.sep_id)
  return rows


class _RecordWriter:
  """Appends records to `<prefix>.<shard>.array_record` files, opened on first use.

  A new shard every SHARD_RECORDS records: an array_record writer keeps
  ~50 bytes per record in memory until it is closed.
  """

  def __init__(self, prefix: str):
    self.prefix = prefix
    self.count = 0
    self.tokens = 0  # used positions, [CLS]/[SEP] included
    self.shards: list[int] = []  # records per shard
    self._writer = None

  def write_rows(self, rows: np.ndarray) -> None:
    start = 0
    while start < len(rows):
      if self._writer is None:
        os.makedirs(os.path.dirname(self.prefix), exist_ok=True)
        path = shard_path(self.prefix, len(self.shards))
        self._writer = ArrayRecordWriter(path, _WRITER_OPTIONS)
        self.shards.append(0)
      take = min(len(rows) - start, SHARD_RECORDS - self.shards[-1])
      write = self._writer.write
      for row in rows[start:start + take]:
        write(row.tobytes())
      self.shards[-1] += take
      self.count += take
      start += take
      if self.shards[-1] == SHARD_RECORDS:
        self.close()

  def close(self) -> None:
    if self._writer is not None:
      self._writer.close()
      self._writer = None

  def files(self) -> dict[str, int]:
    """{shard file name: byte size} of the closed shards (recorded in info.json)."""
    paths = [shard_path(self.prefix, i) for i in range(len(self.shards))]
    return {os.path.basename(p): os.path.getsize(p) for p in paths}


class _Progress:
  """A line every 30 s on long preparations (hours on big corpora)."""

  def __init__(self, start: float, stats: corpus.CorpusStats, counts: dict):
    self.start, self.stats, self.counts = start, stats, counts
    self.next = start + _PROGRESS_SECONDS

  def maybe_print(self) -> None:
    now = time.perf_counter()
    if now < self.next:
      return
    self.next = now + _PROGRESS_SECONDS
    tokens = self.counts["tokens"]
    print(f"  ... {self.stats.documents} documents, {tokens} tokens, "
          f"{tokens / (now - self.start):.0f} tokens/s", flush=True)


# --- reading back ---


def open_split(directory: str, seq_len: int, split: str) -> ExampleSource:
  """The stored examples of one split at one seq_len (a complete preparation).

  Its info.json and shards are checked first (presence and recorded sizes):
  a mismatch is one PreparedDataError line naming the file.
  """
  where = seq_dir(directory, seq_len)
  problem = check_seq_dir(where)
  if problem is not None:
    raise PreparedDataError(f"prepared data {problem}; expected the files its preparation "
                            f"recorded: rerun (dataset.prepare prepares a damaged seq_len "
                            f"again) or delete {where}")
  with open(os.path.join(where, INFO_FILE), encoding="utf-8") as f:
    info = json.load(f)
  prefix = os.path.join(where, split)
  counts = info["shards"][split]
  return ExampleSource([shard_path(prefix, i) for i in range(len(counts))], counts, seq_len,
                       info["dtype"])
