"""Import HuggingFace / google-research BERT checkpoints into bert-jax, and export back.

  python -m bert_jax.convert from-hf HF_DIR OUT_DIR [--no-heads] [--overwrite]
  python -m bert_jax.convert from-tf TF_DIR OUT_DIR [--no-heads] [--overwrite]
  python -m bert_jax.convert to-hf CKPT OUT_HF_DIR [--step N] [--overwrite]

An imported checkpoint is an Orbax params-only checkpoint (`OUT_DIR/checkpoints/0/`)
that `checkpointing.restore_params(OUT_DIR)` reads; its meta holds the model
config, vocabulary, lowercase flag, source and which heads were imported.

Everything goes through one table of tensors (`_spec`): HuggingFace name, our
param path, how the array is laid out. HF `nn.Linear` weights are [out, in]; ours
are [in, out], with attention projections split into heads. TensorFlow names are
first mapped to HF names by the pure function `tf_to_hf`.

Loading never executes code from a file: safetensors by default, a pickled
`pytorch_model.bin` only through `torch.load(..., weights_only=True)`.

Shape legend: V vocab (Vp padded), D hidden, H heads, K head size (D / H),
F intermediate, P max positions, T token types.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import glob
import json
import os
import re
import shutil
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Optional

import numpy as np

from bert_jax.errors import BertJaxError, CheckpointError, ConfigError

# Parameter groups: the encoder must be complete; the others may be initialised.
ENCODER, POOLER, MLM, NSP = "encoder", "pooler", "mlm", "nsp"
HEADS = (MLM, NSP)
_GROUP_NAMES = {POOLER: "pooler", MLM: "MLM head (cls.predictions.*)",
                NSP: "NSP head (cls.seq_relationship.*)"}

# hidden_act -> gelu_approximate. gelu_new / gelu_pytorch_tanh are the tanh form.
_ACTIVATIONS = {"gelu": False, "gelu_new": True, "gelu_pytorch_tanh": True}
# Sizes a config.json must state; everything else has HF's BertConfig default.
_REQUIRED_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers",
                    "num_attention_heads", "intermediate_size")
_HF_DEFAULTS = {"max_position_embeddings": 512, "type_vocab_size": 2, "hidden_act": "gelu",
                "layer_norm_eps": 1e-12, "initializer_range": 0.02,
                "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1}
# Buffers and tied copies that carry no parameter of their own.
_IGNORED_HF = ("bert.embeddings.position_ids", "cls.predictions.decoder.weight",
               "cls.predictions.decoder.bias")
_TF_IGNORED = re.compile(r"(^|/)(adam_m|adam_v|global_step)($|/)")
_TF_TABLES = ("bert/embeddings/word_embeddings", "bert/embeddings/position_embeddings",
              "bert/embeddings/token_type_embeddings")


class ConvertError(CheckpointError):
  """A checkpoint that cannot be imported or exported."""


# ----------------------------------------------------------------------------
# The tensor table


@dataclasses.dataclass(frozen=True)
class _Tensor:
  hf: str  # HuggingFace BertForPreTraining name
  path: tuple  # our param path in BertForPreTraining
  hf_shape: tuple
  transpose: bool  # HF Linear [out, in] <-> ours [in, (heads, head size) or out]
  group: str


def _spec(c: Any) -> list[_Tensor]:
  """Every parameter of BertForPreTraining for config `c` (a BertConfig)."""
  V, D, F = c.vocab_size, c.hidden_size, c.intermediate_size
  out: list[_Tensor] = []

  def add(hf, path, shape, transpose=False, group=ENCODER):
    out.append(_Tensor(hf, tuple(path.split("/")), tuple(shape), transpose, group))

  def layer_norm(hf, path, group=ENCODER):
    add(f"{hf}.weight", f"{path}/norm/scale", (D,), group=group)
    add(f"{hf}.bias", f"{path}/norm/bias", (D,), group=group)

  def linear(hf, path, n_out, n_in, group=ENCODER):
    add(f"{hf}.weight", f"{path}/kernel", (n_out, n_in), True, group)
    add(f"{hf}.bias", f"{path}/bias", (n_out,), group=group)

  e = "bert/embeddings"
  add("bert.embeddings.word_embeddings.weight", f"{e}/word_embeddings/embedding", (V, D))
  add("bert.embeddings.position_embeddings.weight", f"{e}/position_embeddings/embedding",
      (c.max_position_embeddings, D))
  add("bert.embeddings.token_type_embeddings.weight", f"{e}/token_type_embeddings/embedding",
      (c.type_vocab_size, D))
  layer_norm("bert.embeddings.LayerNorm", f"{e}/LayerNorm")
  for i in range(c.num_layers):
    hf, ours = f"bert.encoder.layer.{i}", f"bert/layer_{i}"
    for name in ("query", "key", "value"):
      linear(f"{hf}.attention.self.{name}", f"{ours}/attention/{name}", D, D)
    linear(f"{hf}.attention.output.dense", f"{ours}/attention/output", D, D)
    layer_norm(f"{hf}.attention.output.LayerNorm", f"{ours}/attention_LayerNorm")
    linear(f"{hf}.intermediate.dense", f"{ours}/intermediate", F, D)
    linear(f"{hf}.output.dense", f"{ours}/output", D, F)
    layer_norm(f"{hf}.output.LayerNorm", f"{ours}/output_LayerNorm")
  linear("bert.pooler.dense", "bert/pooler", D, D, POOLER)
  linear("cls.predictions.transform.dense", "mlm_dense", D, D, MLM)
  layer_norm("cls.predictions.transform.LayerNorm", "mlm_LayerNorm", MLM)
  add("cls.predictions.bias", "mlm_bias", (V,), group=MLM)
  linear("cls.seq_relationship", "nsp", 2, D, NSP)
  return out


def _to_ours(t: _Tensor, hf_array: np.ndarray, shape: tuple) -> np.ndarray:
  x = np.asarray(hf_array, np.float32)
  if t.transpose:
    return np.ascontiguousarray(x.T.reshape(shape))
  if x.shape[0] < shape[0]:  # padded vocabulary rows: never looked up or predicted
    x = np.concatenate([x, np.zeros((shape[0] - x.shape[0],) + x.shape[1:], x.dtype)])
  return x.reshape(shape)


def _to_hf(t: _Tensor, ours: np.ndarray) -> np.ndarray:
  x = np.asarray(ours, np.float32)
  if t.transpose:
    return np.ascontiguousarray(x.reshape(t.hf_shape[::-1]).T)
  return np.ascontiguousarray(x[:t.hf_shape[0]].reshape(t.hf_shape))


def _get(tree: Mapping, path: tuple) -> Any:
  for k in path:
    tree = tree[k]
  return tree


def _set(tree: dict, path: tuple, value: Any) -> None:
  for k in path[:-1]:
    tree = tree.setdefault(k, {})
  tree[path[-1]] = value


def _abstract_params(config: Any) -> dict:
  """Shapes of BertForPreTraining's params, without allocating them."""
  import flax.linen as nn
  from bert_jax.model import abstract_params
  return nn.meta.unbox(abstract_params(config))


