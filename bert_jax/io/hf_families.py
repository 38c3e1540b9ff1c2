"""Each family's HuggingFace mapping behind one interface, found from the family's record.

A family's record (model/family.py) names its mapping here (`hf='...:BERT'`); import,
export and `init_from` ask `of(config)` or `for_hf_config(config.json)` and call the
same four methods for every family. The name and shape tables themselves are
io/hf_weights.py (BERT) and io/hf_modernbert.py (ModernBERT).
"""

from __future__ import annotations

import importlib
from typing import Mapping, Optional

import numpy as np

from bert_jax.data.tokenizer import SpecialIds
from bert_jax.io import hf_modernbert, hf_weights, source_check
from bert_jax.io.hf_weights import ENCODER, MLM, ImportReport
from bert_jax.model import family
from bert_jax.settings.model import ModelConfig


class _Bert:
  """transformers' BertForPreTraining / BertModel (and google-research/bert's names)."""
  model_type = "bert"
  import_pad_multiple = 1

  def config_from_hf(self, hf: Mapping, source: str) -> ModelConfig:
    return hf_weights.bert_config_from_hf(hf, source)

  def import_state(self, state: Mapping, config: ModelConfig, *, source: str, heads: bool = True,
                   seed: int = 0) -> tuple[dict, ImportReport]:
    """Our params of a HF state dict, the heads it lacks initialised from `seed`."""
    return hf_weights.hf_state_to_params(state, config, source=source, heads=heads, seed=seed)

  def export_state(self, params: Mapping, config: ModelConfig) -> dict:
    return hf_weights.params_to_hf_state(params, config)

  def check_source(self, path: str, kind: str, config: ModelConfig, read_state) -> None:
    """Every tensor of a source is in place, before any work: from names and shapes."""
    del read_state  # the names and shapes say it without reading the data
    source_check.check_weights(path, kind, config)

  def hf_config(self, config: ModelConfig, special: SpecialIds,
                classifier: Optional[Mapping] = None) -> dict:
    del special  # BERT's config.json names no special ids
    return hf_weights.hf_config_from_bert(config, classifier)


class _ModernBert:
  """transformers' ModernBertForMaskedLM / ModernBertModel."""
  model_type = "modernbert"

  # An imported checkpoint's vocabulary rows are padded to this multiple (BERT's: as
  # its source has them; ModernBERT's to 128, as transformers' own are).
  import_pad_multiple = 128

  def config_from_hf(self, hf: Mapping, source: str) -> ModelConfig:
    return hf_modernbert.config_from_hf(hf, source)

  def import_state(self, state: Mapping, config: ModelConfig, *, source: str, heads: bool = True,
                   seed: int = 0) -> tuple[dict, ImportReport]:
    params, missing, unused = hf_modernbert.hf_state_to_params(
        state, config, hf_modernbert.abstract_params(config), source=source, heads=heads)
    params = hf_modernbert.fill_missing(params, missing, config, seed)
    return params, ImportReport(groups={ENCODER: "imported",
                                        MLM: "initialised" if missing else "imported"},
                                ignored=unused)

  def check_source(self, path: str, kind: str, config: ModelConfig, read_state) -> None:
    """Every tensor of a source is in place, before any work: read whole (its table
    checks every name, and the tied decoder's values)."""
    del kind
    self.import_state(read_state(), config, source=path)

  def export_state(self, params: Mapping, config: ModelConfig) -> dict:
    state = hf_modernbert.params_to_hf_state(params, config)
    state.pop("decoder.weight", None)  # tied: transformers fills it from the token table
    return {k: np.ascontiguousarray(v) for k, v in state.items()}

  def hf_config(self, config: ModelConfig, special: SpecialIds,
                classifier: Optional[Mapping] = None) -> dict:
    return hf_modernbert.hf_config(config, special, classifier)


BERT = _Bert()
MODERNBERT = _ModernBert()


def of_family(fam: family.Family):
  """The HF mapping a family's record names (`hf`)."""
  module, name = fam.hf.split(":")
  return getattr(importlib.import_module(module), name)


def of(config: ModelConfig):
  """The HF mapping of a model config's family."""
  return of_family(family.of(config))


def for_hf_config(hf_config: Mapping):
  """The mapping whose `model_type` a config.json names; BERT's for google's config,
  which has none, and for any other (its reader names what it expected)."""
  model_type = hf_config.get("model_type", "bert")
  mappings = [of_family(f) for f in family.FAMILIES.values()]
  return next((m for m in mappings if m.model_type == model_type), BERT)
