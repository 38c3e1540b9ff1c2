"""config.objective: 'mlm' (RoBERTa) and 'mlm+sop' (ALBERT) examples, cache keys, training."""

import dataclasses
import hashlib
import json
import os
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import settings
from bert_jax.data import dataset, pretraining_data as pd
from bert_jax.errors import ConfigError
from bert_jax.trainer import train_and_evaluate
from test_dataset import all_examples, data_config, write_plain_corpus
from test_pretraining_data import CLS, SEP, make_documents
from test_train import _config
from test_train_step import _batch, _config as _step_config, _steps

pytestmark = pytest.mark.slow  # trains or starts processes: the full suite, not the fast tier

L = 64


def spans(objective, short_seq_prob=0.0, dupe_factor=3, seed=1, max_seq_length=L,
          docs=None):
  window = pd.Window.from_documents(make_documents() if docs is None else docs)
  return window, list(pd.document_spans(window, max_seq_length, short_seq_prob, dupe_factor,
                                        random.Random(seed), objective))


def document_of(window, offset):
  """Index of the window's document that holds token `offset`."""
  return int(np.searchsorted(window.doc_starts, offset, side="right")) - 1


def test_mlm_examples_are_one_segment_cls_tokens_sep_from_one_document():
  docs = make_documents()
  examples = list(pd.create_examples(docs, L, 0.1, 2, 1, CLS, SEP, objective="mlm"))
  assert examples
  for ex in examples:
    n = int(ex["input_mask"].sum())
    ids = ex["input_ids"]
    assert ids[0] == CLS and ids[n - 1] == SEP and (ids[n:] == 0).all()
    assert SEP not in ids[1:n - 1].tolist()
    assert (ex["segment_ids"] == 0).all() and int(ex["next_sentence_label"]) == 0
    # make_documents numbers tokens consecutively through each document.
    tokens = ids[1:n - 1]
    assert len({t // 1000 for t in tokens.tolist()}) == 1
    assert (np.diff(tokens) == 1).all()


def test_mlm_examples_take_whole_sentences_until_the_next_one_would_not_fit():
  window, got = spans("mlm", dupe_factor=1)
  ends = {document_of(window, s): [] for s in window.doc_starts}
  for a_start, a_len, _, b_len, _ in got:
    assert b_len == pd.NO_SEGMENT_B and 0 < a_len <= L - 2
    d = document_of(window, a_start)
    ends[d].append((a_start - window.doc_starts[d], a_len))
  for d, chunks in ends.items():
    lengths = window.sentence_lengths[d]
    cum = np.cumsum([0] + lengths)
    # Each pass tiles the document: chunk after chunk, no token lost or repeated.
    offsets = [0] + [o + n for o, n in chunks[:-1]]
    assert [o for o, _ in chunks] == offsets and sum(n for _, n in chunks) == cum[-1]
    for offset, n in chunks[:-1]:  # all but the document's tail are full up to a sentence
      next_sentence = int(np.searchsorted(cum, offset + n))
      assert n + lengths[next_sentence] > L - 2


def test_mlm_plus_sop_halves_come_from_one_document_in_order_or_swapped_half_each():
  window, got = spans("mlm+sop", short_seq_prob=0.1, dupe_factor=30)
  labels = []
  for a_start, a_len, b_start, b_len, label in got:
    assert a_len > 0 and b_len > 0 and a_len + b_len <= L - 3
    ends = (a_start, a_start + a_len - 1, b_start, b_start + b_len - 1)
    assert len({document_of(window, t) for t in ends}) == 1
    if label == pd.IN_ORDER:
      assert b_start >= a_start + a_len  # B follows A (both may be cut at random ends)
    else:
      assert label == pd.SWAPPED and a_start >= b_start + b_len  # the later part comes first
    labels.append(label)
  assert len(labels) > 1000 and 0.45 < np.mean(labels) < 0.55


def test_default_objective_gives_the_same_examples_as_before_objectives():
  h = hashlib.sha256()
  for ex in pd.create_examples(make_documents(), L, 0.1, 3, 1, CLS, SEP):
    for k in pd.FEATURES:
      h.update(np.ascontiguousarray(ex[k]).tobytes())
  # Digest of these examples made by the code of main before config.objective existed.
  assert h.hexdigest() == "3779b81c28c1f685cfdcfa6ec38a2d1438ad8d7b09a9fda28390506c1edfa4a7"


def test_a_cache_prepared_for_one_objective_is_not_reused_for_another(tmp_path):
  corpus = write_plain_corpus(tmp_path / "corpus.txt")
  cache = str(tmp_path / "cache")
  made = {o: dataset.prepare(data_config(corpus, objective=o), [32], cache, seed=0)
          for o in pd.OBJECTIVES}
  assert len({p.directory for p in made.values()}) == 3
  mlm = all_examples(made["mlm"].train[32])
  assert mlm and all((ex["segment_ids"] == 0).all() for ex in mlm)
  sop_labels = [int(ex["next_sentence_label"]) for ex in all_examples(made["mlm+sop"].train[32])]
  assert 0 < np.mean(sop_labels) < 1
  # The default's key holds no objective, so data prepared before objectives existed is reused.
  with open(os.path.join(made["mlm+nsp"].directory, dataset.SETTINGS_FILE)) as f:
    assert "objective" not in json.load(f)


@pytest.mark.parametrize("objective, task", [("mlm", None), ("mlm+sop", "sop")])
def test_training_runs_and_logs_only_its_objectives_metrics(tmp_path, objective, task):
  c = _config(steps=4)
  c.objective = objective
  ev = train_and_evaluate(c, str(tmp_path))
  with open(tmp_path / "metrics.jsonl") as f:
    keys = set().union(*(json.loads(line) for line in f))
  assert not any(k.startswith("nsp_") for k in keys | set(ev))
  assert np.isfinite(ev["mlm_loss"])
  if task:
    assert f"{task}_accuracy" in ev and f"{task}_loss" in keys
  else:
    assert not any(k.startswith("sop_") for k in keys) and ev["loss"] == ev["mlm_loss"]


def test_mlm_gives_the_two_way_head_and_pooler_no_gradient():
  c = _step_config(weight_decay=0.0)
  c.objective = "mlm"
  t = _steps(c)
  params, opt = t.init_state()
  before = jax.device_get(params)
  params, _, m = t.train_step_fn(dataclasses.replace(t.phases[0], max_predictions=5))(params, opt, jnp.int32(0), _batch())
  after = jax.device_get(params)
  assert float(m["loss"]) == float(m["mlm_loss"]) / float(m["mlm_count"])
  for head in (("nsp",), ("bert", "pooler")):
    old, new = before, after
    for k in head:
      old, new = old[k], new[k]
    jax.tree.map(np.testing.assert_array_equal, old, new)
  assert not np.array_equal(before["bert"]["embeddings"]["word_embeddings"]["embedding"],
                            after["bert"]["embeddings"]["word_embeddings"]["embedding"])


def test_a_bad_objective_is_one_line_naming_the_field():
  c = _config()
  c.objective = "nsp"
  with pytest.raises(ConfigError) as e:
    settings.from_config(c)
  assert "\n" not in str(e.value) and "--config.objective='nsp'" in str(e.value)
