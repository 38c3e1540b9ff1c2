"""A mixture of prepared sources, drawn by weight when batches are made (no JAX).

Token shares. Source i of n_i training tokens with weight w_i gets the share
p_i ∝ w_i * n_i ** temperature of the tokens drawn: temperature 0 gives the weights,
1 the sources' sizes (their concatenation), 0.3 mmBERT's flattened language mix.
Rows are drawn, not tokens, so source i's share of the rows is q_i ∝ p_i / t_i, with
t_i its mean tokens per example: a source of short examples gives more of them.

The draw. The stream of rows (global batch b holds rows [b*G, (b+1)*G), as for one
corpus, input_pipeline) is cut into blocks of K rows. Every block holds exactly c_i
rows of source i (`block_counts`: the largest-remainder rounding of q_i*K, each
source at least one), at places shuffled by (seed, block). So the k-th row of source
i in the stream is known from the row's number alone: row r, in block r // K at its
slot's rank j, is source i's draw (r // K) * c_i + j, and draw d is item d of the
source's own endless stream of seeded permutations. Batches are a pure function of
(seed, row number): exact resume, any process count, a batch-size ramp all hold as
for one corpus; and over any whole number of blocks the rows of each source are
exactly c_i per block, a deviation from q_i of at most 1/(2K) per source.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from bert_jax.data.pretraining_data import FEATURES, Batch

MIN_BLOCK = 4096  # rows per block: shares within 1/8192 of q
MAX_BLOCK = 1 << 20
_ROWS_PER_SMALLEST = 64  # the smallest source gets this many rows a block, where K allows
_MIX_KEY = 0x6D6978  # "mix": the seeds of the mixture's draws are apart from all others


def token_shares(weights: Sequence[float], tokens: Sequence[float],
                 temperature: float) -> np.ndarray:
  """p_i ∝ w_i * n_i ** temperature, summing to 1."""
  w = np.asarray(weights, np.float64) * np.asarray(tokens, np.float64) ** float(temperature)
  if not np.all(np.isfinite(w)) or w.sum() <= 0:
    raise ValueError(f"mixture weights {list(weights)} over sizes {list(tokens)}: no share")
  return w / w.sum()


def row_shares(shares: np.ndarray, mean_tokens: Sequence[float]) -> np.ndarray:
  """q_i ∝ p_i / t_i: the rows that give token shares p."""
  q = shares / np.asarray(mean_tokens, np.float64)
  return q / q.sum()


def block_counts(q: np.ndarray) -> np.ndarray:
  """Rows of each source per block: K = sum, the largest-remainder rounding of q*K with
  every source at least 1; K grows (up to MAX_BLOCK) so the smallest has rows to spare.
  A source of share 0 (a phase that does not draw it) gets none."""
  q = np.asarray(q, np.float64)
  smallest = float(np.min(q[q > 0]))
  k = int(min(MAX_BLOCK, max(MIN_BLOCK, np.ceil(_ROWS_PER_SMALLEST / smallest))))
  exact = q * k
  counts = np.where(q > 0, np.maximum(np.floor(exact).astype(np.int64), 1), 0)
  left = k - int(counts.sum())
  order = [i for i in np.argsort(-(exact - np.floor(exact)), kind="stable") if q[i] > 0]
  for i in order[:max(left, 0)]:
    counts[i] += 1
  while counts.sum() > k:  # the minimum of 1 overshot: take from the largest
    counts[int(np.argmax(counts))] -= 1
  return counts


class Mixture:
  """Which source, and which of its draws, each row of the stream is."""

  def __init__(self, counts: np.ndarray, seed: int):
    self.counts = np.asarray(counts, np.int64)
    self.block = int(self.counts.sum())
    self._slot_source = np.repeat(np.arange(len(self.counts)), self.counts)
    self._slot_rank = np.arange(self.block) - np.repeat(
        np.concatenate([[0], np.cumsum(self.counts)[:-1]]), self.counts)
    self.seed = int(seed) % 2**63
    self._orders: dict[int, np.ndarray] = {}
    self._lock = threading.Lock()

  def assign(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(source, draw number within the source) of each row number."""
    rows = np.asarray(rows, np.int64)
    blocks, at = np.divmod(rows, self.block)
    slots = np.empty(len(rows), np.int64)
    for b in np.unique(blocks):
      sel = blocks == b
      slots[sel] = self._order(int(b))[at[sel]]
    source = self._slot_source[slots]
    return source, blocks * self.counts[source] + self._slot_rank[slots]

  def _order(self, block: int) -> np.ndarray:
    with self._lock:
      if block not in self._orders:
        if len(self._orders) >= 4:  # a batch spans at most a few blocks
          self._orders.pop(min(self._orders))
        self._orders[block] = np.random.default_rng(
            [self.seed, _MIX_KEY, block]).permutation(self.block)
      return self._orders[block]

  def draw_key(self, source: int, epoch: int) -> list[int]:
    """The seed of source `source`'s permutation in epoch `epoch`."""
    return [self.seed, _MIX_KEY, 1 + source, epoch]


