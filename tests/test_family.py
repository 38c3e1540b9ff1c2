"""Issue 55: a model family is one registered record (model/family.py) that every layer asks.

A family registered in a test, with BERT's modules and its own FLOPs formula and
traits, is accepted by the settings, built, trained a step, counted with its own
formula and exported through the HF mapping its record names; a config's family
traits decide what the settings refuse.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tiny_run
from bert_jax import settings
from bert_jax.data.tokenizer import SpecialIds
from bert_jax.errors import ConfigError
from bert_jax.io import hf_families
from bert_jax.model import build, family
from bert_jax.parallel import sharding
from bert_jax.train.steps import make_steps
from bert_jax.train.throughput import Throughput


@pytest.fixture
def registered(monkeypatch):
  """A family 'bert2': BERT's modules and HF mapping, its own FLOPs formula, no segments."""
  counted = []

  def flops(config, kind, batch, seq_len, predictions=0):
    counted.append((kind, batch, seq_len, predictions))
    return 123.0

  record = dataclasses.replace(family.BERT, name="bert2", flops=flops, segments=False,
                               objectives=("mlm",))
  monkeypatch.setitem(family.FAMILIES, "bert2", record)
  return record, counted


def test_every_record_builds_its_modules_and_names_its_hf_mapping():
  for fam in family.FAMILIES.values():
    config = tiny_run.bert_config(64, family=fam.name).validate()
    params = build.init_params(config, jax.random.key(0))
    assert set(fam.head_params) <= set(params) and "bert" in params
    assert hf_families.of(config).model_type == fam.name
    assert fam.flops(config, "train", 2, 16, 3) > fam.flops(config, "features", 2, 16) > 0


def test_a_registered_family_is_accepted_built_trained_and_counted_by_its_record(registered):
  record, counted = registered
  c = tiny_run.config(**{"model.family": "bert2", "objective": "mlm",
                         "model.type_vocab_size": 1, "train.seq_lens": (32,),
                         "train.max_predictions": (5,), "train.phase_fractions": (1.0,)})
  s = settings.from_config(c)  # type_vocab_size 1: no segments in this family
  mesh = sharding.make_mesh(1, devices=jax.devices()[:1])
  steps = make_steps(s, 100, SpecialIds(0, 1, 2, 3, 4), mesh=mesh)
  assert type(steps.model).__name__ == "BertForPreTraining"
  params, opt = steps.init_state()
  ids = np.random.RandomState(0).randint(5, 100, (16, 32)).astype(np.int32)
  batch = sharding.global_batch(tiny_batch(ids), mesh)
  _, _, m = steps.train_step_fn(s.train.phases[0])(params, opt, jnp.int32(0), batch)
  assert np.isfinite(float(m["loss"]))
  t = Throughput(s, steps.bert_config, "cpu", 1)
  assert t.flops_per_step(s.train.phases[0]) == 123.0 and counted == [("train", 16, 32, 5)]


def tiny_batch(ids):
  from bert_jax.data.pretraining_data import Batch  # pylint: disable=import-outside-toplevel
  ids[:, 0] = 2
  return Batch.from_features({"input_ids": ids, "segment_ids": np.zeros_like(ids),
                              "input_mask": np.ones_like(ids),
                              "next_sentence_label": np.zeros(len(ids), np.int32)})


def test_the_records_traits_decide_what_the_settings_refuse(registered):
  with pytest.raises(ConfigError, match="objective.*'bert2'"):
    settings.from_config(tiny_run.config(**{"model.family": "bert2", "objective": "mlm+nsp"}))
  with pytest.raises(ConfigError, match="phase_rope_thetas.*learned positions"):
    settings.from_config(tiny_run.config(**{"model.family": "bert2", "objective": "mlm",
                                            "train.phase_rope_thetas": (1e4, 2e4)}))
  with pytest.raises(ConfigError, match="family='gpt'.*bert, modernbert, bert2"):
    settings.from_config(tiny_run.config(**{"model.family": "gpt"}))
