"""Packed rows (`config.data.packing`, data/packing.py): several documents per row, each
seeing only itself.

A packed piece must see exactly what it saw unpacked: its own tokens, positions
from 0, attention over itself alone. The checks go from the records to the loss.
"""

import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.data import dataset, packing, prep_parts, prep_workers
from bert_jax.data.prep_store import HEADER
from bert_jax.errors import ConfigError
from bert_jax.model import losses
from bert_jax.model.bert import BertForPreTraining, BertModel
from bert_jax.settings.model import ModelConfig
from bert_jax.settings import DataSettings
import soak_kill
import tiny_run
from test_prepare_workers import prepared_bytes

CLS, SEP = 2, 3
CONFIG = ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4,
                    intermediate_size=64, max_position_embeddings=32, vocab_pad_multiple=16,
                    dropout_rate=0.0, attention_dropout_rate=0.0)
L = 24


def _record(tokens: list[int], seq_len: int = L) -> np.ndarray:
  """An unpacked one-segment record: [n_a, n, label, [CLS] tokens [SEP] 0...]."""
  ids = [CLS, *tokens, SEP]
  return np.array([len(ids), len(ids), 0, *ids, *[0] * (seq_len - len(ids))], np.int32)


def test_pieces_go_best_fit_in_order_and_keep_every_token():
  lengths = (7, 10, 14, 5, 22, 2)  # with [CLS] and [SEP]
  pieces = [list(range(10 * i, 10 * i + n - 2)) for i, n in enumerate(lengths, 1)]
  rows = np.stack([_record(p) for p in pieces])
  packed = packing.pack(rows, L)
  # 7 | 7+10 | 7+10, 14 | 7+10+5, 14 | ..., 22 | 7+10+5, 14, 22+2: the least room that fits.
  assert packed[:, 1].tolist() == [22, 14, 24] and (packed[:, 0] == packed[:, 1]).all()
  by_row = [[0, 1, 3], [2], [4, 5]]
  for r, members in zip(packed, by_row):
    assert r[HEADER:HEADER + r[1]].tolist() == [t for i in members
                                                for t in (CLS, *pieces[i], SEP)]
    assert (r[HEADER + r[1]:] == 0).all()  # padding after the pieces


def _documents(ids_BxL: np.ndarray) -> jnp.ndarray:
  return jnp.cumsum(jnp.asarray(ids_BxL) == CLS, axis=1, dtype=jnp.int32)


def _params():
  ids = jnp.ones((1, 8), jnp.int32)
  return nn.meta.unbox(BertForPreTraining(CONFIG).init(
      jax.random.key(0), ids, ids, ids, jnp.zeros((1, 1), jnp.int32)))["params"]


# Three documents with tokens of their own (no id shared but [CLS] and [SEP]).
DOCS = [[10, 11, 12, 13], [20, 21, 22, 23, 24, 25], [30, 31, 32]]


def _packed_row():
  rows = np.stack([_record(d) for d in DOCS])
  row = packing.pack(rows, L)
  assert len(row) == 1, "the three documents fit one row"
  ids = row[:, HEADER:]
  return ids, (np.arange(L)[None] < row[:, 1:2]).astype(np.int32)


def _grads_across_documents(params, with_document_mask: bool) -> np.ndarray:
  """[3, 3]: |d (sum of doc i's outputs) / d (token embeddings of doc j's own tokens)|."""
  ids, mask = _packed_row()
  docs = _documents(ids)

  def out_of_doc(p, i):
    out = BertModel(CONFIG).apply({"params": p["bert"]}, ids, 0 * ids, mask,
                                  documents_BxL=docs if with_document_mask else None)
    return jnp.sum(jnp.where((docs == i + 1)[..., None], out.sequence_BxLxD, 0.0))

  table = np.zeros((3, 3))
  for i in range(3):
    g = jax.grad(out_of_doc)(params, i)["bert"]["embeddings"]["word_embeddings"]["embedding"]
    for j, doc in enumerate(DOCS):
      table[i, j] = float(jnp.abs(g[jnp.asarray(doc)]).sum())
  return table