@dataclasses.dataclass
class MixedSource:
  """Sources side by side as one random-access source: index `offsets[i] + j` is item j
  of source i. With `counts` (rows per block, `block_counts`), input_pipeline draws the
  training rows as a `Mixture` of them; `names` and `shares` (p) describe it."""
  sources: list
  names: list[str]
  shares: np.ndarray  # token shares p asked for
  counts: np.ndarray | None = None  # None: read in order (an eval split)
  # Phases with a mixture of their own: phase index -> (shares, counts).
  phases: dict = dataclasses.field(default_factory=dict)

  def for_phase(self, phase: int) -> "MixedSource":
    """The same sources drawn as phase `phase` asks (its weights and temperature)."""
    if phase not in self.phases:
      return self
    shares, counts = self.phases[phase]
    return MixedSource(self.sources, self.names, shares, counts)

  def __post_init__(self):
    self.offsets = np.concatenate([[0], np.cumsum([len(s) for s in self.sources])]).astype(
        np.int64)

  def __len__(self) -> int:
    return int(self.offsets[-1])

  def source_of(self, indices: np.ndarray) -> np.ndarray:
    return np.searchsorted(self.offsets, np.asarray(indices, np.int64), side="right") - 1

  def read_batch(self, indices: Sequence[int]) -> Batch:
    """The examples at `indices`, in their order, each read from its source."""
    indices = np.asarray(indices, np.int64)
    which = self.source_of(indices)
    parts: dict[str, Any] = {}
    for i in np.unique(which):
      sel = np.nonzero(which == i)[0]
      got = read_examples(self.sources[int(i)], (indices[sel] - self.offsets[i]).tolist())
      for k, x in zip(FEATURES, got[:len(FEATURES)]):
        parts.setdefault(k, np.zeros((len(indices),) + x.shape[1:], x.dtype))[sel] = x
    return Batch.from_features(parts)

  def __getitem__(self, i: int) -> dict:
    return {k: x[0] for k, x in zip(FEATURES, self.read_batch([i]))}


def read_examples(source: Any, indices: Sequence[int]) -> Batch:
  """The examples at `indices` of a random-access source, as one stacked Batch."""
  indices = [int(i) for i in indices]
  read_batch = getattr(source, "read_batch", None)
  if read_batch is not None:  # dataset.ExampleSource decodes a whole batch at once
    return read_batch(indices)
  getitems = getattr(source, "__getitems__", None)
  examples = list(getitems(indices)) if getitems else [source[i] for i in indices]
  # Scalars may come back as Python ints (int64 once stacked): from_features casts.
  return Batch.from_features({k: np.stack([np.asarray(e[k]) for e in examples])
                              for k in FEATURES})


def describe(names: Sequence[str], asked: np.ndarray, drawn: np.ndarray | None = None) -> str:
  """'web 70.0%, code 30.0%' (asked), or 'web 69.8% (asked 70.0%), ...' (drawn)."""
  if drawn is None:
    return ", ".join(f"{n} {p:.1%}" for n, p in zip(names, asked))
  total = max(float(np.sum(drawn)), 1.0)
  return ", ".join(f"{n} {d / total:.1%} (asked {p:.1%})" for n, p, d in zip(names, asked, drawn))
