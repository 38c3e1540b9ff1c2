"""Packed rows: several documents' spans in one row, up to the sequence length (`config.data.packing`).

With objective 'mlm' a row is one span of one document, `[CLS] tokens [SEP]`,
padded to L: on a corpus of short documents most of each step computes on
padding. Packed, a row holds several such pieces back to back, each still
`[CLS] tokens [SEP]`, so a row carries its document boundaries in its [CLS]
tokens. The step derives each token's document from them (in the uncorrupted ids,
before masking), the model keeps attention inside each document (a block-diagonal
mask) and restarts positions at each [CLS] (model/bert), masking never picks
[CLS]/[SEP], and the loss counts real tokens only. A piece sees exactly what it saw
unpacked (its tokens, positions, and attention over itself alone), so a packed
row's MLM loss is the sum of its pieces' unpacked losses (tests/test_packing.py).
The packed record is an unpacked one with n_a = n = the tokens used: readers
need nothing new.

Pieces go into rows in the order they were made, best fit (`groups`), within each
block of a part's records:
deterministic, resumable by position like any prepared data, and byte-identical for
any number of workers, since parts are the unit of work. Without a document mask
packing would let a piece attend to unrelated text; NeoBERT's ablation (arXiv
2502.19587) found that lowers GLUE. NSP and SOP rows are one sentence pair each:
nothing to pack, and settings refuses packing with them.

Shapes: K unpacked records, M packed ones, R = HEADER + L.
"""

from __future__ import annotations

import numpy as np

from bert_jax.data.prep_store import HEADER


def groups(lengths_K: np.ndarray, seq_len: int) -> np.ndarray:
  """int [K]: the packed row of each piece. Best fit, in order: each piece goes to the
  open row with the least room that still holds it, else starts a row (rows are
  numbered as they start). Next fit would waste about half a row whenever pieces are
  near half the sequence length; best fit fills rows to ~95% on short documents."""
  out = np.empty(len(lengths_K), np.int64)
  open_rows: list[list[int]] = [[] for _ in range(seq_len + 1)]  # by room left
  count = np.zeros(seq_len + 1, np.int64)
  rows = 0
  for k, n in enumerate(lengths_K.tolist()):
    fits = np.flatnonzero(count[n:])
    if len(fits):
      room = n + int(fits[0])
      row = open_rows[room].pop()
      count[room] -= 1
    else:
      room, row, rows = seq_len, rows, rows + 1
    out[k] = row
    open_rows[room - n].append(row)
    count[room - n] += 1
  return out


def pack(rows_KxR: np.ndarray, seq_len: int) -> np.ndarray:
  """One-segment records [K, R] (n_a = n, `[CLS] tokens [SEP]`) -> packed records [M, R]."""
  if not len(rows_KxR):
    return rows_KxR
  n_K = rows_KxR[:, 1].astype(np.int64)
  g_K = groups(n_K, seq_len)
  m = int(g_K.max()) + 1
  total_M = np.bincount(g_K, weights=n_K, minlength=m).astype(np.int64)
  # Each piece's offset in its packed row: tokens of the earlier pieces of that row.
  order_K = np.argsort(g_K, kind="stable")  # by row, in arrival order within a row
  before_K = np.empty_like(n_K)
  sorted_n = n_K[order_K]
  before_K[order_K] = np.cumsum(sorted_n) - sorted_n
  offset_K = before_K - (np.cumsum(total_M) - total_M)[g_K]
  pos_1xL = np.arange(seq_len)[None, :]
  real_KxL = pos_1xL < n_K[:, None]
  k_T, p_T = np.nonzero(real_KxL)  # every real token, row-major: in order
  out = np.zeros((m, rows_KxR.shape[1]), rows_KxR.dtype)
  out[g_K[k_T], HEADER + offset_K[k_T] + p_T] = rows_KxR[k_T, HEADER + p_T]
  out[:, 0] = out[:, 1] = total_M
  return out