def test_the_document_mask_blocks_every_cross_document_gradient():
  table = _grads_across_documents(_params(), with_document_mask=True)
  off_diagonal = table[~np.eye(3, dtype=bool)]
  assert (off_diagonal == 0).all(), table
  assert (np.diag(table) > 0).all(), table


def test_without_the_document_mask_documents_see_each_other():
  # The check above can fail: the same row, attention over the whole row.
  table = _grads_across_documents(_params(), with_document_mask=False)
  assert (table[~np.eye(3, dtype=bool)] > 0).all(), table


def test_the_packed_loss_is_the_sum_of_the_unpacked_losses():
  params = _params()
  model = BertForPreTraining(CONFIG)
  rng = np.random.default_rng(0)
  # Per document: two masked positions (never [CLS]/[SEP]) with labels.
  chosen = [sorted(rng.choice(np.arange(1, len(d) + 1), 2, replace=False)) for d in DOCS]
  labels = [[d[p - 1] for p in c] for d, c in zip(DOCS, chosen)]
  total = losses.Sums(0.0, 0.0, 0.0)
  for d, c, y in zip(DOCS, chosen, labels):
    ids = _record(d)[None, HEADER:]
    mask = (ids > 0).astype(np.int32)
    masked = ids.copy()
    masked[0, c] = 4  # [MASK]
    out = model.apply({"params": params}, masked, 0 * ids, mask, np.array([c]))
    s = losses.mlm_sums(out.mlm_logits_BxPxV, np.array([y]), np.ones((1, 2), np.float32))
    total = losses.Sums(*(a + b for a, b in zip(total, s)))
  ids, mask = _packed_row()
  starts = np.cumsum([0] + [len(d) + 2 for d in DOCS])[:-1]
  positions = np.concatenate([np.array(c) + s for c, s in zip(chosen, starts)])[None]
  masked = ids.copy()
  masked[0, positions[0]] = 4
  out = model.apply({"params": params}, masked, 0 * ids, mask, positions,
                    documents_BxL=_documents(ids))
  packed = losses.mlm_sums(out.mlm_logits_BxPxV, np.array([sum(labels, [])]),
                           np.ones((1, 6), np.float32))
  np.testing.assert_allclose(float(packed.loss), float(total.loss), rtol=1e-5)
  assert float(packed.count) == float(total.count) == 6.0


def test_packing_is_refused_with_a_sentence_pair_objective():
  with pytest.raises(ConfigError, match=r"--config.data.packing=True: expected True only "
                     r"with --config.objective='mlm'"):
    DataSettings(objective="mlm+nsp", packing=True)


def _short_documents(path: str, n: int = 600) -> str:
  """Documents of 1-3 of the toy corpus's short sentences: most unpacked rows padding."""
  sentences = [l.strip().replace("\t", " ") for l in open(tiny_run.TOY, encoding="utf-8")
               if l.strip()]
  rng = np.random.default_rng(0)
  with open(path, "w", encoding="utf-8") as f:
    for _ in range(n):
      f.write("\n".join(rng.choice(sentences, rng.integers(1, 4))) + "\n\n")
  return path


def _train_real_tokens(p) -> list[int]:
  src = p.train[64]
  return [int(src[i]["input_mask"].sum()) for i in range(len(src))]


def test_packed_data_has_the_same_bytes_for_1_and_2_workers_and_every_token(
    tmp_path, monkeypatch):
  text = _short_documents(str(tmp_path / "corpus.txt"))
  monkeypatch.setattr(prep_parts, "PART_BYTES", 5_000)
  monkeypatch.setattr(prep_workers, "usable_cores", lambda: 2)
  base = {"corpus": text, "vocab_size": 400, "dupe_factor": 1, "objective": "mlm"}
  found, real = {}, {}
  for workers, packed in ((1, True), (2, True), (1, False)):
    p = dataset.prepare(DataSettings(**base, packing=packed, num_workers=workers), [64],
                        str(tmp_path / f"cache{workers}{packed}"), seed=0)
    found[(workers, packed)] = prepared_bytes(p.directory)
    real[packed] = _train_real_tokens(p)
  assert found[(1, True)] == found[(2, True)]
  assert sum(real[True]) == sum(real[False])  # regrouped, nothing lost or repeated
  fill = {k: np.mean(v) / 64 for k, v in real.items()}  # real tokens per row / L
  assert fill[True] > 0.85 and fill[False] < 0.6, fill