def _init_missing(config: Any, abstract: Mapping, paths: Sequence[tuple], seed: int) -> dict:
  """Fresh values for `paths`, by model.py's rule: weights from a normal truncated at
  2 stddev (initializer_range), biases 0, LayerNorm scales 1.

  Only the missing leaves are made: initialising the whole model would trace
  and compile its forward pass, which takes seconds even for a tiny config.
  """
  import jax
  import jax.numpy as jnp
  import flax.linen as nn
  weight = nn.initializers.truncated_normal(config.initializer_range)

  def init(key):
    out = {}
    for i, path in enumerate(paths):
      shape = tuple(_get(abstract, path).shape)
      if path[-1] in ("bias", "mlm_bias"):
        out[path] = jnp.zeros(shape, jnp.float32)
      elif path[-1] == "scale":
        out[path] = jnp.ones(shape, jnp.float32)
      else:
        out[path] = weight(jax.random.fold_in(key, i), shape, jnp.float32)
    return out

  return {k: np.asarray(v) for k, v in jax.jit(init)(jax.random.key(seed)).items()}


# ----------------------------------------------------------------------------
# Configs


def bert_config_from_hf(hf: Mapping, source: str) -> Any:
  """A float32 BertConfig with the settings of a HF / google `config.json`."""
  from bert_jax.model import BertConfig
  missing = [k for k in _REQUIRED_FIELDS if k not in hf]
  if missing:
    raise ConfigError(f"{source}: missing field '{missing[0]}' (a BERT config needs "
                      f"{', '.join(_REQUIRED_FIELDS)})")
  if hf.get("model_type", "bert") != "bert":
    raise ConfigError(f"{source}: model_type is {hf['model_type']!r}; expected 'bert'")
  if hf.get("position_embedding_type", "absolute") != "absolute":
    raise ConfigError(f"{source}: position_embedding_type "
                      f"{hf['position_embedding_type']!r} is not supported; expected 'absolute'")
  if hf.get("tie_word_embeddings", True) is False:
    raise ConfigError(f"{source}: tie_word_embeddings is false; bert-jax ties the MLM "
                      "decoder to the word embeddings")
  get = lambda k: hf.get(k, _HF_DEFAULTS.get(k))
  act = get("hidden_act")
  if act not in _ACTIVATIONS:
    raise ConfigError(f"{source}: hidden_act {act!r} is not supported; expected one of "
                      f"{', '.join(_ACTIVATIONS)}")
  try:
    config = BertConfig(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
        num_layers=hf["num_hidden_layers"], num_heads=hf["num_attention_heads"],
        intermediate_size=hf["intermediate_size"],
        max_position_embeddings=get("max_position_embeddings"),
        type_vocab_size=get("type_vocab_size"),
        dropout_rate=float(get("hidden_dropout_prob")),
        attention_dropout_rate=float(get("attention_probs_dropout_prob")),
        layer_norm_eps=float(get("layer_norm_eps")),
        initializer_range=float(get("initializer_range")),
        gelu_approximate=_ACTIVATIONS[act], vocab_pad_multiple=1, dtype="float32")
    return config.validate()
  except (TypeError, ValueError) as e:
    raise ConfigError(f"{source}: {e}") from None
  except ConfigError as e:  # name the file rather than config.model.*
    raise ConfigError(f"{source}: {e}".replace("config.model.", "")) from None


