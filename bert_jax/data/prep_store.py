"""The stored form of prepared examples: a preparation's file layout, the record
format, and random access to the records (`ExampleSource`).

Layout of one preparation (see `dataset`): settings.json, stats.json,
tokenizer/, manifest.json (written last), and seq<L>/ with info.json and the
array_record shards of each split. Record format (one record per example,
dtype in info.json): [n_a, n, label, input_ids[L]], where n_a is the length of
`[CLS] A [SEP]` and n the used length; segment ids and input mask follow from
them.

Shapes: K examples, L = seq_len, R = HEADER + L.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
from array_record.python.array_record_module import ArrayRecordReader

from bert_jax.data import pretraining_data
from bert_jax.storage import fs

TOKENIZER_DIR = "tokenizer"
SETTINGS_FILE = "settings.json"
STATS_FILE = "stats.json"
INFO_FILE = "info.json"
MANIFEST_FILE = "manifest.json"  # byte sizes of the top-level files, written last
HEADER = 3  # n_a, n, label


def seq_dir(directory: str, seq_len: int) -> str:
  return os.path.join(directory, f"seq{seq_len}")


def shard_path(prefix: str, shard: int) -> str:
  return f"{prefix}.{shard:05d}.array_record"


def write_json(path: str, obj: Any) -> None:
  """`obj` as JSON, atomically (storage.fs: the one writer of whole files)."""
  text = json.dumps(obj, indent=2, sort_keys=True)
  fs.write_atomic_local(path, lambda f: f.write(text.encode("utf-8")))


class ExampleSource:
  """Random access to stored examples: `len(src)`, `src[i]`, `src.read_batch(indices)`.

  An example (`src[i]`, `__getitems__`) is a dict of `input_ids`,
  `segment_ids`, `input_mask` int32 [L] and `next_sentence_label` int32
  scalar. `read_batch` decodes many at once into one stacked `Batch` (what
  the input pipeline uses). Readers open on first use.
  """

  def __init__(self, paths: Sequence[str], counts: Sequence[int], seq_len: int, dtype: str):
    self.paths = list(paths)
    self.seq_len = seq_len
    self._ends = np.cumsum(np.asarray(counts, np.int64))
    self._n = int(self._ends[-1]) if len(self._ends) else 0
    # (part index, records) of each part, in stored order (the training split's; see
    # input_pipeline's streams); None when not recorded.
    self.parts: list[tuple[int, int]] | None = None
    self._dtype = np.dtype(dtype)
    self._readers: dict[int, Any] = {}
    self._lock = threading.Lock()

  def __len__(self) -> int:
    return self._n

  def __getitem__(self, index: int) -> dict[str, np.ndarray]:
    return self.__getitems__([index])[0]

  def __getitems__(self, indices: Sequence[int]) -> list[dict[str, np.ndarray]]:
    if not len(indices):
      return []
    arrays = self._read_arrays(indices)
    return [{name: arrays[name][k] for name in pretraining_data.FEATURES}
            for k in range(len(indices))]

  def _read_arrays(self, indices: Sequence[int]) -> dict[str, np.ndarray]:
    """FEATURES arrays [K, ...] of the examples at `indices` (K >= 1)."""
    keys = np.asarray([int(i) for i in indices], np.int64)
    keys = np.where(keys < 0, keys + self._n, keys)
    if keys.min() < 0 or keys.max() >= self._n:
      bad = int(keys[(keys < 0) | (keys >= self._n)][0])
      raise IndexError(f"example {bad} is out of range for {self._n} examples in "
                       f"{os.path.dirname(self.paths[0])}")
    shard_K = np.searchsorted(self._ends, keys, side="right")
    local_K = keys - np.concatenate([[0], self._ends])[shard_K]
    records: list[bytes] = [b""] * len(keys)
    with self._lock:
      for shard in np.unique(shard_K).tolist():
        where = np.flatnonzero(shard_K == shard)
        for k, record in zip(where.tolist(),
                             self._reader(shard).read(local_K[where].tolist())):
          records[k] = record
    rows_KxR = np.frombuffer(b"".join(records), self._dtype).reshape(len(keys), -1)
    return _decode(rows_KxR, self.seq_len)

  def read_batch(self, indices: Sequence[int]) -> pretraining_data.Batch:
    """The examples at `indices` stacked into one Batch (what the input pipeline reads)."""
    arrays = self._read_arrays(indices)
    return pretraining_data.Batch.from_features(arrays)

  def _reader(self, shard: int):
    if shard not in self._readers:
      self._readers[shard] = ArrayRecordReader(self.paths[shard], "readahead_buffer_size:0")
    return self._readers[shard]

  def __repr__(self) -> str:
    where = os.path.dirname(self.paths[0]) if self.paths else "nothing"
    return f"ExampleSource({where!r}, seq_len={self.seq_len}, examples={self._n})"


def _decode(rows_KxR: np.ndarray, seq_len: int) -> dict[str, np.ndarray]:
  n_a_Kx1 = rows_KxR[:, 0:1].astype(np.int32)
  n_Kx1 = rows_KxR[:, 1:2].astype(np.int32)
  pos_1xL = np.arange(seq_len, dtype=np.int32)[None, :]
  return {
      "input_ids": rows_KxR[:, HEADER:].astype(np.int32),
      "segment_ids": ((pos_1xL >= n_a_Kx1) & (pos_1xL < n_Kx1)).astype(np.int32),
      "input_mask": (pos_1xL < n_Kx1).astype(np.int32),
      "next_sentence_label": rows_KxR[:, 2].astype(np.int32),
  }