def test_a_document_whose_text_spells_cls_stays_one_document_when_packed(tmp_path):
  """Text about BERT says "[CLS]" and "[SEP]": it must not start a document in a packed
  row (issue 41: the step split such a piece in two, its hidden states off by 0.83). The
  packed rows' [CLS] tokens are exactly the unpacked rows, one per piece."""
  docs = []
  for d in range(60):
    docs.append(f"Document {d} says [CLS] starts a row and [SEP] ends a segment.\n"
                f"Its [MASK] token and [PAD] are special in BERT {d}.\n\n")
  path = tmp_path / "bert_docs.txt"
  path.write_text("".join(docs), encoding="utf-8")
  base = {"corpus": str(path), "vocab_size": 200, "dupe_factor": 1, "objective": "mlm"}
  rows = {}
  for packed in (False, True):
    p = dataset.prepare(DataSettings(**base, packing=packed), [64], str(tmp_path / str(packed)),
                        seed=0)
    cls = p.tokenizer.cls_id
    src = p.train[64]
    rows[packed] = [np.asarray(src[i]["input_ids"]) for i in range(len(src))]
    assert "[CLS]" not in p.tokenizer.decode(  # the text's [CLS] is the text's pieces
        [t for r in rows[packed] for t in r if t != cls])
  cls_packed = sum(int((r == cls).sum()) for r in rows[True])
  assert all(int((r == cls).sum()) == 1 for r in rows[False])
  assert len(rows[True]) < len(rows[False]) == cls_packed  # a [CLS] per piece, no more


def test_a_packed_run_computes_on_real_tokens(tmp_path):
  from bert_jax.trainer import train_and_evaluate  # pylint: disable=import-outside-toplevel
  share = {}
  for packed in (False, True):
    config = tiny_run.config(**{"train.num_steps": 3, "objective": "mlm",
                                "data.packing": packed, "log_every": 1})
    workdir = str(tmp_path / f"w{packed}")
    train_and_evaluate(config, workdir)
    with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
      rows = [json.loads(line) for line in f if '"real_tokens_per_sec"' in line]
    share[packed] = rows[-1]["real_tokens_per_sec"] / rows[-1]["tokens_per_sec"]
    assert np.isfinite(rows[-1]["mlm_loss"])
  # The toy corpus's documents are two short sentences: most of an unpacked row is padding.
  assert share[True] > 0.8 and share[False] < 0.4, share


# At the phase boundary (inside each of three stages and at both boundaries, with kill -9:
# tests/test_stages.py's packed ModernBERT run).
@pytest.mark.parametrize("resume_at", [8])
def test_a_packed_two_phase_run_resumes_exactly(tmp_path_factory, resume_at):
  import shutil  # pylint: disable=import-outside-toplevel
  from bert_jax.trainer import train_and_evaluate  # pylint: disable=import-outside-toplevel
  base = tmp_path_factory.getbasetemp() / "packed_resume"
  config = lambda: soak_kill.tiny_config(str(base / "prepared"), 16, 2, **{
      "objective": "mlm", "data.packing": True, "keep_checkpoints": soak_kill.KEEP_ALL})
  reference = base / "reference"
  if not reference.exists():  # one uninterrupted run for every case
    train_and_evaluate(config(), str(reference))
  workdir = base / f"resume_at_{resume_at}"
  shutil.copytree(reference, workdir)
  for step in soak_kill.complete_steps(str(workdir)):
    if step > resume_at:
      shutil.rmtree(workdir / "checkpoints" / str(step))
  train_and_evaluate(config(), str(workdir))
  assert soak_kill.differences(str(reference), str(workdir)) == []
