"""One part of the corpus to stored examples, streaming, in bounded memory.

  documents of the part (prep_parts.Part, read lazily)
    -> train/eval split, per block of up to SPLIT_BLOCK_DOCUMENTS documents (seeded shuffle)
    -> WordPiece, a chunk of ~8k sentences per `encode_batch_flat` call
    -> per split, windows of up to WINDOW_DOCUMENTS documents / WINDOW_TOKENS
       tokens; NSP pairs per window (NotNext text from another document of the
       same window), `dupe_factor` passes per window (`eval_dupe_factor` for eval)
    -> records appended to the part's array_record shards as they are made.

Every seed is the run's seed, the part's index, the split and the block or
window index; part 0's are the seeds of the time before parts, so a corpus of
one part gives the examples it always gave. Nothing depends on which process
prepares a part, or when. A part is written to `<dir>.tmp-<host>-<pid>/` and
renamed to `<dir>/` when complete (PART_FILE written last), so a part that
exists is complete and a rerun prepares only the missing ones.

Record format: see `prep_store`. Shapes: K examples, L = seq_len.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import random
import shutil
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy as np
from array_record.python.array_record_module import ArrayRecordWriter

from bert_jax.data import corpus, packing, prep_parts, pretraining_data
from bert_jax.data.prep_store import HEADER, shard_path, write_json
from bert_jax.storage.outputs import owner
from bert_jax.data.prep_check import writable
from bert_jax.data import bpe
from bert_jax.data.bpe import AnyTokenizer
from bert_jax.errors import CorpusError, check_stop
from bert_jax.storage import fs

if TYPE_CHECKING:
  from bert_jax.settings import DataSettings

MIN_DOCS_PER_SPLIT = 2  # NotNext takes its B from another document of the split
SPLIT_BLOCK_DOCUMENTS = 1000  # train/eval are drawn per block of documents
SPLIT_BLOCK_CHARS = 32 << 20
WINDOW_DOCUMENTS = 4096  # NotNext partners come from the same window
WINDOW_TOKENS = 4_000_000
TOKENIZE_SENTENCES = 8192  # per encode_batch_flat call
TOKENIZE_CHARS = 2 << 20
SPANS_PER_BLOCK = 4096
SHARD_RECORDS = 1 << 19
# What a worker process must be told (a test may change them in the parent).
TUNING = ("SPLIT_BLOCK_DOCUMENTS", "SPLIT_BLOCK_CHARS", "WINDOW_DOCUMENTS", "WINDOW_TOKENS",
          "SHARD_RECORDS")
PART_FILE = "part.json"  # a part's counts and files; written last
# Random access: one record per chunk. Compressing records of a few hundred
# bytes one by one saves almost nothing and makes writing 7x slower.
_WRITER_OPTIONS = "group_size:1,uncompressed"
_REPORT_SECONDS = 1.0

# (tokens so far, share of the part's bytes done, examples written so far)
Report = Callable[[int, float, int], None]


@dataclasses.dataclass(frozen=True)
class PartJob:
  """Everything a worker needs to prepare one part (picklable)."""
  data: DataSettings
  part: prep_parts.Part
  fmt: str  # 'plain', 'tab', 'jsonl' or 'parquet', resolved once for the corpus
  tokenizer_dir: str
  directory: str  # the part's final folder
  seq_lens: tuple[int, ...]
  seed: int
  tuning: dict = dataclasses.field(default_factory=dict)


def tuning() -> dict:
  """This process's TUNING values, to hand to a worker."""
  return {name: globals()[name] for name in TUNING}


def prepare_part(job: PartJob, report: Report, keep_tokenizer: bool = False) -> None:
  """Writes the part's records and PART_FILE to `job.directory` unless it is there.

  `keep_tokenizer`: the tokenizer is kept for the next part, its word cache warm,
  until `release_tokenizer` (the end of one preparation).
  """
  if os.path.exists(os.path.join(job.directory, PART_FILE)):
    return  # made by an earlier run that was stopped, or by another host
  globals().update({k: v for k, v in job.tuning.items() if k in TUNING})
  staging = f"{job.directory}.tmp-{owner()}"
  # A full or read-only cache is one line naming config.data.cache_dir, from a worker too.
  with writable(os.path.dirname(os.path.dirname(job.directory))):
    _prepare_part(job, report, keep_tokenizer, staging)


