"""The fine-tuning model: a checkpoint's encoder and pooler plus a new head.

Shape legend: B batch, L padded length, C classes (1 for regression).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

# The pre-training heads' building blocks, so the new head is made exactly as
# the NSP head is (same initialiser, float32 output, the mixed-precision dot).
from bert_jax.model.bert import Dropout, dense_kw, normal_init, zeros_init
from bert_jax.model import build, family
from bert_jax.model.build import encoder_model
from bert_jax.settings.model import ModelConfig


class SequenceClassifier(nn.Module):
  """BertModel + dropout + Dense(num_classes) on the pooled output (HF's
  BertForSequenceClassification); params {"bert": ..., "classifier": ...}. A ModernBERT
  applies its prediction head between its [CLS] vector and the dropout, as transformers'
  ModernBertForSequenceClassification does (params also "head_dense", "head_norm")."""
  config: ModelConfig
  num_classes: int
  head_dropout: float = 0.1

  @nn.compact
  def __call__(self, ids_BxL, segments_BxL, mask_BxL, deterministic: bool = True):
    c = self.config
    pooled_BxD = encoder_model(c, name="bert")(ids_BxL, segments_BxL, mask_BxL,
                                           deterministic).pooled_BxD
    head = build.prediction_head(c)
    if head is not None:
      pooled_BxD = head(c, pooled_BxD)
    pooled_BxD = Dropout(self.head_dropout, c.dropout_rng)(pooled_BxD, deterministic=deterministic)
    return nn.Dense(self.num_classes, **dense_kw(c, dtype=jnp.float32),
                    kernel_init=normal_init(c, ("embed", None)), bias_init=zeros_init((None,)),
                    name="classifier")(pooled_BxD.astype(jnp.float32))


def init_head(config: ModelConfig, num_classes: int, key: jax.Array) -> dict:
  """A fresh classifier head, initialised as model.py initialises the NSP head."""
  kernel = nn.initializers.truncated_normal(config.initializer_range)(
      key, (config.hidden_size, num_classes), jnp.float32)
  return {"kernel": np.asarray(kernel), "bias": np.zeros((num_classes,), np.float32)}


def with_head(params: Any, config: ModelConfig, model: SequenceClassifier) -> dict:
  """{"bert": encoder, and each of the family's head params (its record's `head_params`)}: taken
  from `params` (an encoder tree, or one with "bert" and the head) where it has them, else
  freshly initialised (a checkpoint without its MLM head), as transformers does."""
  tree = dict(params) if isinstance(params, Mapping) and "bert" in params else {"bert": params}
  missing = [k for k in family.of(config).head_params if k not in tree]
  if missing:
    ids = jnp.zeros((1, 8), jnp.int32)
    fresh = model.init({"params": jax.random.key(0)}, ids, ids, ids)["params"]
    tree.update({k: jax.device_get(nn.meta.unbox(fresh[k])) for k in missing})
  return tree
