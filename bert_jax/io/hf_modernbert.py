"""The pure mapping between transformers' ModernBERT tensors (`ModernBertForMaskedLM`, `ModernBertModel`) and our ModernBERT parameter tree.

HF `nn.Linear` weights are [out, in]; ours are [in, out] with the fused QKV split into
(3, heads, head size) and Wi into (2, intermediate) on the output side, in HF's own
order (`view(..., 3, H, K)`, `chunk(2)`), so a reshape and a transpose map them. The
decoder is tied to the token embeddings (HF's `decoder.weight` is the same tensor) and
keeps its own bias. Also config.json <-> ModelConfig. No files here: bert_jax.io.convert.

Shape legend: V vocab (Vp padded), D hidden, H heads, K head size, F intermediate.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

import numpy as np

from bert_jax.data.tokenizer import SpecialIds
from bert_jax.errors import CheckpointError
from bert_jax.settings.model import ModelConfig
from bert_jax.io.hf_weights import classifier_fields

ARCHITECTURES = ("ModernBertForMaskedLM", "ModernBertModel")
# hidden_activation / classifier_activation -> gelu_approximate.
_ACTIVATIONS = {"gelu": False, "gelu_new": True, "gelu_pytorch_tanh": True}


def is_modernbert(hf_config: Mapping) -> bool:
  return hf_config.get("model_type") == "modernbert"


def config_from_hf(hf: Mapping, source: str) -> ModelConfig:
  """A ModernBERT config.json as a ModelConfig (family 'modernbert')."""
  acts = {hf.get("hidden_activation", "gelu"), hf.get("classifier_activation", "gelu")}
  if not acts <= set(_ACTIVATIONS) or len({_ACTIVATIONS[a] for a in acts}) != 1:
    raise CheckpointError(f"{source}: activations {sorted(acts)} are not supported; expected "
                          "gelu (or its tanh form) for both hidden_activation and "
                          "classifier_activation")
  for field in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size"):
    if not isinstance(hf.get(field), int):
      raise CheckpointError(f"{source}: config.json has no integer {field!r}; expected a "
                            "ModernBertConfig")
  global_theta, local_theta = _rope_thetas(hf, source)
  return ModelConfig(
      vocab_size=hf["vocab_size"], family="modernbert", hidden_size=hf["hidden_size"],
      num_layers=hf["num_hidden_layers"], num_heads=hf["num_attention_heads"],
      intermediate_size=hf["intermediate_size"],
      max_position_embeddings=hf.get("max_position_embeddings", 8192),
      dropout_rate=float(hf.get("embedding_dropout", 0.0)),
      attention_dropout_rate=float(hf.get("attention_dropout", 0.0)),
      layer_norm_eps=float(hf.get("norm_eps", 1e-5)),
      initializer_range=float(hf.get("initializer_range", 0.02)),
      gelu_approximate=_ACTIVATIONS[hf.get("hidden_activation", "gelu")],
      global_rope_theta=global_theta, local_rope_theta=local_theta,
      local_attention=int(hf.get("local_attention", 128)),
      global_attn_every_n_layers=_global_every(hf, source),
      attention_bias=bool(hf.get("attention_bias", False)),
      mlp_bias=bool(hf.get("mlp_bias", False)), norm_bias=bool(hf.get("norm_bias", False)),
      decoder_bias=bool(hf.get("decoder_bias", True)),
      classifier_bias=bool(hf.get("classifier_bias", False)))


_LAYER_TYPES = ("full_attention", "sliding_attention")


def _rope_thetas(hf: Mapping, source: str) -> tuple[float, float]:
  """(global, local) RoPE bases: transformers 5's `rope_parameters` per layer type, or
  4.x's `global_rope_theta` / `local_rope_theta` (local defaults to global there)."""
  rope = hf.get("rope_parameters") or {}
  theirs = {}
  for kind in _LAYER_TYPES:
    params = rope.get(kind) or {}
    if params.get("rope_type", "default") != "default":
      raise CheckpointError(f"{source}: rope_parameters.{kind}.rope_type is "
                            f"{params['rope_type']!r}; expected 'default' (bert-jax's RoPE)")
    theirs[kind] = params.get("rope_theta")
  glob = theirs["full_attention"] or hf.get("global_rope_theta") or 160000.0
  local = (theirs["sliding_attention"] or hf.get("local_rope_theta")
           or hf.get("global_rope_theta") or glob)
  return float(glob), float(local)


