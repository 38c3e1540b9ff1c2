"""Per-host numpy batches from a random-access source, shuffled and resumable.

A source is anything with `len(src)` and `src[i] -> dict of arrays` (e.g. a
TFDS array_record data source, or a list of dicts in tests). Batches are a
pure function of (seed, batch position), computed by index, so resuming at a
position reproduces exactly the batches an uninterrupted run would have seen.
Plain numpy and one background thread: `grain` would import jax, and this
module must not.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from bert_jax.errors import ConfigError, CorpusError
from bert_jax.data.batch_ramp import BatchRamp
from bert_jax.data.mixture import Mixture, read_examples
from bert_jax.data.pretraining_data import FEATURES, Batch


def _check_hosts(global_batch_size: int, process_index: int, process_count: int) -> int:
  if global_batch_size < 1:
    raise ConfigError(f"train.batch_size must be >= 1, got {global_batch_size}")
  if not 0 <= process_index < process_count:
    raise ConfigError(f"process_index {process_index} is not in [0, {process_count})")
  if global_batch_size % process_count:
    raise ConfigError(f"train.batch_size {global_batch_size} must be divisible by the "
                      f"number of hosts ({process_count})")
  return global_batch_size // process_count


class Streams:
  """Where each example stream's k-th example is in a source.

  Stream s is the training records of the parts p with p % count == s, in part
  order. `parts` lists the source's parts, (part index, records) in stored
  order: a merged dataset holds all, a host-local one only its own, so a stream
  this host does not hold has no examples here.
  """

  def __init__(self, parts: Sequence[tuple[int, int]], count: int):
    self.count = count
    starts = np.concatenate([[0], np.cumsum([int(n) for _, n in parts], dtype=np.int64)])
    self._starts, self._ends = [], []  # per stream: its parts' first record, stream end
    for s in range(count):
      mine = [i for i, (p, _) in enumerate(parts) if int(p) % count == s]
      self._starts.append(starts[mine])
      self._ends.append(np.cumsum([int(parts[i][1]) for i in mine], dtype=np.int64))

  def size(self, stream: int) -> int:
    """Examples of `stream` in the source (0: none held here)."""
    return int(self._ends[stream][-1]) if len(self._ends[stream]) else 0

  def index(self, stream: int, k: np.ndarray) -> np.ndarray:
    """Source indices of the stream's examples `k` (each < size(stream))."""
    ends = self._ends[stream]
    part = np.searchsorted(ends, k, side="right")
    before = np.where(part > 0, ends[np.maximum(part - 1, 0)], 0)
    return self._starts[stream][part] + (k - before)


class _Sampler:
  """Which examples make up each batch, and reading them. Shared with the thread.

  Without `streams`, one stream of all examples; with, global batch b is one
  sub-batch of G/S per stream, sub-batch s from stream s's own permutations.
  """

  def __init__(self, source: Any, global_batch_size: int, local: int, offset: int, seed: int,
               streams: Streams | None = None, ramp: tuple | None = None):
    self.ramp = ramp  # (BatchRamp, first step, process index, process count)
    self.source = source
    self.n = len(source)
    self.global_batch_size = global_batch_size
    self.local = local
    self.offset = offset
    self.seed = seed
    self.streams = streams
    counts = getattr(source, "counts", None)  # a data/mixture.MixedSource: rows by weight
    self.mixture = None if counts is None else Mixture(counts, seed)
    self._perms: dict[tuple[int, int], np.ndarray] = {}
    self._lock = threading.Lock()

  def batch_indices(self, batch: int) -> np.ndarray:
    if self.streams is not None:
      return self._stream_indices(batch)
    if self.ramp is not None:  # batch b is step first + b, of that step's size
      ramp, first, index, count = self.ramp
      local = ramp.size(first + batch) // count
      start = ramp.examples_before(first + batch) - ramp.examples_before(first)
      return self._rows(start + index * local + np.arange(local, dtype=np.int64))
    flat = batch * self.global_batch_size + self.offset + np.arange(self.local, dtype=np.int64)
    return self._rows(flat)

  def _rows(self, flat: np.ndarray) -> np.ndarray:
    """Source indices of stream rows `flat`: one shuffled stream, or a mixture's draws
    (data/mixture: each row's source and draw from its number; each source its epochs)."""
    if self.mixture is None:
      return self._draw(0, self.n, flat)
    source, draws = self.mixture.assign(flat)
    out = np.empty(len(flat), np.int64)
    for i in np.unique(source):
      sel = source == i
      n = len(self.source.sources[int(i)])
      out[sel] = self.source.offsets[i] + self._draw(-1 - int(i), n, draws[sel])
    return out

  def _stream_indices(self, batch: int) -> np.ndarray:
    sub = self.global_batch_size // self.streams.count
    at = self.offset + np.arange(self.local, dtype=np.int64)  # places in the global batch
    stream_of, k = np.divmod(at, sub)
    out = np.empty(self.local, np.int64)
    for s in np.unique(stream_of):
      sel = stream_of == s
      n = self.streams.size(int(s))
      out[sel] = self.streams.index(int(s), self._draw(int(s), n, batch * sub + k[sel]))
    return out

  def _draw(self, stream: int, n: int, flat: np.ndarray) -> np.ndarray:
    """Items `flat` of a stream of `n` examples: epochs of seeded permutations."""
    epochs, offsets = np.divmod(flat, n)
    out = np.empty(len(flat), np.int64)
    for e in np.unique(epochs):
      sel = epochs == e
      out[sel] = self._permutation(stream, n, int(e))[offsets[sel]]
    return out

  def _permutation(self, stream: int, n: int, epoch: int) -> np.ndarray:
    with self._lock:
      if (stream, epoch) not in self._perms:
        mine = [key for key in self._perms if key[0] == stream]
        if len(mine) >= 2:  # only the current and next epoch of a stream are ever needed
          self._perms.pop(min(mine))
        # One stream (no `streams`) keeps the seeds it had before streams existed; a
        # mixture's source i is stream -1-i, seeded apart (data/mixture).
        key = [self.seed % 2**63, epoch] if self.streams is None and stream == 0 else (
            self.mixture.draw_key(-1 - stream, epoch) if stream < 0 else
            [self.seed % 2**63, stream, epoch])
        dtype = np.int32 if n < 2**31 else np.int64
        self._perms[(stream, epoch)] = np.random.default_rng(key).permutation(n).astype(dtype)
      return self._perms[(stream, epoch)]

  def make(self, batch: int) -> Batch:
    return read_examples(self.source, self.batch_indices(batch))