def hf_config_from_bert(config: Any) -> dict:
  """The `config.json` of a transformers BertForPreTraining with `config`'s settings."""
  return {
      "architectures": ["BertForPreTraining"], "model_type": "bert",
      "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
      "num_hidden_layers": config.num_layers, "num_attention_heads": config.num_heads,
      "intermediate_size": config.intermediate_size,
      "hidden_act": "gelu_new" if config.gelu_approximate else "gelu",
      "hidden_dropout_prob": config.dropout_rate,
      "attention_probs_dropout_prob": config.attention_dropout_rate,
      "max_position_embeddings": config.max_position_embeddings,
      "type_vocab_size": config.type_vocab_size,
      "initializer_range": config.initializer_range, "layer_norm_eps": config.layer_norm_eps,
      "pad_token_id": 0, "position_embedding_type": "absolute",
      "tie_word_embeddings": True, "torch_dtype": "float32",
  }


# ----------------------------------------------------------------------------
# State dicts <-> params (pure numpy; no files)


def _canonical_hf_name(name: str) -> str:
  """`BertModel` names get the `bert.` prefix; old `gamma`/`beta` become weight/bias."""
  if name.startswith(("embeddings.", "encoder.", "pooler.")):
    name = "bert." + name
  if ".LayerNorm." in name or name.startswith("LayerNorm."):
    name = re.sub(r"\.gamma$", ".weight", re.sub(r"\.beta$", ".bias", name))
  return name


@dataclasses.dataclass
class ImportReport:
  groups: dict  # group -> "imported" | "initialised"
  ignored: list  # source names not used (buffers, tied copies, other heads)


