"""The fine-tuning model: a checkpoint's encoder and pooler plus a new head.

Shape legend: B batch, L padded length, C classes (1 for regression).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

# The pre-training heads' building blocks, so the new head is made exactly as
# the NSP head is (same initialiser, float32 output, the mixed-precision dot).
from bert_jax.model.bert import Dropout, dense_kw, normal_init, zeros_init
from bert_jax.model.family import encoder_model
from bert_jax.model.config import BertConfig


class SequenceClassifier(nn.Module):
  """BertModel + dropout + Dense(num_classes) on the pooled output (HF's
  BertForSequenceClassification); params {"bert": ..., "classifier": ...}."""
  config: BertConfig
  num_classes: int
  head_dropout: float = 0.1

  @nn.compact
  def __call__(self, ids_BxL, segments_BxL, mask_BxL, deterministic: bool = True):
    c = self.config
    pooled_BxD = encoder_model(c, name="bert")(ids_BxL, segments_BxL, mask_BxL,
                                           deterministic).pooled_BxD
    pooled_BxD = Dropout(self.head_dropout, c.dropout_rng)(pooled_BxD, deterministic=deterministic)
    return nn.Dense(self.num_classes, **dense_kw(c, dtype=jnp.float32),
                    kernel_init=normal_init(c, ("embed", None)), bias_init=zeros_init((None,)),
                    name="classifier")(pooled_BxD.astype(jnp.float32))


def init_head(config: BertConfig, num_classes: int, key: jax.Array) -> dict:
  """A fresh classifier head, initialised as model.py initialises the NSP head."""
  kernel = nn.initializers.truncated_normal(config.initializer_range)(
      key, (config.hidden_size, num_classes), jnp.float32)
  return {"kernel": np.asarray(kernel), "bias": np.zeros((num_classes,), np.float32)}
