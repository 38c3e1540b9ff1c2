"""Which encoder a config builds: BERT (model/bert.py) or ModernBERT (model/modernbert.py), by `config.model.family`.

Both families take the same call and give the same outputs (BertOutput,
PreTrainingOutput), and keep the encoder at params["bert"], so the train step,
features, probes and fine-tuning need to know nothing more than this module.
"""

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.model.bert import BertForPreTraining, BertModel
from bert_jax.model.config import BertConfig
from bert_jax.model import modernbert
from bert_jax.model.modernbert import ModernBertForPreTraining, ModernBertModel


def pretraining_model(config: BertConfig) -> nn.Module:
  """The encoder with its pre-training heads."""
  if config.family == "modernbert":
    return ModernBertForPreTraining(config)
  return BertForPreTraining(config)


def encoder_model(config: BertConfig, **kwargs) -> nn.Module:
  """The encoder alone (a pre-training tree's params["bert"])."""
  if config.family == "modernbert":
    return ModernBertModel(config, **kwargs)
  return BertModel(config, **kwargs)


def has_prediction_head(config: BertConfig) -> bool:
  """Whether a fine-tuning classifier applies the family's pre-trained prediction head
  between pooling and the classifier (ModernBERT, as transformers does; BERT's pooler
  is inside its encoder)."""
  return config.family == "modernbert"


def head_params(config: BertConfig) -> tuple:
  """The top-level pre-training params a fine-tuning classifier keeps beside "bert"."""
  return modernbert.HEAD_PARAMS if has_prediction_head(config) else ()


def prediction_head(config: BertConfig, x_BxD):
  """The family's prediction head on pooled vectors, inside a compact module."""
  return modernbert.prediction_head(config, x_BxD)


def _boxed_params(config: BertConfig, key: jax.Array) -> Any:
  ids = jnp.zeros((1, 8), jnp.int32)
  # The parameters are the same whatever attention core runs; 'splash' needs rows of 128.
  config = dataclasses.replace(config, attention_kernel="einsum")
  variables = pretraining_model(config).init(
      {"params": key, "dropout": key}, ids, ids, ids, jnp.zeros((1, 1), jnp.int32))
  return variables["params"]


def abstract_params(config: BertConfig) -> Any:
  """The parameter tree's shapes, dtypes and logical axis names, allocating nothing.

  Leaves are `nn.Partitioned` boxes of `jax.ShapeDtypeStruct`: give them to
  `sharding.tree_shardings` for shardings, or `nn.meta.unbox` them for shapes.
  """
  return jax.eval_shape(functools.partial(_boxed_params, config), jax.random.key(0))


def init_params(config: BertConfig, key: jax.Array) -> Any:
  """Freshly initialised parameters (plain arrays), as each family's reference does."""
  return nn.meta.unbox(_boxed_params(config, key))