def hf_state_to_params(state: Mapping[str, np.ndarray], config: Any, *, source: str,
                       heads: bool = True, seed: int = 0) -> tuple[dict, ImportReport]:
  """Maps a HF BERT state dict (BertModel or BertForPreTraining names) to our params.

  `source` names the weights in errors. Missing pooler / heads (or all heads with
  `heads=False`) are initialised from `seed`; the encoder must be complete and
  every tensor must have the shape the config implies.
  """
  spec = _spec(config)
  by_name = {t.hf: t for t in spec}
  canon: dict[str, np.ndarray] = {}
  ignored: list[str] = []
  for name, array in state.items():
    c = _canonical_hf_name(name)
    if c in _IGNORED_HF or (not heads and c.startswith("cls.")):
      ignored.append(name)
    elif c in by_name:
      if c in canon:
        raise ConvertError(f"{source}: tensor {c!r} appears twice (as {name!r})")
      canon[c] = array
    elif c.startswith(("bert.", "cls.")):
      raise ConvertError(
          f"{source}: unexpected tensor {name!r}: not a parameter of a BERT with "
          f"num_hidden_layers={config.num_layers} as the config says")
    else:  # another task's head, e.g. classifier.*: not part of pre-training
      ignored.append(name)
  # A tied-only export keeps the decoder bias under its other name.
  bias = next((n for n in ("cls.predictions.decoder.bias",) if n in state), None)
  if heads and bias and "cls.predictions.bias" not in canon:
    canon["cls.predictions.bias"] = state[bias]
    ignored.remove(bias)

  groups: dict[str, str] = {}
  for group in (ENCODER, POOLER, MLM, NSP):
    members = [t for t in spec if t.group == group]
    present = [t for t in members if t.hf in canon]
    if len(present) == len(members):
      groups[group] = "imported"
    elif group == ENCODER or present:
      missing = next(t.hf for t in members if t.hf not in canon)
      what = "the encoder" if group == ENCODER else f"the {_GROUP_NAMES[group]}"
      raise ConvertError(f"{source}: missing tensor {missing!r} of {what}")
    else:
      groups[group] = "initialised"
  for t in spec:
    if t.hf in canon and tuple(np.shape(canon[t.hf])) != t.hf_shape:
      raise ConvertError(
          f"{source}: tensor {t.hf!r} has shape {tuple(np.shape(canon[t.hf]))}; the config "
          f"expects {t.hf_shape}")

  _warn_non_finite(canon, source)

  abstract = _abstract_params(config)
  fresh = _init_missing(config, abstract, [t.path for t in spec if t.hf not in canon], seed)
  params: dict = {}
  for t in spec:
    if t.hf in canon:
      _set(params, t.path, _to_ours(t, canon[t.hf], tuple(_get(abstract, t.path).shape)))
    else:
      _set(params, t.path, fresh[t.path])
  return params, ImportReport(groups, sorted(ignored))


def non_finite_tensors(state: Mapping[str, Any]) -> list[str]:
  """Names of the tensors holding a NaN or an infinity, in name order."""
  bad = []
  for name in sorted(state):
    array = np.asarray(state[name])
    if array.dtype.kind in "biu":
      continue
    try:
      finite = np.isfinite(array).all()
    except TypeError:  # a float type numpy's isfinite does not know (e.g. bfloat16)
      finite = np.isfinite(array.astype(np.float32)).all()
    if not finite:
      bad.append(name)
  return bad


def _warn_non_finite(state: Mapping[str, Any], source: str, shown: int = 5) -> None:
  """One `warning:` line naming the imported tensors that hold NaN/inf (import goes on)."""
  bad = non_finite_tensors(state)
  if bad:
    names = ", ".join(bad[:shown]) + (f" and {len(bad) - shown} more" if len(bad) > shown else "")
    print(f"warning: {source}: {len(bad)} tensor(s) hold NaN or inf values: {names}; "
          "training from them stops at its first step, and features from them are not finite",
          file=sys.stderr, flush=True)


def params_to_hf_state(params: Mapping, config: Any) -> dict[str, np.ndarray]:
  """Our BertForPreTraining params (or their gradients) as a HF state dict.

  The padded vocabulary is cut back to `config.vocab_size`. The result is what
  `transformers.BertForPreTraining` holds, minus the tied decoder weight.
  """
  spec = _spec(config)
  abstract = _abstract_params(config)
  out = {}
  for t in spec:
    try:
      x = _get(params, t.path)
    except (KeyError, TypeError):
      raise ConvertError(f"checkpoint params have no {'/'.join(t.path)} "
                         "(expected a BertForPreTraining parameter tree)") from None
    want = tuple(_get(abstract, t.path).shape)
    if tuple(np.shape(x)) != want:
      raise ConvertError(f"checkpoint param {'/'.join(t.path)} has shape {tuple(np.shape(x))}; "
                         f"its model_config expects {want}")
    out[t.hf] = _to_hf(t, np.asarray(x))
  return out