def _global_every(hf: Mapping, source: str) -> int:
  """`global_attn_every_n_layers`: 4.x's field, or the period of transformers 5's
  `layer_types` (layer i global exactly when i % n == 0), which 5.x follows where both
  are given; another pattern is refused."""
  types = hf.get("layer_types")
  if not types:
    return int(hf.get("global_attn_every_n_layers", 3))
  full = [i for i, t in enumerate(types) if t == "full_attention"]
  # One global layer (the first): any period from the layer count up says the same.
  n = full[1] if len(full) > 1 else max(len(types), int(hf.get("global_attn_every_n_layers",
                                                                len(types))))
  if list(types) != ["sliding_attention" if i % n else "full_attention"
                     for i in range(len(types))]:
    raise CheckpointError(f"{source}: layer_types {list(types)} are not 'every n-th layer "
                          "global, from the first'; expected that pattern (bert-jax's "
                          "global_attn_every_n_layers)")
  return n


def hf_config(config: ModelConfig, special: SpecialIds,
              classifier: Optional[Mapping] = None) -> dict:
  """The config.json of a transformers ModernBertForMaskedLM with `config`'s settings;
  `special`: the vocabulary's special ids (bos = cls, eos = sep as ModernBERT's). With
  `classifier` (a fine-tuned checkpoint's meta["classifier"]): a
  ModernBertForSequenceClassification's, pooling [CLS] as bert-jax's classifier does."""
  act = "gelu_pytorch_tanh" if config.gelu_approximate else "gelu"
  head = classifier_fields(classifier, "ModernBertForSequenceClassification")
  if head:
    head["classifier_dropout"] = head["classifier_dropout"] or 0.0
  return {
      "architectures": ["ModernBertForMaskedLM"], "model_type": "modernbert",
      "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
      "num_hidden_layers": config.num_layers, "num_attention_heads": config.num_heads,
      "intermediate_size": config.intermediate_size,
      "max_position_embeddings": config.max_position_embeddings,
      "hidden_activation": act, "classifier_activation": act,
      "initializer_range": config.initializer_range, "initializer_cutoff_factor": 2.0,
      "norm_eps": config.layer_norm_eps, "norm_bias": config.norm_bias,
      # Both spellings: 4.x reads these two fields, 5.x its rope_parameters and
      # layer_types (and takes them over the fields when both are there).
      "global_rope_theta": config.global_rope_theta,
      "local_rope_theta": config.local_rope_theta, "local_attention": config.local_attention,
      "global_attn_every_n_layers": config.global_attn_every_n_layers,
      "rope_parameters": {
          "full_attention": {"rope_type": "default", "rope_theta": config.global_rope_theta},
          "sliding_attention": {"rope_type": "default", "rope_theta": config.local_rope_theta}},
      "layer_types": ["sliding_attention" if i % config.global_attn_every_n_layers
                      else "full_attention" for i in range(config.num_layers)],
      "attention_bias": config.attention_bias, "attention_dropout":
      config.attention_dropout_rate, "embedding_dropout": config.dropout_rate,
      "mlp_bias": config.mlp_bias, "mlp_dropout": config.dropout_rate,
      "decoder_bias": config.decoder_bias, "classifier_bias": config.classifier_bias,
      "classifier_pooling": "cls", "classifier_dropout": 0.0,
      "pad_token_id": special.pad, "cls_token_id": special.cls,
      "sep_token_id": special.sep, "bos_token_id": special.cls,
      "eos_token_id": special.sep, "mask_token_id": special.mask,
      "tie_word_embeddings": True, "torch_dtype": "float32", **head,
  }


def _norm(prefix: str, path: tuple, c: ModelConfig) -> list[tuple[str, tuple, str]]:
  out = [(f"{prefix}.weight", path + ("norm", "scale"), "vector")]
  if c.norm_bias:
    out.append((f"{prefix}.bias", path + ("norm", "bias"), "vector"))
  return out