def _streams(source: Any, global_batch_size: int, count: int, offset: int, local: int,
             parts: Sequence[tuple[int, int]] | None) -> Streams:
  """The streams of `source`; those this host reads (batch places [offset, offset+local))
  must have examples."""
  if global_batch_size % count:
    raise ConfigError(f"--config.data.streams={count}: expected a divisor of "
                      f"--config.train.batch_size={global_batch_size}")
  parts = parts if parts is not None else getattr(source, "parts", None)
  if parts is None:
    raise ConfigError(f"--config.data.streams={count}: the prepared data records no parts "
                      "(prepared before streams existed); delete it and prepare it again, "
                      "or use --config.data.streams=1")
  layout = Streams(parts, count)
  sub = global_batch_size // count
  for s in range(offset // sub, (offset + local - 1) // sub + 1):
    if layout.size(s) == 0:
      raise CorpusError(f"--config.data.streams={count}: stream {s} (parts p with p % {count} "
                        f"== {s}) has no training examples here; the data has {len(parts)} "
                        f"part(s); use fewer streams or smaller parts")
  return layout


def _produce(sampler: _Sampler, out: queue.Queue, stop: threading.Event, batch: int) -> None:
  # Holds no reference to the TrainIterator, so dropping it stops this thread.
  while not stop.is_set():
    try:
      item: Any = sampler.make(batch)
    except BaseException as e:  # handed to the consumer, raised there
      item = e
    while not stop.is_set():
      try:
        out.put(item, timeout=0.1)
        break
      except queue.Full:
        continue
    if isinstance(item, BaseException):
      return
    batch += 1


class TrainIterator:
  """Infinite shuffled per-host batches; `position` counts global batches consumed.

  The data is one endless stream: epoch e is the permutation of all examples
  drawn from (seed, e), and epochs are concatenated, so a global batch may
  wrap from the end of one epoch into the next (nothing is dropped, and a
  source smaller than a batch still works). Global batch b is stream items
  [b*G, (b+1)*G); host p of P yields items [b*G + p*G/P, b*G + (p+1)*G/P),
  so hosts read disjoint data whose union is the global batch. `prefetch`
  batches are read ahead on a background thread (0 = read on demand).

  With `ramp` (a batch-size warm-up, data/batch_ramp), batch b is step
  `first_step` + b of the run, of that step's global size G_s, and its stream items
  start after the items of the phase's earlier steps: the same slicing with G_s.

  With `per_host`, `source` holds only this host's examples (host-local parts,
  see dataset.Share): the host's stream is its own, epoch e the permutation of
  its examples drawn from (seed, host, e), and global batch b is every host's
  batch b of G/P examples. The same process count resumes exactly; another
  needs other parts on each host (prepared again), and gives another order.

  With `streams` S > 1 (not `per_host`), global batch b is S sub-batches of
  G/S, sub-batch s items [b*G/S, (b+1)*G/S) of stream s (`Streams`; its own
  epochs, drawn from (seed, s, e)); host p yields its slice of that as above.
  `parts` ((part index, records) in stored order; default `source.parts`)
  locates the streams, so a host-local source of only this host's streams'
  parts gives the same batches as the whole data when S % P == 0.
  """

  def __init__(self, source: Any, global_batch_size: int, seed: int, process_index: int = 0,
               process_count: int = 1, start_batch: int = 0, prefetch: int = 2,
               per_host: bool = False, streams: int = 1,
               parts: Sequence[tuple[int, int]] | None = None,
               ramp: BatchRamp | None = None, first_step: int = 0):
    local = _check_hosts(global_batch_size, process_index, process_count)
    if ramp is not None:
      if per_host or streams != 1:
        raise ConfigError("--config.train.batch_ramp with host-local parts or "
                          "--config.data.streams > 1: expected one of them only (their "
                          "batches are fixed slices of each host's or stream's data)")
      for size in ramp.sizes():
        _check_hosts(size, process_index, process_count)
    if start_batch < 0:
      raise ConfigError(f"start_batch must be >= 0, got {start_batch}")
    if len(source) == 0:
      raise CorpusError("the training data has no examples")
    if per_host:
      stream_seed = int(seed) if process_count == 1 else int(seed) * 100_003 + process_index
      self._sampler = _Sampler(source, local, local, 0, stream_seed)
    else:
      layout = None if streams == 1 else _streams(source, global_batch_size, streams,
                                                  process_index * local, local, parts)
      self._sampler = _Sampler(source, global_batch_size, local, process_index * local,
                               int(seed), layout, ramp and (ramp, int(first_step),
                                                            process_index, process_count))
    self._position = int(start_batch)
    self._prefetch = int(prefetch)
    self._queue: queue.Queue | None = None
    self._thread: threading.Thread | None = None
    self._stop = threading.Event()

  @property
  def position(self) -> int:
    """Global batches consumed so far; pass as `start_batch` to resume after them."""
    return self._position

  @property
  def epoch(self) -> float:
    """Passes over the data consumed so far (fractional)."""
    if self._sampler.ramp is not None:
      ramp, first = self._sampler.ramp[:2]
      return (ramp.examples_before(first + self._position)
              - ramp.examples_before(first)) / self._sampler.n
    return self._position * self._sampler.global_batch_size / self._sampler.n

  @property
  def source(self) -> Any:
    return self._sampler.source

  @property
  def num_examples(self) -> int:
    return self._sampler.n

  def batch_indices(self, batch: int) -> np.ndarray:
    """Source indices of this host's part of global batch `batch`."""
    return self._sampler.batch_indices(batch)

  def __iter__(self) -> TrainIterator:
    return self

  def __next__(self) -> Batch:
    if self._prefetch <= 0:
      batch = self._sampler.make(self._position)
    else:
      if self._thread is None:
        self._queue = queue.Queue(maxsize=self._prefetch)
        self._thread = threading.Thread(
            target=_produce, args=(self._sampler, self._queue, self._stop, self._position),
            name="bert-jax-prefetch", daemon=True)
        self._thread.start()
      item = self._queue.get()
      if isinstance(item, BaseException):
        self.close()
        raise item
      batch = item
    self._position += 1
    return batch

  def close(self) -> None:
    """Stops the prefetch thread; a later next() restarts it at `position`."""
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
    self._thread, self._queue, self._stop = None, None, threading.Event()

  def __del__(self) -> None:
    # No join: this may run on any thread; the producer exits on its own.
    stop = getattr(self, "_stop", None)  # absent if __init__ raised
    if stop is not None:
      stop.set()

  def __enter__(self) -> TrainIterator:
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def eval_batches(source: Any, global_batch_size: int, process_index: int = 0,
                 process_count: int = 1,
                 host_sizes: Sequence[int] | None = None) -> Iterator[Batch]:
  """One pass in stored order; the last batch is padded with all-zero examples.

  `example_mask_B` is 1 for real examples and 0 for padding. All hosts yield
  the same number of batches, ceil(len(source) / G), so they stay in step in
  collective ops. With `host_sizes` (every host's eval examples), `source`
  holds only this host's (host-local parts): each host reads G/P of its own
  per batch, for as many batches as the largest needs.
  """
  local = _check_hosts(global_batch_size, process_index, process_count)
  if host_sizes is not None:
    return _eval_batches(source, local, local, 0, max(host_sizes))
  return _eval_batches(source, global_batch_size, local, process_index * local)


def _eval_batches(source: Any, global_batch_size: int, local: int,
                  offset: int, longest: int | None = None) -> Iterator[Batch]:
  n = len(source)
  if max(n, longest or 0) == 0:
    return
  for start in range(0, max(n, longest or 0), global_batch_size):
    first = start + offset
    indices = list(range(first, min(first + local, n)))
    real = len(indices)
    # Padding repeats the first example, then is zeroed: the same dtypes and shapes.
    batch = read_examples(source, indices + [0] * (local - real))
    mask = np.zeros(local, np.float32)
    mask[:real] = 1.0
    keep = lambda x: np.where(mask.reshape((-1,) + (1,) * (x.ndim - 1)) > 0, x, 0).astype(x.dtype)
    yield Batch(*(keep(x) for x in batch[:-1]), mask)