def tf_to_hf(variables: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """google-research/bert variable names to HF BertForPreTraining names.

  Pure: `{tf_name: array} -> {hf_name: array}`. Kernels ([in, out] in TF) are
  transposed to HF's [out, in]; `cls/seq_relationship/output_weights` is already
  [2, D]. Optimizer slots and `global_step` are dropped; names outside `bert/`
  and `cls/` (other tasks' heads) are passed through unchanged.
  """
  out = {}
  for name, array in variables.items():
    if _TF_IGNORED.search(name):
      continue
    if not name.startswith(("bert/", "cls/")):
      out[name] = array
      continue
    x = np.asarray(array)
    if name in _TF_TABLES:
      hf = name + "/weight"
    elif name == "cls/predictions/output_bias":
      hf = "cls/predictions/bias"
    elif name == "cls/seq_relationship/output_weights":
      hf = "cls/seq_relationship/weight"
    elif name == "cls/seq_relationship/output_bias":
      hf = "cls/seq_relationship/bias"
    elif name.endswith("/kernel"):
      hf, x = name[:-len("kernel")] + "weight", x.T
    else:
      hf = re.sub(r"/gamma$", "/weight", re.sub(r"/beta$", "/bias", name))
    hf = re.sub(r"/layer_(\d+)/", r"/layer/\1/", hf)
    out[hf.replace("/", ".")] = x
  return out


# ----------------------------------------------------------------------------
# Reading sources


def _read_json(path: str, what: str) -> dict:
  if not os.path.isfile(path):
    raise ConfigError(f"{path}: no such file (expected the {what})")
  try:
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
  except (ValueError, UnicodeDecodeError) as e:
    raise ConfigError(f"{path}: not valid JSON ({str(e).splitlines()[0]}); expected the {what} "
                      "as a JSON object") from None
  if not isinstance(data, dict):
    raise ConfigError(f"{path}: expected a JSON object, got {type(data).__name__}")
  return data


def _check_dir(path: str, what: str) -> str:
  path = os.path.abspath(path)
  if not os.path.isdir(path):
    found = "is not a directory" if os.path.exists(path) else "no such directory"
    raise ConfigError(f"{what} {path}: {found}; expected the directory of the model's files")
  return path


def _load_safetensors(path: str) -> dict[str, np.ndarray]:
  from safetensors import SafetensorError
  from safetensors.numpy import load_file
  try:
    return load_file(path)
  except (SafetensorError, OSError, ValueError, TypeError) as e:
    raise ConvertError(f"{path}: cannot read safetensors ({str(e).splitlines()[0]})") from None


def _load_torch_bin(path: str) -> dict[str, np.ndarray]:
  try:
    import torch
  except ImportError:
    raise ConvertError(f"{path}: reading pytorch_model.bin needs torch (pip install torch); "
                       "or convert it to model.safetensors") from None
  try:
    state = torch.load(path, map_location="cpu", weights_only=True)
  except Exception as e:  # pickle/zip errors come in many types
    raise ConvertError(f"{path}: cannot read as a weights-only torch state dict "
                       f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
  if not isinstance(state, Mapping):
    raise ConvertError(f"{path}: expected a state dict, got {type(state).__name__}")
  return {k: v.detach().float().numpy() if v.is_floating_point() else v.numpy()
          for k, v in state.items() if isinstance(v, torch.Tensor)}


def load_hf_weights(hf_dir: str) -> tuple[dict[str, np.ndarray], str]:
  """(state dict, file name for messages) from model.safetensors (sharded too) or .bin."""
  single = os.path.join(hf_dir, "model.safetensors")
  index = os.path.join(hf_dir, "model.safetensors.index.json")
  torch_bin = os.path.join(hf_dir, "pytorch_model.bin")
  if os.path.isfile(single):
    return _load_safetensors(single), single
  if os.path.isfile(index):
    weight_map = _read_json(index, "safetensors index").get("weight_map")
    if not isinstance(weight_map, dict):
      raise ConvertError(f"{index}: expected a 'weight_map' object")
    state: dict[str, np.ndarray] = {}
    for shard in sorted(set(weight_map.values())):
      state.update(_load_safetensors(os.path.join(hf_dir, shard)))
    return state, index
  if os.path.isfile(torch_bin):
    return _load_torch_bin(torch_bin), torch_bin
  raise ConvertError(f"{hf_dir}: no weights (expected model.safetensors, "
                     "model.safetensors.index.json or pytorch_model.bin)")


def _lowercase(directory: str, hf_config: Mapping, override: Optional[bool]) -> tuple[bool, str]:
  """do_lower_case and where it came from."""
  if override is not None:
    return override, "from the command line"
  tok_config = os.path.join(directory, "tokenizer_config.json")
  if os.path.isfile(tok_config):
    value = _read_json(tok_config, "tokenizer config").get("do_lower_case")
    if isinstance(value, bool):
      return value, "do_lower_case in tokenizer_config.json"
  name = f"{hf_config.get('_name_or_path', '')} {os.path.basename(directory)}".lower()
  if "uncased" in name:
    return True, "'uncased' in the model name"
  if "cased" in name:
    return False, "'cased' in the model name"
  return True, "default (no tokenizer_config.json or cased/uncased in the name)"


def _vocab(directory: str, config: Any, lowercase: bool, config_file: str) -> Any:
  from bert_jax.tokenizer import Tokenizer
  path = os.path.join(directory, "vocab.txt")
  if not os.path.isfile(path):
    raise ConfigError(f"{path}: no such file (expected the WordPiece vocabulary)")
  tokenizer = Tokenizer.from_vocab_file(path, lowercase)
  if tokenizer.vocab_size != config.vocab_size:
    raise ConfigError(f"{path} has {tokenizer.vocab_size} tokens but {config_file} says "
                      f"vocab_size={config.vocab_size}; expected one token per id")
  return tokenizer


# ----------------------------------------------------------------------------
# Writing outputs atomically


@contextlib.contextmanager
def _atomic_output_dir(out_dir: str, overwrite: bool) -> Iterator[str]:
  """Yields a temp dir beside `out_dir` that becomes `out_dir` only if the block succeeds."""
  out_dir = os.path.abspath(out_dir)
  if os.path.exists(out_dir) and not os.path.isdir(out_dir):
    raise ConfigError(f"output {out_dir} exists and is not a directory; expected a directory "
                      "(created if missing)")
  if os.path.isdir(out_dir) and os.listdir(out_dir) and not overwrite:
    raise ConfigError(f"output {out_dir} exists and is not empty; pass --overwrite to replace it")
  parent, base = os.path.split(out_dir)
  os.makedirs(parent, exist_ok=True)
  tmp = os.path.join(parent, f".{base}.tmp-{os.getpid()}")
  shutil.rmtree(tmp, ignore_errors=True)
  os.makedirs(tmp)
  try:
    yield tmp
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  old = os.path.join(parent, f".{base}.old-{os.getpid()}")
  if os.path.isdir(out_dir):
    os.replace(out_dir, old)
  os.replace(tmp, out_dir)
  shutil.rmtree(old, ignore_errors=True)


def _save_imported(out_dir: str, overwrite: bool, params: dict, meta: dict) -> str:
  from bert_jax import checkpointing
  with _atomic_output_dir(out_dir, overwrite) as tmp:
    checkpointing.save_params(tmp, 0, params, meta)
  return os.path.join(os.path.abspath(out_dir), "checkpoints", "0")


# ----------------------------------------------------------------------------
# The three operations


def _meta(config: Any, tokenizer: Any, lowercase_from: str, source: str,
          report: ImportReport) -> dict:
  return {"model_config": config.to_dict(), "vocab": tokenizer.vocab,
          "lowercase": tokenizer.lowercase, "lowercase_from": lowercase_from, "step": 0,
          "source": source, "heads": dict(report.groups), "ignored": report.ignored}


def import_hf(hf_dir: str, out_dir: str, heads: bool = True, overwrite: bool = False,
              seed: int = 0, lowercase: Optional[bool] = None) -> dict:
  """Imports a HuggingFace BERT directory; returns the checkpoint's meta."""
  hf_dir = _check_dir(hf_dir, "HuggingFace model")
  config_path = os.path.join(hf_dir, "config.json")
  hf_config = _read_json(config_path, "model config")
  config = bert_config_from_hf(hf_config, config_path)
  lower, lower_from = _lowercase(hf_dir, hf_config, lowercase)
  tokenizer = _vocab(hf_dir, config, lower, config_path)
  state, weights_file = load_hf_weights(hf_dir)
  params, report = hf_state_to_params(state, config, source=weights_file, heads=heads, seed=seed)
  meta = _meta(config, tokenizer, lower_from, f"huggingface:{hf_dir}", report)
  meta["checkpoint"] = _save_imported(out_dir, overwrite, params, meta)
  return meta


def _tf_checkpoint_prefix(tf_dir: str) -> str:
  preferred = os.path.join(tf_dir, "bert_model.ckpt")
  if os.path.isfile(preferred + ".index"):
    return preferred
  prefixes = sorted(p[:-len(".index")] for p in glob.glob(os.path.join(tf_dir, "*.index")))
  if not prefixes:
    raise ConvertError(f"{tf_dir}: no TensorFlow checkpoint (expected bert_model.ckpt.index "
                       "and bert_model.ckpt.data-*)")
  step = lambda p: int(m.group(1)) if (m := re.search(r"-(\d+)$", p)) else -1
  return max(prefixes, key=step)  # the newest of model.ckpt-N


def _load_tf_checkpoint(prefix: str) -> dict[str, np.ndarray]:
  try:
    import tensorflow as tf
  except ImportError:
    raise ConvertError(f"{prefix}: reading a TensorFlow checkpoint needs TensorFlow, which is "
                       "not installed (pip install tensorflow-cpu)") from None
  try:
    reader = tf.train.load_checkpoint(prefix)
    names = reader.get_variable_to_shape_map()
    return {n: np.asarray(reader.get_tensor(n)) for n in sorted(names)
            if not _TF_IGNORED.search(n)}
  except Exception as e:  # TF raises its own error types
    raise ConvertError(f"{prefix}: cannot read the TensorFlow checkpoint "
                       f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None


def import_tf(tf_dir: str, out_dir: str, heads: bool = True, overwrite: bool = False,
              seed: int = 0, lowercase: Optional[bool] = None) -> dict:
  """Imports a google-research/bert checkpoint directory; returns the checkpoint's meta."""
  if os.path.isfile(tf_dir + ".index"):  # a checkpoint prefix was given
    tf_dir, prefix = os.path.dirname(os.path.abspath(tf_dir)), os.path.abspath(tf_dir)
  else:
    tf_dir, prefix = _check_dir(tf_dir, "TensorFlow model"), None
  config_path = os.path.join(tf_dir, "bert_config.json")
  if not os.path.isfile(config_path) and os.path.isfile(os.path.join(tf_dir, "config.json")):
    config_path = os.path.join(tf_dir, "config.json")
  hf_config = _read_json(config_path, "model config")
  config = bert_config_from_hf(hf_config, config_path)
  lower, lower_from = _lowercase(tf_dir, hf_config, lowercase)
  tokenizer = _vocab(tf_dir, config, lower, config_path)
  prefix = prefix or _tf_checkpoint_prefix(tf_dir)
  state = tf_to_hf(_load_tf_checkpoint(prefix))
  params, report = hf_state_to_params(state, config, source=prefix, heads=heads, seed=seed)
  meta = _meta(config, tokenizer, lower_from, f"tensorflow:{prefix}", report)
  meta["checkpoint"] = _save_imported(out_dir, overwrite, params, meta)
  return meta


def export_hf(ckpt: str, out_dir: str, step: Optional[int] = None,
              overwrite: bool = False) -> dict:
  """Writes a bert-jax checkpoint (imported or a training workdir) as a HF directory.

  Returns the meta of the exported checkpoint.
  """
  from bert_jax import checkpointing
  from bert_jax.model import BertConfig
  from bert_jax.tokenizer import Tokenizer
  from safetensors.numpy import save_file
  params, meta = checkpointing.restore_params(ckpt, step=step)
  where = f"checkpoint {os.path.abspath(ckpt)}"
  for field in ("model_config", "vocab", "lowercase"):
    if field not in meta:
      raise ConvertError(f"{where}: meta has no {field!r}")
  try:
    config = BertConfig.from_dict(meta["model_config"]).validate()
  except TypeError as e:
    raise ConvertError(f"{where}: meta model_config is incomplete ({e})") from None
  tokenizer = Tokenizer(meta["vocab"], bool(meta["lowercase"]), source=f"{where} meta vocab")
  if tokenizer.vocab_size != config.vocab_size:
    raise ConvertError(f"{where}: meta vocab has {tokenizer.vocab_size} tokens but model_config "
                       f"vocab_size={config.vocab_size}")
  state = params_to_hf_state(params, config)
  specials = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
              "cls_token": "[CLS]", "mask_token": "[MASK]"}
  tok_config = {"tokenizer_class": "BertTokenizer", "do_lower_case": tokenizer.lowercase,
                "strip_accents": None, "tokenize_chinese_chars": True,
                "model_max_length": config.max_position_embeddings, **specials}
  with _atomic_output_dir(out_dir, overwrite) as tmp:
    save_file(state, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    for name, obj in (("config.json", hf_config_from_bert(config)),
                      ("tokenizer_config.json", tok_config),
                      ("special_tokens_map.json", specials)):
      with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
    with open(os.path.join(tmp, "vocab.txt"), "w", encoding="utf-8") as f:
      f.write("".join(tok + "\n" for tok in tokenizer.vocab))
    os.chmod(os.path.join(tmp, "model.safetensors"), 0o644)  # safetensors writes 0600
  return meta


# ----------------------------------------------------------------------------
# CLI


def _describe(config: Any) -> str:
  act = "tanh-approximate GELU" if config.gelu_approximate else "exact GELU"
  return (f"{config.num_layers} layers, hidden {config.hidden_size}, {config.num_heads} heads, "
          f"intermediate {config.intermediate_size}, vocab {config.vocab_size}, "
          f"{config.max_position_embeddings} positions, {config.type_vocab_size} token types, "
          f"{act}, layer_norm_eps {config.layer_norm_eps:g}, float32")


def _print_import(meta: dict, heads: bool) -> None:
  from bert_jax.model import BertConfig
  print(f"imported {meta['source']} -> {meta['checkpoint']}")
  print(f"  model: {_describe(BertConfig.from_dict(meta['model_config']))}")
  print(f"  lowercase: {meta['lowercase']} ({meta['lowercase_from']})")
  for group, state in meta["heads"].items():
    if group != ENCODER:
      why = "not in the source" if heads or group == POOLER else "--no-heads"
      note = "" if state == "imported" else f" randomly ({why})"
      print(f"  {_GROUP_NAMES[group]}: {state}{note}")
  if meta["ignored"]:
    print(f"  ignored {len(meta['ignored'])} tensor(s): {', '.join(meta['ignored'][:5])}"
          + (" ..." if len(meta["ignored"]) > 5 else ""))


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python -m bert_jax.convert", description=__doc__.split(
      "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = p.add_subparsers(dest="command", required=True)
  for name, src in (("from-hf", "HF_DIR"), ("from-tf", "TF_DIR")):
    s = sub.add_parser(name, help=f"import {src} into a bert-jax checkpoint in OUT_DIR")
    s.add_argument("source", metavar=src)
    s.add_argument("out_dir", metavar="OUT_DIR")
    s.add_argument("--no-heads", action="store_true",
                   help="do not import the pre-training heads (initialise them)")
    s.add_argument("--lowercase", choices=("auto", "true", "false"), default="auto",
                   help="do_lower_case (default: tokenizer_config.json, else the model name)")
    s.add_argument("--seed", type=int, default=0, help="seed for initialised heads")
    s.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT_DIR")
  s = sub.add_parser("to-hf", help="export a bert-jax checkpoint to a HuggingFace directory")
  s.add_argument("source", metavar="CKPT", help="workdir, its checkpoints/ or a step folder")
  s.add_argument("out_dir", metavar="OUT_HF_DIR")
  s.add_argument("--step", type=int, default=None, help="checkpoint step (default: newest)")
  s.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT_HF_DIR")
  return p


def main(argv: Optional[Sequence[str]] = None) -> int:
  args = _parser().parse_args(argv)
  try:
    if args.command == "to-hf":
      meta = export_hf(args.source, args.out_dir, step=args.step, overwrite=args.overwrite)
      print(f"exported {os.path.abspath(args.source)} (step {meta.get('step')}) -> "
            f"{os.path.abspath(args.out_dir)}")
      initialised = [g for g, s in meta.get("heads", {}).items() if s == "initialised"]
      if initialised:
        print("  note: " + ", ".join(_GROUP_NAMES[g] for g in initialised)
              + " were randomly initialised at import, not trained")
      return 0
    lower = {"auto": None, "true": True, "false": False}[args.lowercase]
    run = import_hf if args.command == "from-hf" else import_tf
    meta = run(args.source, args.out_dir, heads=not args.no_heads, overwrite=args.overwrite,
               seed=args.seed, lowercase=lower)
    _print_import(meta, not args.no_heads)
    return 0
  except BertJaxError as e:
    print("error: " + " ".join(str(e).split()), file=sys.stderr)
    return 2


def cli() -> None:
  """The console entry point (`bert-jax-convert`)."""
  sys.exit(main())


if __name__ == "__main__":
  cli()
