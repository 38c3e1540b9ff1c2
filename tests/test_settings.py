"""settings.from_config: the one place a config is read and checked."""

import dataclasses

import pytest

from bert_jax import settings
from bert_jax.model import precision
from bert_jax.errors import ConfigError
from configs import base, large, modernbert_base, modernbert_large, modernbert_tiny, tiny


def _with(**overrides):
  c = tiny.get_config()
  for key, value in overrides.items():
    *parents, name = key.split("__")
    node = c
    for p in parents:
      node = node[p]
    node[name] = value
  return c


@pytest.mark.parametrize("get_config", [tiny.get_config, base.get_config, large.get_config,
                                        modernbert_tiny.get_config, modernbert_base.get_config,
                                        modernbert_large.get_config])
def test_shipped_configs_become_frozen_settings(get_config):
  s = settings.from_config(get_config())
  with pytest.raises(dataclasses.FrozenInstanceError):
    s.train.batch_size = 1  # type: ignore[misc]
  c = get_config()  # a staged recipe's steps follow from its token budgets (test_recipes)
  assert s.train.num_steps == (c.train.num_steps if not c.train.phase_tokens
                               else s.train.phases[-1].end)


@pytest.mark.parametrize("field, value", [
    ("train__batch_size", 0), ("train__grad_accum_steps", 0),
    ("train__max_consecutive_nonfinite", 0), ("train__num_steps", 0),
    ("train__warmup_steps", -1), ("train__learning_rate", 0.0),
    ("train__phase_fractions", (0.5, 0.4)), ("train__seq_lens", (4,)),
    ("model__num_layers", 0), ("model__dtype", "float64"), ("masking__mask_prob", 1.0),
    ("data__eval_fraction", 0.0), ("data__dupe_factor", 0), ("data__short_seq_prob", 1.5),
    ("data__format", "csv"), ("data__max_documents", -1), ("data__vocab_file", "/nope/vocab.txt"),
    ("data__num_workers", -1), ("data__streams", 0), ("data__streams", 7),
    ("mesh__model_parallel", 0), ("mesh__param_sharding", "zero3"),
    ("log_every", 0), ("eval_every", 0), ("checkpoint_every", 0), ("keep_checkpoints", 0),
    # Settings that used to train silently wrong or fail late (issue 12, section 5):
    ("train__learning_rate", float("nan")), ("train__learning_rate", float("inf")),
    ("train__b1", 1.0), ("train__b2", -0.1), ("train__max_grad_norm", -1.0),
    ("eval_batches", -1), ("model__type_vocab_size", 1),
])
def test_a_bad_value_is_one_line_naming_the_field(field, value):
  with pytest.raises(ConfigError) as e:
    settings.from_config(_with(**{field: value}))
  message = str(e.value)
  assert "\n" not in message
  leaf = field.split("__")[-1]
  assert leaf in message and "expected" in message


def test_phases_split_the_steps_by_fraction_and_end_at_num_steps():
  c = _with(train__num_steps=1000, train__phase_fractions=(0.9, 0.1), train__seq_lens=(64, 128),
            train__max_predictions=(10, 20), model__max_position_embeddings=128)
  phases = settings.from_config(c).train.phases
  assert [(p.start, p.end, p.seq_len) for p in phases] == [(0, 900, 64), (900, 1000, 128)]


def test_seq_len_above_the_position_table_names_both_fields():
  with pytest.raises(ConfigError, match=r"seq_lens\[0\]=256.*max_position_embeddings=128"):
    settings.from_config(_with(train__seq_lens=(256,)))


def test_model_config_takes_the_vocabulary_size_and_keeps_the_rest():
  s = settings.from_config(tiny.get_config())
  m = s.model_config(777)
  assert m.vocab_size == 777 and m.hidden_size == tiny.get_config().model.hidden_size


def test_auto_dtype_is_resolved_for_this_machine_and_remembered():
  s = settings.from_config(base.get_config())  # base asks for 'auto'
  assert s.requested_dtype == "auto"
  assert s.model.dtype == precision.resolve_dtype("auto") and s.model.dtype != "auto"


def test_an_explicit_dtype_wins_over_auto():
  s = settings.from_config(_with(model__dtype="bfloat16"))
  assert s.model.dtype == "bfloat16" and s.requested_dtype == "bfloat16"


def test_packing_with_the_cudnn_kernel_is_accepted():
  """cuDNN takes packed rows' documents as a mask (tests/test_cudnn.py); it was refused."""
  import tiny_run
  config = tiny_run.config(**{"objective": "mlm", "data.packing": True,
                              "model.attention_kernel": "cudnn", "model.dtype": "bfloat16",
                              "model.attention_dropout_rate": 0.0})
  s = settings.from_config(config)
  assert s.data.packing and s.model.attention_kernel == "cudnn"
