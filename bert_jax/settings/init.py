"""`config.init_from` and `config.data.extend_vocab`: a run continued from another
model (bert_jax.train.init_from reads the source), and which of the config's fields
the source owns.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Collection

import ml_collections

from bert_jax import default_config
from bert_jax.errors import ConfigError
from bert_jax.settings.checks import fail, is_int

# The model's shape and numerics, which a run with --config.init_from takes from its source.
SOURCE_MODEL_FIELDS = ("family", "num_layers", "hidden_size", "num_heads", "intermediate_size",
                       "max_position_embeddings", "type_vocab_size", "gelu_approximate",
                       "layer_norm_eps", "local_attention", "global_attn_every_n_layers",
                       "attention_bias", "mlp_bias", "norm_bias", "decoder_bias",
                       "classifier_bias")


@dataclasses.dataclass(frozen=True)
class InitSettings:
  """`config.init_from` and `config.data.extend_vocab` (bert_jax.train.init_from reads the source).

  `overrides`: the source-owned fields (`model.<SOURCE_MODEL_FIELDS>`, `data.lowercase`)
  whose config value differs from the shipped default (default_config.py), i.e. that a
  config file set, and those a --config flag set whatever their value (with the
  vocabulary's `SOURCE_DATA_FIELDS`); each must then equal the source's value.
  """
  path: str = ""
  extend_vocab: int = 0
  overrides: tuple = ()  # ((field, value), ...)


# The vocabulary's settings, which the source decides too: refused when a flag sets them
# to another value, said when a config file does (bert_jax.train.init_from).
SOURCE_DATA_FIELDS = ("tokenizer", "vocab_size")


def init_settings(c: ml_collections.ConfigDict, data: dict,
                  explicit: Collection[str] = ()) -> InitSettings:
  path = c.get("init_from", "")
  extend = data.pop("extend_vocab", 0)
  if not isinstance(path, str):
    raise fail("init_from", path, "a path (a HuggingFace or TF BERT directory, a bert_jax."
                "convert checkpoint or a bert-jax workdir), or '' to start from scratch")
  if not is_int(extend) or extend < 0:
    raise fail("data.extend_vocab", extend, "an integer >= 0 (0 = off)")
  if extend and not path:
    raise fail("data.extend_vocab", extend, "0 without --config.init_from (a trained "
                "vocabulary has no source vocabulary to extend)")
  if path and data.get("vocab_file"):
    raise ConfigError(f"--config.data.vocab_file={data['vocab_file']!r} with --config.init_from="
                      f"{path!r}: expected only one of them (the source's vocab.txt is the "
                      "vocabulary of a continued run)")
  shipped = default_config.get_config()
  overrides = [(f"model.{k}", c.model[k]) for k in SOURCE_MODEL_FIELDS
               if k in c.model and (c.model[k] != shipped.model[k] or f"model.{k}" in explicit)]
  if data.get("lowercase", True) != shipped.data.lowercase or "data.lowercase" in explicit:
    overrides.append(("data.lowercase", data["lowercase"]))
  overrides += [(f"data.{k}", data[k]) for k in SOURCE_DATA_FIELDS
                if f"data.{k}" in explicit and k in data]
  return InitSettings(os.path.expanduser(path) if path else "", extend,
                      tuple(overrides) if path else ())