def _prepare_part(job: PartJob, report: Report, keep_tokenizer: bool, staging: str) -> None:
  try:
    tokenizer = _tokenizer(job.tokenizer_dir) if keep_tokenizer else bpe.load(
        job.tokenizer_dir)
    out_dirs = {l: os.path.join(staging, f"seq{l}") for l in job.seq_lens}
    # Created here, not at the first record: a part may yield no examples (one
    # document, which has no NotNext partner in its window), and still is a part.
    os.makedirs(staging, exist_ok=True)
    stats = _PartWriter(job, tokenizer, out_dirs, report).run()
    write_json(os.path.join(staging, PART_FILE), stats)
    try:
      fs.rename(staging, job.directory)
    except OSError:  # another process finished the same part first
      if not os.path.exists(os.path.join(job.directory, PART_FILE)):
        raise
  finally:
    shutil.rmtree(staging, ignore_errors=True)


_LOADED: dict[str, AnyTokenizer] = {}


def _tokenizer(where: str) -> AnyTokenizer:
  """The tokenizer of `where`, kept for the worker's next part: its word cache stays
  warm (ids do not depend on it, speed does). Released when the preparation ends,
  so the folder cannot hold another vocabulary meanwhile."""
  if where not in _LOADED:
    _LOADED.clear()
    _LOADED[where] = bpe.load(where)
  return _LOADED[where]


def release_tokenizer() -> None:
  _LOADED.clear()


# --- documents: split, tokens ---


def part_documents(c: DataSettings, part: prep_parts.Part, fmt: str, seed: int,
                   stats: corpus.CorpusStats) -> Iterator[tuple[bool, list[str]]]:
  """(is_eval, document) of one part, in corpus order."""
  if part.examples is not None:
    docs = corpus.read_tfds_range(c.corpus, *part.examples, stats)
  elif part.ranges:
    docs = corpus.read_ranges(part.ranges, fmt, stats, c.field)
  else:
    docs = corpus.read_documents(c.corpus, c.format, c.max_documents, stats=stats,
                                 field=c.field)
  return split_documents(docs, c.eval_fraction, seed, c.corpus, part.index,
                         whole=part.count == 1)


