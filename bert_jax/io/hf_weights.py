"""The pure mapping between HuggingFace BERT tensors and our parameter tree.

Owns the one table of tensors (`tensor_spec`): HuggingFace name, our param path, how
the array is laid out. HF `nn.Linear` weights are [out, in]; ours are [in, out],
with attention projections split into heads. Also the translation of configs
(`config.json` <-> ModelConfig), the state dict <-> params conversion in both
directions (`hf_state_to_params` assembles imported tensors into params,
initialising missing heads), and the renaming of google-research TensorFlow
variables to HF names (`tf_to_hf`). No files are read or written here: that is
bert_jax.io.convert.

Shape legend: V vocab (Vp padded), D hidden, H heads, K head size (D / H),
F intermediate, P max positions, T token types.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.errors import CheckpointError, ConfigError
from bert_jax.settings.model import ModelConfig
from bert_jax.model.build import abstract_params

# Parameter groups: the encoder must be complete; the others may be initialised.
ENCODER, POOLER, MLM, NSP = "encoder", "pooler", "mlm", "nsp"
HEADS = (MLM, NSP)
GROUP_NAMES = {POOLER: "pooler", MLM: "MLM head (cls.predictions.*)",
                NSP: "NSP head (cls.seq_relationship.*)"}

# hidden_act -> gelu_approximate. gelu_new / gelu_pytorch_tanh are the tanh form.
_ACTIVATIONS = {"gelu": False, "gelu_new": True, "gelu_pytorch_tanh": True}
# Sizes a config.json must state; everything else has HF's ModelConfig default.
_REQUIRED_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers",
                    "num_attention_heads", "intermediate_size")
_HF_DEFAULTS = {"max_position_embeddings": 512, "type_vocab_size": 2, "hidden_act": "gelu",
                "layer_norm_eps": 1e-12, "initializer_range": 0.02,
                "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1}
# Buffers and tied copies that carry no parameter of their own.
_IGNORED_HF = ("bert.embeddings.position_ids", "cls.predictions.decoder.weight",
               "cls.predictions.decoder.bias")
TF_IGNORED = re.compile(r"(^|/)(adam_m|adam_v|global_step)($|/)")
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


def tensor_spec(c: ModelConfig) -> list[_Tensor]:
  """Every parameter of BertForPreTraining for config `c` (a ModelConfig)."""
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


def get_path(tree: Mapping, path: tuple) -> Any:
  for k in path:
    tree = tree[k]
  return tree


def _set(tree: dict, path: tuple, value: Any) -> None:
  for k in path[:-1]:
    tree = tree.setdefault(k, {})
  tree[path[-1]] = value


def abstract_params_of(config: ModelConfig) -> dict:
  """Shapes of BertForPreTraining's params, without allocating them."""
  return nn.meta.unbox(abstract_params(config))


def _init_missing(config: ModelConfig, abstract: Mapping, paths: Sequence[tuple], seed: int) -> dict:
  """Fresh values for `paths`, by model.py's rule: weights from a normal truncated at
  2 stddev (initializer_range), biases 0, LayerNorm scales 1.

  Only the missing leaves are made: initialising the whole model would trace
  and compile its forward pass, which takes seconds even for a tiny config.
  """
  weight = nn.initializers.truncated_normal(config.initializer_range)

  def init(key):
    out = {}
    for i, path in enumerate(paths):
      shape = tuple(get_path(abstract, path).shape)
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


