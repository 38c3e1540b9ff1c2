"""The model families as registered records: every family question is asked of one `Family`.

A `Family` names its pre-training and encoder modules, its FLOPs formula, its
HuggingFace mapping, its heads, the config checks only it needs, and its traits
(rotary positions, segment embeddings, the objectives it trains). The train step,
features, probes, fine-tuning, conversion, the planner and the settings ask the record
(`family.of(config)`); nothing else compares a family's name. Plain data: importing it
loads no JAX or Flax (the settings check configs with it), so the Flax modules are named
as `module:Class` and built by model/build.py, and the HF mapping as `module:NAME`,
resolved by io/hf_families.py.

Adding a family is its model module, its HF mapping and one record here
(docs/ARCHITECTURE.md, "Adding a family").
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Optional

from bert_jax.errors import ConfigError
from bert_jax.model import flops

# A settings.model.ModelConfig: the settings import this registry to check one, so it is
# not imported back.
ModelConfig = Any


@dataclasses.dataclass(frozen=True)
class Family:
  """One model family: what builds it, converts it and counts its FLOPs, and its traits."""
  name: str  # config.model.family
  pretraining: str  # 'module:Class' of the encoder with its pre-training heads
  encoder: str  # 'module:Class' of the encoder alone (a pre-training tree's params["bert"])
  flops: Callable[..., float]  # (config, kind, batch, seq_len, predictions) -> FLOPs
  hf: str  # 'module:NAME' of its HuggingFace mapping (io/hf_families.py)
  hf_pretraining: str  # transformers' class whose tree our pre-training params mirror
  rope: bool  # rotary positions: phases may set RoPE bases (train.phase_rope_thetas)
  segments: bool  # segment embeddings: sentence pairs need type_vocab_size >= 2
  objectives: tuple[str, ...]  # the pre-training objectives its heads train
  # Top-level pre-training params a fine-tuning classifier keeps beside "bert": a
  # prediction head applied between pooling and the classifier (`prediction_head`).
  head_params: tuple[str, ...] = ()
  prediction_head: Optional[str] = None  # 'module:function' of that head
  extend_vocab: bool = False  # a source of this family can grow its vocabulary
  check: Optional[Callable[[ModelConfig], None]] = None  # config checks of its own fields


def _check_modernbert(config: ModelConfig) -> None:
  for name in ("local_attention", "global_attn_every_n_layers"):
    value = getattr(config, name)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
      raise ConfigError(f"config.model.{name}={value!r}: expected a positive integer")
  for name in ("global_rope_theta", "local_rope_theta"):
    value = getattr(config, name)
    # inf too: the checkpoint meta and an export's config.json would hold `Infinity`,
    # which is not JSON.
    if (not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0
        or not math.isfinite(value)):
      raise ConfigError(f"config.model.{name}={value!r}: expected a positive finite number")
  if (config.hidden_size // max(config.num_heads, 1)) % 2:
    raise ConfigError(f"config.model.family='modernbert' rotates head dimensions in pairs, "
                      f"but hidden_size/num_heads = {config.hidden_size}/{config.num_heads} "
                      "is odd; expected an even head size")


BERT = Family(
    name="bert",
    pretraining="bert_jax.model.bert:BertForPreTraining",
    encoder="bert_jax.model.bert:BertModel",
    flops=flops.bert_flops,
    hf="bert_jax.io.hf_families:BERT",
    hf_pretraining="BertForPreTraining",
    rope=False, segments=True, objectives=("mlm+nsp", "mlm", "mlm+sop"),
    extend_vocab=True)

MODERNBERT = Family(
    name="modernbert",
    pretraining="bert_jax.model.modernbert:ModernBertForPreTraining",
    encoder="bert_jax.model.modernbert:ModernBertModel",
    flops=flops.modernbert_flops,
    hf="bert_jax.io.hf_families:MODERNBERT",
    hf_pretraining="ModernBertForPreTraining",
    rope=True, segments=False, objectives=("mlm",),
    head_params=("head_dense", "head_norm"),
    prediction_head="bert_jax.model.modernbert:prediction_head",
    check=_check_modernbert)

FAMILIES: dict[str, Family] = {f.name: f for f in (BERT, MODERNBERT)}


def named(name: str) -> Family:
  """The family called `name`; one ConfigError line naming the choices if none is."""
  if name not in FAMILIES:
    raise ConfigError(f"config.model.family={name!r}: expected one of {', '.join(FAMILIES)}")
  return FAMILIES[name]


def of(config: ModelConfig) -> Family:
  """The family of a model config."""
  return named(config.family)
