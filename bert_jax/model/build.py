"""A family's Flax modules and parameters, built from its record (model/family.py).

Every family takes the same call and gives the same outputs (BertOutput,
PreTrainingOutput), and keeps the encoder at params["bert"], so the train step,
features, probes and fine-tuning need to know nothing more than this module.
"""

import dataclasses
import functools
import importlib
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.model import family
from bert_jax.settings.model import ModelConfig


def resolve(ref: str) -> Any:
  """The object a record names as 'module:name'."""
  module, name = ref.split(":")
  return getattr(importlib.import_module(module), name)


def pretraining_model(config: ModelConfig) -> nn.Module:
  """The encoder with its pre-training heads."""
  return resolve(family.of(config).pretraining)(config)


def encoder_model(config: ModelConfig, **kwargs) -> nn.Module:
  """The encoder alone (a pre-training tree's params["bert"])."""
  return resolve(family.of(config).encoder)(config, **kwargs)


def prediction_head(config: ModelConfig) -> Callable:
  """The family's prediction head, `head(config, pooled_BxD)`, applied inside a compact
  module between pooling and a fine-tuning classifier; None for a family without one
  (BERT's pooler is inside its encoder)."""
  ref = family.of(config).prediction_head
  return resolve(ref) if ref else None


def _boxed_params(config: ModelConfig, key: jax.Array) -> Any:
  ids = jnp.zeros((1, 8), jnp.int32)
  # The parameters are the same whatever attention core runs; 'splash' needs rows of 128.
  config = dataclasses.replace(config, attention_kernel="einsum")
  variables = pretraining_model(config).init(
      {"params": key, "dropout": key}, ids, ids, ids, jnp.zeros((1, 1), jnp.int32))
  return variables["params"]


def abstract_params(config: ModelConfig) -> Any:
  """The parameter tree's shapes, dtypes and logical axis names, allocating nothing.

  Leaves are `nn.Partitioned` boxes of `jax.ShapeDtypeStruct`: give them to
  `sharding.tree_shardings` for shardings, or `nn.meta.unbox` them for shapes.
  """
  return jax.eval_shape(functools.partial(_boxed_params, config), jax.random.key(0))


def init_params(config: ModelConfig, key: jax.Array) -> Any:
  """Freshly initialised parameters (plain arrays), as each family's reference does."""
  return nn.meta.unbox(_boxed_params(config, key))