def bert_config_from_hf(hf: Mapping, source: str) -> ModelConfig:
  """A float32 ModelConfig with the settings of a HF / google `config.json`."""
  missing = [k for k in _REQUIRED_FIELDS if k not in hf]
  if missing:
    raise ConfigError(f"{source}: missing field '{missing[0]}' (a BERT config needs "
                      f"{', '.join(_REQUIRED_FIELDS)})")
  if hf.get("model_type", "bert") != "bert":
    raise ConfigError(f"{source}: model_type is {hf['model_type']!r}; expected 'bert' or "
                      "'modernbert'")
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
    config = ModelConfig(
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


def classifier_fields(classifier: Optional[Mapping], architecture: str) -> dict:
  """The config.json fields of a sequence classifier (`architecture`) from a fine-tuned
  checkpoint's meta["classifier"] (num_labels, labels, problem_type, dropout); {} if None."""
  if classifier is None:
    return {}
  n = int(classifier["num_labels"])
  names = list(classifier.get("labels") or [f"LABEL_{i}" for i in range(n)])
  return {"architectures": [architecture], "num_labels": n,
          "id2label": {str(i): name for i, name in enumerate(names)},
          "label2id": {name: i for i, name in enumerate(names)},
          "problem_type": classifier["problem_type"],
          "classifier_dropout": classifier.get("dropout")}


def hf_config_from_bert(config: ModelConfig, classifier: Optional[Mapping] = None) -> dict:
  """The `config.json` of a transformers BertForPreTraining with `config`'s settings.

  With `classifier` (a fine-tuned checkpoint's meta["classifier"]: num_labels,
  labels, problem_type): a BertForSequenceClassification's instead.
  """
  head = classifier_fields(classifier, "BertForSequenceClassification")
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
      "tie_word_embeddings": True, "torch_dtype": "float32", **head,
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


def match_hf_names(shapes: Mapping[str, tuple], config: ModelConfig, *, source: str,
                   heads: bool = True) -> tuple[dict[str, str], ImportReport]:
  """Which source tensor is which parameter, from names and shapes alone (no data read).

  `shapes` maps the source's tensor names to their shapes. Returns ({canonical HF
  name: source name}, the report). One ConvertError line naming `source` for a
  tensor twice, an unexpected one, a missing one of the encoder or of a partly
  present group, or a shape the config does not imply.
  """
  spec = tensor_spec(config)
  by_name = {t.hf: t for t in spec}
  canon: dict[str, str] = {}
  ignored: list[str] = []
  for name in shapes:
    c = _canonical_hf_name(name)
    if c in _IGNORED_HF or (not heads and c.startswith("cls.")):
      ignored.append(name)
    elif c in by_name:
      if c in canon:
        raise ConvertError(f"{source}: tensor {c!r} appears twice (as {name!r})")
      canon[c] = name
    elif c.startswith(("bert.", "cls.")):
      raise ConvertError(
          f"{source}: unexpected tensor {name!r}: not a parameter of a BERT with "
          f"num_hidden_layers={config.num_layers} as the config says")
    else:  # another task's head, e.g. classifier.*: not part of pre-training
      ignored.append(name)
  # A tied-only export keeps the decoder bias under its other name.
  bias = next((n for n in ("cls.predictions.decoder.bias",) if n in shapes), None)
  if heads and bias and "cls.predictions.bias" not in canon:
    canon["cls.predictions.bias"] = bias
    ignored.remove(bias)

  groups: dict[str, str] = {}
  for group in (ENCODER, POOLER, MLM, NSP):
    members = [t for t in spec if t.group == group]
    present = [t for t in members if t.hf in canon]
    if len(present) == len(members):
      groups[group] = "imported"
    elif group == ENCODER or present:
      missing = next(t.hf for t in members if t.hf not in canon)
      what = "the encoder" if group == ENCODER else f"the {GROUP_NAMES[group]}"
      raise ConvertError(f"{source}: missing tensor {missing!r} of {what}")
    else:
      groups[group] = "initialised"
  for t in spec:
    if t.hf in canon and tuple(shapes[canon[t.hf]]) != t.hf_shape:
      raise ConvertError(
          f"{source}: tensor {t.hf!r} has shape {tuple(shapes[canon[t.hf]])}; the config "
          f"expects {t.hf_shape}")
  return canon, ImportReport(groups, sorted(ignored))


def hf_state_to_params(state: Mapping[str, np.ndarray], config: ModelConfig, *, source: str,
                       heads: bool = True, seed: int = 0) -> tuple[dict, ImportReport]:
  """Maps a HF BERT state dict (BertModel or BertForPreTraining names) to our params.

  `source` names the weights in errors. Missing pooler / heads (or all heads with
  `heads=False`) are initialised from `seed`; the encoder must be complete and
  every tensor must have the shape the config implies (`match_hf_names`).
  """
  spec = tensor_spec(config)
  names, report = match_hf_names({k: tuple(np.shape(v)) for k, v in state.items()}, config,
                                 source=source, heads=heads)
  canon = {c: state[n] for c, n in names.items()}
  _warn_non_finite(canon, source)

  abstract = abstract_params_of(config)
  fresh = _init_missing(config, abstract, [t.path for t in spec if t.hf not in canon], seed)
  params: dict = {}
  for t in spec:
    if t.hf in canon:
      _set(params, t.path, _to_ours(t, canon[t.hf], tuple(get_path(abstract, t.path).shape)))
    else:
      _set(params, t.path, fresh[t.path])
  return params, report


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


def params_to_hf_state(params: Mapping, config: ModelConfig) -> dict[str, np.ndarray]:
  """Our BertForPreTraining params (or their gradients) as a HF state dict.

  The padded vocabulary is cut back to `config.vocab_size`. The result is what
  `transformers.BertForPreTraining` holds, minus the tied decoder weight. A
  fine-tuned tree (bert + classifier, bert_jax.eval.finetune) gives what
  `transformers.BertForSequenceClassification` holds: `classifier.weight/bias`.
  """
  spec = tensor_spec(config)
  classifier = isinstance(params, Mapping) and "classifier" in params
  if classifier:  # no pre-training heads; the encoder and pooler as always
    spec = [t for t in spec if t.group in (ENCODER, POOLER)]
  abstract = abstract_params_of(config)
  out = {}
  for t in spec:
    try:
      x = get_path(params, t.path)
    except (KeyError, TypeError):
      raise ConvertError(f"checkpoint params have no {'/'.join(t.path)} "
                         "(expected a BertForPreTraining parameter tree)") from None
    want = tuple(get_path(abstract, t.path).shape)
    if tuple(np.shape(x)) != want:
      raise ConvertError(f"checkpoint param {'/'.join(t.path)} has shape {tuple(np.shape(x))}; "
                         f"its model_config expects {want}")
    out[t.hf] = _to_hf(t, np.asarray(x))
  if classifier:  # ours: kernel [D, C]; HF's Linear: weight [C, D]
    kernel_DxC = np.asarray(params["classifier"]["kernel"], np.float32)
    out["classifier.weight"] = np.ascontiguousarray(kernel_DxC.T)
    out["classifier.bias"] = np.asarray(params["classifier"]["bias"], np.float32)
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
    if TF_IGNORED.search(name):
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
