"""Params-only restore of a checkpoint for inference: encoder params, config, tokenizer.

Never the optimizer state. Used by feature extraction, the probe and fine-tuning.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import flax.linen as nn
import jax

from bert_jax.data import bpe
from bert_jax.data.bpe import AnyTokenizer
from bert_jax.parallel import sharding
from bert_jax.errors import CheckpointError, ConfigError
from bert_jax.io import checkpointing
from bert_jax.model import family
from bert_jax.model.build import abstract_params
from bert_jax.settings.model import ModelConfig


def _check_params(params: Any, config: ModelConfig, where: str) -> None:
  """The restored tree must be exactly the tree `config` builds."""
  want = nn.meta.unbox(abstract_params(config))["bert"]  # the encoder of the pre-training tree
  name = lambda path: "/".join(str(getattr(k, "key", k)) for k in path)
  want = {name(p): x.shape for p, x in jax.tree_util.tree_flatten_with_path(want)[0]}
  have = {name(p): x.shape for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}
  for k, shape in want.items():
    if k not in have:
      raise CheckpointError(f"checkpoint {where}: param bert/{k} is missing "
                            "for the model_config in its meta")
    if tuple(have[k]) != tuple(shape):
      raise CheckpointError(f"checkpoint {where}: param bert/{k} has shape {tuple(have[k])}, "
                            f"the model_config in its meta gives {tuple(shape)}")
  extra = sorted(set(have) - set(want))
  if extra:
    raise CheckpointError(f"checkpoint {where}: unexpected param bert/{extra[0]} "
                          "for the model_config in its meta")


def load_checkpoint(path: str, step: Optional[int] = None,
                    expect_config: Optional[Mapping[str, Any]] = None,
                    devices: Optional[Sequence[Any]] = None, *, head: bool = False
                    ) -> tuple[Any, ModelConfig, AnyTokenizer, dict]:
  """(encoder params, config, tokenizer, meta) of a workdir, checkpoints/ or step dir.

  Only the params are restored (never the optimizer state), replicated over
  `devices`; the BertModel tree is returned (a pre-training tree's heads are
  dropped). `expect_config` (e.g. {"num_layers": 12}) must match the
  checkpoint's model config field by field. `head`: the tree is {"bert": encoder, and
  the family's prediction head (its record's `head_params`) where the checkpoint has it}, as a
  fine-tuning classifier starts from.
  """
  if os.path.isfile(path):
    raise CheckpointError(f"checkpoint {path}: is a file; expected a checkpoint directory "
                          "(a workdir, its checkpoints/ folder or a step folder)")
  devices = list(jax.devices() if devices is None else devices)
  replicated = sharding.replicated(sharding.make_mesh(1, devices))
  params, meta = checkpointing.restore_params(path, step, sharding=replicated)
  for key in ("model_config", "vocab", "lowercase"):
    if key not in meta:
      raise CheckpointError(f"checkpoint {path}: its meta has no '{key}'; expected a "
                            "checkpoint written by train.py or bert_jax.io.convert")
  try:
    config = ModelConfig.from_dict(meta["model_config"]).validate()
  except (TypeError, ValueError) as e:
    raise CheckpointError(f"checkpoint {path}: unreadable model_config in meta ({e})") from None
  for key, want in (expect_config or {}).items():
    if key not in meta["model_config"]:
      raise ConfigError(f"expect_config: {key!r} is not a model config field "
                        f"(fields: {', '.join(sorted(meta['model_config']))})")
    if meta["model_config"][key] != want:
      raise CheckpointError(f"checkpoint {path} has model {key}={meta['model_config'][key]!r} "
                            f"but {want!r} was expected")
  kept = {}
  if isinstance(params, Mapping) and "bert" in params:
    kept = {k: params[k] for k in family.of(config).head_params if k in params}
    params = params["bert"]  # a BertForPreTraining tree: heads are not needed
  _check_params(params, config, path)
  if head:
    params = {"bert": params, **kept}
  tokenizer = bpe.from_meta(meta, source=f"checkpoint {path} vocab")
  return params, config, tokenizer, meta
