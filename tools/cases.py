"""What the benchmark measures: model sizes, cases, the FLOP formula, one shared batch.

Imports neither JAX nor the peers, so a driver can list cases without starting
a backend. Shape legend: B batch, L sequence length, P masked positions (max
predictions), D hidden size, F feed-forward size, V vocabulary size, N layers.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bert_jax.data.tokenizer import SpecialIds
from bert_jax.model import flops
from configs import base, tiny

SPECIAL_IDS = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)  # as bert_jax.data.tokenizer
PAD, CLS, SEP, MASK = 0, 2, 3, 4


@dataclasses.dataclass(frozen=True)
class ModelSize:
  num_layers: int
  hidden_size: int
  num_heads: int
  intermediate_size: int
  vocab_size: int
  default_dtype: str  # the compute dtype our config for this size uses


def model_sizes() -> dict[str, ModelSize]:
  """tiny = configs/tiny.py, base = configs/base.py; small = L4 H256 in between."""
  out = {}
  for name, c in (("tiny", tiny.get_config()), ("base", base.get_config())):
    m = c.model
    out[name] = ModelSize(m.num_layers, m.hidden_size, m.num_heads, m.intermediate_size,
                          c.data.vocab_size, m.dtype)
  out["small"] = ModelSize(4, 256, 4, 1024, 30522, tiny.get_config().model.dtype)
  return out


@dataclasses.dataclass(frozen=True)
class Case:
  name: str
  kind: str  # 'train' | 'features' | 'prepare'
  model: str = ""  # key of model_sizes()
  batch: int = 0
  seq_len: int = 0
  predictions: int = 0  # masked positions per sequence (train)


CASES = (
    Case("train_tiny_128", "train", "tiny", 32, 128, 20),
    Case("train_tiny_512", "train", "tiny", 8, 512, 80),
    Case("train_small_128", "train", "small", 16, 128, 20),
    Case("train_base_128", "train", "base", 8, 128, 20),
    Case("train_base_512", "train", "base", 2, 512, 80),
    Case("features_base_128", "features", "base", 32, 128),
    Case("prepare", "prepare"),
)


def find(name: str) -> Case:
  """The case called `name`; KeyError names the known ones."""
  by_name = {c.name: c for c in CASES}
  if name not in by_name:
    raise KeyError(f"unknown case {name!r}; expected one of {list(by_name)}")
  return by_name[name]


def model_flops(size: ModelSize, kind: str, batch: int, seq_len: int,
                predictions: int = 0) -> float:
  """Analytic model FLOPs of one step (`bert_jax.model.flops.model_flops`, shared with training)."""
  return flops.model_flops(size.num_layers, size.hidden_size, size.intermediate_size,
                           size.vocab_size, kind, batch, seq_len, predictions)


def make_batch(case: Case, vocab_size: int, seed: int = 0) -> dict[str, np.ndarray]:
  """[CLS] A [SEP] B [SEP] with random word-piece ids, no padding, fixed seed.

  Masking is drawn once here (15% of the non-special tokens, capped at P,
  80/10/10) for the peers; ours masks inside its jitted step, as in training.
  """
  rs = np.random.RandomState(seed)
  B, L = case.batch, case.seq_len
  ids_BxL = rs.randint(len(SPECIAL_IDS), vocab_size, size=(B, L)).astype(np.int32)
  sep = L // 2
  ids_BxL[:, 0], ids_BxL[:, sep], ids_BxL[:, -1] = CLS, SEP, SEP
  seg_BxL = np.zeros_like(ids_BxL)
  seg_BxL[:, sep + 1:] = 1
  batch = {"input_ids": ids_BxL, "segment_ids": seg_BxL,
           "input_mask": np.ones_like(ids_BxL),
           "next_sentence_label": rs.randint(0, 2, size=B).astype(np.int32)}
  if case.predictions:
    labels_BxL = np.full_like(ids_BxL, -100)  # -100 = not predicted (HF's convention)
    masked_BxL = ids_BxL.copy()
    n = min(case.predictions, max(1, round(0.15 * (L - 3))))
    for b in range(B):
      candidates = np.setdiff1d(np.arange(L), [0, sep, L - 1])
      pos = np.sort(rs.choice(candidates, n, replace=False))
      labels_BxL[b, pos] = ids_BxL[b, pos]
      action = rs.rand(n)
      masked_BxL[b, pos] = np.where(action < 0.8, MASK, np.where(
          action < 0.9, rs.randint(len(SPECIAL_IDS), vocab_size, size=n), ids_BxL[b, pos]))
    batch["masked_ids"], batch["mlm_labels"] = masked_BxL, labels_BxL
  return batch