def tensor_table(c: ModelConfig) -> list[tuple[str, tuple, str]]:
  """(HF name in ModernBertForMaskedLM, our path, layout) of every tensor."""
  D, H = c.hidden_size, c.num_heads  # noqa: N806
  del D, H
  t = [("model.embeddings.tok_embeddings.weight", ("bert", "tok_embeddings", "embedding"),
        "table")]
  t += _norm("model.embeddings.norm", ("bert", "embeddings_norm"), c)
  for i in range(c.num_layers):
    hf, ours = f"model.layers.{i}", ("bert", f"layer_{i}")
    if i:
      t += _norm(f"{hf}.attn_norm", ours + ("attn_norm",), c)
    t.append((f"{hf}.attn.Wqkv.weight", ours + ("attn", "Wqkv", "kernel"), "in_split"))
    t.append((f"{hf}.attn.Wo.weight", ours + ("attn", "Wo", "kernel"), "heads_in"))
    if c.attention_bias:
      t.append((f"{hf}.attn.Wqkv.bias", ours + ("attn", "Wqkv", "bias"), "flat"))
      t.append((f"{hf}.attn.Wo.bias", ours + ("attn", "Wo", "bias"), "vector"))
    t += _norm(f"{hf}.mlp_norm", ours + ("mlp_norm",), c)
    t.append((f"{hf}.mlp.Wi.weight", ours + ("mlp", "Wi", "kernel"), "in_split"))
    t.append((f"{hf}.mlp.Wo.weight", ours + ("mlp", "Wo", "kernel"), "dense"))
    if c.mlp_bias:
      t.append((f"{hf}.mlp.Wi.bias", ours + ("mlp", "Wi", "bias"), "flat"))
      t.append((f"{hf}.mlp.Wo.bias", ours + ("mlp", "Wo", "bias"), "vector"))
  t += _norm("model.final_norm", ("bert", "final_norm"), c)
  t.append(("head.dense.weight", ("head_dense", "kernel"), "dense"))
  if c.classifier_bias:
    t.append(("head.dense.bias", ("head_dense", "bias"), "vector"))
  t += _norm("head.norm", ("head_norm",), c)
  if c.decoder_bias:
    t.append(("decoder.bias", ("decoder_bias",), "vocab_vector"))
  return t


def _to_hf(layout: str, a: np.ndarray, c: ModelConfig) -> np.ndarray:
  if layout == "table":
    return a[:c.vocab_size]
  if layout == "vocab_vector":
    return a[:c.vocab_size]
  if layout == "in_split":  # [D, 3, H, K] or [D, 2, F] -> [out, D]
    return a.reshape(a.shape[0], -1).T
  if layout == "heads_in":  # [H, K, D] -> [D, H*K]
    return a.reshape(-1, a.shape[-1]).T
  if layout == "dense":
    return a.T
  if layout == "flat":
    return a.reshape(-1)
  return a


def _hf_shape(layout: str, shape: tuple, c: ModelConfig) -> tuple:
  """The shape transformers stores for one of our tensors of `shape` (`_to_hf`'s)."""
  if layout in ("table", "vocab_vector"):
    return (c.vocab_size,) + tuple(shape[1:])
  if layout == "in_split":
    return (int(np.prod(shape[1:])), shape[0])
  if layout == "heads_in":
    return (shape[-1], int(np.prod(shape[:-1])))
  if layout == "dense":
    return (shape[1], shape[0])
  if layout == "flat":
    return (int(np.prod(shape)),)
  return tuple(shape)


def _to_ours(layout: str, hf: np.ndarray, shape: tuple) -> np.ndarray:
  if layout in ("table", "vocab_vector"):  # padded rows stay zero
    out = np.zeros(shape, np.float32)
    out[:hf.shape[0]] = hf
    return out
  if layout == "in_split":
    return hf.T.reshape(shape)
  if layout == "heads_in":
    return hf.T.reshape(shape)
  if layout == "dense":
    return hf.T.reshape(shape)
  return hf.reshape(shape)


def params_to_hf_state(params: Mapping, config: ModelConfig) -> dict[str, np.ndarray]:
  """Our pre-training params as a ModernBertForMaskedLM state dict (float32; the tied
  decoder weight is the token table, as transformers stores it). A fine-tuned tree
  (bert, head, classifier: bert_jax.eval.classifier) gives what
  `ModernBertForSequenceClassification` holds: no decoder, `classifier.weight/bias`."""
  classifier = "classifier" in params
  out = {}
  for name, path, layout in tensor_table(config):
    if classifier and name.startswith("decoder."):
      continue
    node: Any = params
    try:
      for k in path:
        node = node[k]
    except (KeyError, TypeError):
      raise CheckpointError(f"checkpoint params have no {'/'.join(path)} (expected a "
                            "ModernBERT pre-training or fine-tuned parameter tree)") from None
    out[name] = np.ascontiguousarray(_to_hf(layout, np.asarray(node, np.float32), config))
  if classifier:  # ours: kernel [D, C]; HF's Linear: weight [C, D]
    out["classifier.weight"] = np.ascontiguousarray(
        np.asarray(params["classifier"]["kernel"], np.float32).T)
    out["classifier.bias"] = np.asarray(params["classifier"]["bias"], np.float32)
  else:
    out["decoder.weight"] = out["model.embeddings.tok_embeddings.weight"]
  return out


