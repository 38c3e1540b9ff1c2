"""Fine-tuning inputs: a split encoded once, length-bucketed batches, padding (numpy only).

Shape legend: N examples, B batch, L padded length (a bucket).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Optional

import numpy as np

from bert_jax.data.tokenizer import Tokenizer
from bert_jax.errors import ConfigError
from bert_jax.eval import tasks as tasks_lib
from bert_jax.features import extract as features


@dataclasses.dataclass
class Split:
  """One split, encoded: token ids per example and labels."""
  ids: list[list[int]]
  segments: list[list[int]]
  lengths_N: np.ndarray  # int64, real tokens per example
  labels_N: np.ndarray  # int32 class ids or float32 targets
  num_truncated: int

  def __len__(self) -> int:
    return len(self.ids)


def encode_split(tokenizer: Tokenizer, task: tasks_lib.Task, name: str,
                 max_length: int) -> Split:
  examples = task.splits[name]
  unlabelled = sum(e.label is None for e in examples)
  if unlabelled:
    raise ConfigError(f"task {task.name}: split '{name}' has {unlabelled} example(s) without a "
                      "label; expected labels to train or evaluate on")
  enc = features.encode(tokenizer, tasks_lib.inputs(examples), max_length)
  dtype = np.float32 if task.kind == "regression" else np.int32
  return Split(enc.ids, enc.segments, np.array([len(x) for x in enc.ids], np.int64),
               np.array([e.label for e in examples], dtype), enc.num_truncated)


def plan_batches(lengths_N: np.ndarray, bucket_lengths: Sequence[int], batch_size: int,
                 rng: Optional[np.random.Generator] = None) -> list[tuple[int, np.ndarray]]:
  """(padded length, rows) per batch; every batch holds rows of one length bucket.

  With `rng` (training): rows are shuffled within their bucket, then the
  batches are shuffled, so an epoch sees every row once in a random order of
  same-length batches. Without (evaluation): shortest first. The number of
  batches depends only on the bucket sizes, so it is the same every epoch.
  """
  bucket_lengths = np.asarray(bucket_lengths)
  bucket_N = bucket_lengths[np.searchsorted(bucket_lengths, lengths_N)]
  order = np.argsort(lengths_N, kind="stable") if rng is None else rng.permutation(len(lengths_N))
  batches = []
  for L in bucket_lengths:
    rows = order[bucket_N[order] == L]
    batches += [(int(L), rows[i:i + batch_size]) for i in range(0, len(rows), batch_size)]
  if rng is not None:
    batches = [batches[i] for i in rng.permutation(len(batches))]
  return batches


def pad_batch(split: Split, rows: np.ndarray, L: int, B: int) -> dict[str, np.ndarray]:
  """ids/segments/mask [B, L], labels/weights [B]; filler rows have weight 0."""
  ids_BxL = np.zeros((B, L), np.int32)
  segments_BxL = np.zeros((B, L), np.int32)
  mask_BxL = np.zeros((B, L), np.int32)
  labels_B = np.zeros((B,), split.labels_N.dtype)
  weights_B = np.zeros((B,), np.float32)
  for j, r in enumerate(rows):
    T = split.lengths_N[r]
    ids_BxL[j, :T] = split.ids[r]
    segments_BxL[j, :T] = split.segments[r]
    mask_BxL[j, :T] = 1
  labels_B[:len(rows)] = split.labels_N[rows]
  weights_B[:len(rows)] = 1.0
  return {"ids": ids_BxL, "segments": segments_BxL, "mask": mask_BxL, "labels": labels_B,
          "weights": weights_B}