def split_documents(docs: Iterator[list[str]], eval_fraction: float, seed: int, spec: str,
                    part: int = 0, whole: bool = True) -> Iterator[tuple[bool, list[str]]]:
  """Deterministic document-level split: (is_eval, document), in corpus order.

  Documents are taken in blocks of SPLIT_BLOCK_DOCUMENTS (or SPLIT_BLOCK_CHARS
  of text); each block sends a seeded random choice of its documents to eval,
  as many as keep the running total at `eval_fraction` of all documents so far.
  The first block holds at least four documents and sends at least two to
  each split (NotNext needs two documents). A corpus of one block is split
  exactly as a whole-corpus shuffle would. Too few documents is an error only
  for the `whole` corpus (a part's count is checked on the corpus's totals).
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
      n_eval += yield from _assign(block, index, round(eval_fraction * seen) - n_eval, seed, part)
      block, chars, index = [], 0, index + 1
  if whole and index == 0 and len(block) < need:
    raise CorpusError(
        f"corpus '{spec}' is too small: {len(block)} document(s), "
        f"{sum(map(len, block))} sentence(s); need at least {need} documents "
        f"({MIN_DOCS_PER_SPLIT} to train on, {MIN_DOCS_PER_SPLIT} held out for eval)")
  if block:
    seen += len(block)
    yield from _assign(block, index, round(eval_fraction * seen) - n_eval, seed, part)


def _assign(block: list[list[str]], index: int, n_eval: int, seed: int,
            part: int) -> Iterator[tuple[bool, list[str]]]:
  if index == 0:
    n_eval = min(max(MIN_DOCS_PER_SPLIT, n_eval), len(block) - MIN_DOCS_PER_SPLIT)
  n_eval = min(max(0, n_eval), len(block))
  order = list(range(len(block)))
  rng_seed = (seed if index == 0 else f"{seed}:split:{index}") if part == 0 else (
      f"{seed}:part{part}:split:{index}")
  random.Random(rng_seed).shuffle(order)
  chosen = set(order[:n_eval])
  for i, doc in enumerate(block):
    yield i in chosen, doc
  return n_eval


def _tokenized(docs: Iterator[tuple[bool, list[str]]], tokenizer: AnyTokenizer, pairs: bool,
               counts: dict) -> Iterator[tuple[bool, np.ndarray, list[int]]]:
  """(is_eval, ids int32 [T], sentence lengths) per document with tokens, in chunks."""
  chunk: list[tuple[bool, list[str]]] = []
  sentences = chars = 0
  for is_eval, doc in docs:
    chunk.append((is_eval, doc))
    sentences += len(doc)
    chars += sum(map(len, doc))
    if sentences >= TOKENIZE_SENTENCES or chars >= TOKENIZE_CHARS:
      counts["chars"] += chars
      yield from _tokenize_chunk(chunk, tokenizer, pairs, counts)
      chunk, sentences, chars = [], 0, 0
  counts["chars"] += chars
  yield from _tokenize_chunk(chunk, tokenizer, pairs, counts)


def _tokenize_chunk(chunk: list[tuple[bool, list[str]]], tokenizer: AnyTokenizer, pairs: bool,
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


class _PartWriter:
  """One streaming pass over a part: every seq_len's train and eval records."""

  def __init__(self, job: PartJob, tokenizer: AnyTokenizer, out_dirs: dict[int, str],
               report: Report):
    self.job, self.c, self.tokenizer, self.report = job, job.data, tokenizer, report
    self.pair_nsp = job.fmt == "tab" and self.c.objective == "mlm+nsp"
    self.seq_lens = sorted(out_dirs)
    big = tokenizer.vocab_size > 65536 or max(self.seq_lens) + 1 > 65535
    self.dtype = np.dtype(np.int32 if big else np.uint16)
    self.cap = int(self.c.max_eval_examples) or None  # a part never needs more than the cap
    self.writers = {(l, s): RecordWriter(os.path.join(out_dirs[l], s))
                    for l in self.seq_lens for s in ("train", "eval")}
    self.corpus_stats = corpus.CorpusStats()
    self.counts = {"tokens": 0, "chars": 0, "documents_without_tokens": 0,
                   "pairs_with_an_empty_half": 0}
    self.buffers = {"train": _WindowBuffer(), "eval": _WindowBuffer()}
    self.windows = {"train": 0, "eval": 0}

  def run(self) -> dict:
    """Writes the records; returns the part's counts (PART_FILE)."""
    self.started = time.time()
    self.next_report = time.monotonic() + _REPORT_SECONDS
    eval_full = False
    try:
      docs = part_documents(self.c, self.job.part, self.job.fmt, self.job.seed,
                            self.corpus_stats)
      for is_eval, ids, lengths in _tokenized(docs, self.tokenizer,
                                              self.job.fmt == "tab", self.counts):
        split = "eval" if is_eval else "train"
        if is_eval and eval_full:
          self.buffers[split].total += 1  # counted, but no more eval examples are needed
          continue
        self._emit(split, self.buffers[split].add(ids, lengths))
        eval_full = bool(self.cap) and all(self.writers[(l, "eval")].count >= self.cap
                                           for l in self.seq_lens)
        self._maybe_report()
      for split, buffer in self.buffers.items():
        self._emit(split, buffer.finish())
    finally:
      for writer in self.writers.values():
        writer.close()
    self.report(self.counts["tokens"], 1.0, self._examples())
    return self._stats()

  def _examples(self) -> int:
    return sum(w.count for w in self.writers.values())

  def _maybe_report(self) -> None:
    """Progress every _REPORT_SECONDS, from tokenising and from making pairs alike (a
    window of a few huge documents makes pairs for a while with no new tokens). A safe
    point too: a stop request (SIGTERM) ends the part here, unfinished, not cached."""
    check_stop()
    if time.monotonic() >= self.next_report:
      self.next_report = time.monotonic() + _REPORT_SECONDS
      self.report(self.counts["tokens"], self._share_done(), self._examples())

  def _share_done(self) -> float:
    """Of the part's size: bytes (counted as characters) or TFDS examples."""
    done = self.corpus_stats.documents if self.job.part.examples else self.counts["chars"]
    # A compressed part's size is its compressed bytes: the share can pass 1 there.
    return min(done / max(self.job.part.bytes, 1), 1.0)

  def _emit(self, split: str, window: pretraining_data.Window | None) -> None:
    if window is None:
      return
    part = self.job.part.index
    rng_seed = (f"{self.job.seed}:{split}:{self.windows[split]}" if part == 0 else
                f"{self.job.seed}:part{part}:{split}:{self.windows[split]}")
    self.windows[split] += 1
    for l in self.seq_lens:
      self._write_window(split, window, l, random.Random(rng_seed))

  def _write_window(self, split: str, window: pretraining_data.Window, l: int,
                    rng: random.Random) -> None:
    c, writer = self.c, self.writers[(l, split)]
    limit = self.cap if split == "eval" else None
    if limit is not None and writer.count >= limit:
      return
    passes = c.eval_passes if split == "eval" else c.dupe_factor
    spans = (pretraining_data.pair_spans(window, l, passes, rng) if self.pair_nsp else
             pretraining_data.document_spans(window, l, c.short_seq_prob, passes, rng,
                                             c.objective))
    while block := list(itertools.islice(spans, SPANS_PER_BLOCK)):
      if limit is not None and not c.packing:  # a span is a row: make only those kept
        block = block[:limit - writer.count]
      rows = _rows(window.tokens_T, np.asarray(block, np.int64), l, self.tokenizer, self.dtype)
      if c.packing:  # rows are known only once packed: the cap cuts them
        rows = packing.pack(rows, l)
      if limit is not None:
        rows = rows[:limit - writer.count]
      writer.write_rows(rows)
      writer.tokens += int(rows[:, 1].sum(dtype=np.int64))
      self._maybe_report()
      if limit is not None and writer.count >= limit:
        break

  def _stats(self) -> dict:
    w = self.writers
    return {
        "part": self.job.part.index, "dtype": self.dtype.name, "started": self.started,
        "seconds": round(time.time() - self.started, 3),
        "corpus": self.corpus_stats.to_dict(), "counts": self.counts, "windows": self.windows,
        "documents_by_split": {s: b.total for s, b in self.buffers.items()},
        "seq_lens": {str(l): {s: {"shards": w[(l, s)].shards, "files": w[(l, s)].files(),
                                  "example_tokens": w[(l, s)].tokens}
                              for s in ("train", "eval")} for l in self.seq_lens}}


def _rows(tokens_T: np.ndarray, spans_Kx5: np.ndarray, seq_len: int, tokenizer: AnyTokenizer,
          dtype: np.dtype) -> np.ndarray:
  """Records [K, 3 + L]: n_a, n, label, input_ids (a one-segment span has n = n_a)."""
  rows = np.empty((len(spans_Kx5), HEADER + seq_len), dtype)
  rows[:, 0] = spans_Kx5[:, 1] + 2
  rows[:, 1] = spans_Kx5[:, 1] + spans_Kx5[:, 3] + 3
  rows[:, 2] = spans_Kx5[:, 4]
  rows[:, HEADER:] = pretraining_data.input_ids(tokens_T, spans_Kx5, seq_len,
                                                 tokenizer.cls_id, tokenizer.sep_id)
  return rows


class RecordWriter:
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

  def files(self) -> list[str]:
    """The shard file names, in order."""
    return [os.path.basename(shard_path(self.prefix, i)) for i in range(len(self.shards))]