# A bare ModernBertModel's tensor names (no "model." prefix).
_ENCODER_PREFIXES = ("embeddings.", "layers.", "final_norm.")
_TIED = ("decoder.weight", "model.embeddings.tok_embeddings.weight")


def hf_state_to_params(state: Mapping[str, np.ndarray], config: ModelConfig,
                       abstract: Mapping, *, source: str,
                       heads: bool = True) -> tuple[dict, list[str], list[str]]:
  """A ModernBertForMaskedLM or ModernBertModel state dict as our params; returns
  (params, paths missing in the source: the MLM head of a bare ModernBertModel, or every
  head path with `heads=False`, which the caller initialises; source names not used).

  Every source tensor is mapped or named: another task's tensors (a classifier's) and,
  with `heads=False`, the head's are returned as unused; an unknown encoder tensor, a
  mis-shaped one, or a decoder that is not the token table (transformers'
  `tie_word_embeddings=False`: this family decodes with its token embeddings) is one
  CheckpointError line."""
  canon_of = {k: f"model.{k}" if k.startswith(_ENCODER_PREFIXES) else k for k in state}
  names = {c: k for k, c in canon_of.items()}
  params: dict = {}
  missing, used = [], set()
  for name, path, layout in tensor_table(config):
    node: Any = abstract
    for k in path:
      node = node[k]
    shape = tuple(node.shape)
    if name not in names or (not heads and path[0] != "bert"):
      if path[0] == "bert":
        raise CheckpointError(f"{source}: no tensor {name!r}; expected a ModernBertModel or "
                              "ModernBertForMaskedLM state dict of this config")
      missing.append("/".join(path))
      continue
    hf = np.asarray(state[names[name]], np.float32)
    if hf.shape != _hf_shape(layout, shape, config):  # before any reshape: one line
      raise CheckpointError(f"{source}: tensor {name!r} has shape {hf.shape}; the config.json "
                            f"beside it implies {_hf_shape(layout, shape, config)}")
    value = _to_ours(layout, hf, shape)
    used.add(names[name])
    cur = params
    for k in path[:-1]:
      cur = cur.setdefault(k, {})
    cur[path[-1]] = value
  decoder, table = (names.get(n) for n in _TIED)
  if decoder is not None and heads:
    if not (table is not None and np.array_equal(np.asarray(state[decoder]),
                                                 np.asarray(state[table]))):
      raise CheckpointError(
          f"{source}: {decoder!r} differs from the token embeddings (an untied decoder, "
          "tie_word_embeddings=False); bert-jax's ModernBERT decodes with its token table, "
          "so importing it would change the model's predictions; expected a tied decoder "
          "(or --no-heads, which leaves the MLM head out)")
    used.add(decoder)
  unused = sorted(k for k in state if k not in used)
  unknown = [k for k in unused if canon_of[k].startswith("model.")
             or (heads and canon_of[k].startswith(("head.", "decoder.")))]
  if unknown:
    raise CheckpointError(f"{source}: tensors this config has no place for: {unknown[:5]}"
                          f"{' ...' if len(unknown) > 5 else ''}; expected a ModernBERT of "
                          "the config.json beside them")
  return params, missing, unused


def fill_missing(params: dict, missing: list[str], config: ModelConfig, seed: int) -> dict:
  """`params` with the `missing` paths (a bare ModernBertModel's MLM head) freshly
  initialised as the family initialises them."""
  if not missing:
    return params
  import jax  # pylint: disable=import-outside-toplevel
  from bert_jax.model import build  # pylint: disable=import-outside-toplevel
  fresh = jax.device_get(build.init_params(config, jax.random.key(seed)))
  for path in missing:
    keys = path.split("/")
    src, dst = fresh, params
    for k in keys[:-1]:
      src, dst = src[k], dst.setdefault(k, {})
    dst[keys[-1]] = src[keys[-1]]
  return params


def abstract_params(config: ModelConfig) -> dict:
  """Shapes of the family's params for `config`, without allocating them."""
  import flax.linen as nn  # pylint: disable=import-outside-toplevel
  from bert_jax.model import build  # pylint: disable=import-outside-toplevel
  return nn.meta.unbox(build.abstract_params(config))
