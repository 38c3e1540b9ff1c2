"""Reading a published BERT's files: HF config, weights, vocabulary, lowercasing, TF checkpoints.

Used by `convert from-hf / from-tf` and by continued pre-training (`train/init_from.py`).
Loading never executes code from a file: safetensors by default, a pickled
`pytorch_model.bin` only through `torch.load(..., weights_only=True)`.
"""

from __future__ import annotations

import glob
import json
import os
import re
from collections.abc import Mapping
from typing import Optional

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file

from bert_jax.errors import ConfigError
from bert_jax.io.hf_weights import TF_IGNORED, ConvertError
from bert_jax.settings.model import ModelConfig
from bert_jax.data import bpe
from bert_jax.data.tokenizer import Tokenizer
from bert_jax.storage import fs




def read_json(path: str, what: str) -> dict:
  if not os.path.isfile(path):
    raise ConfigError(f"{path}: no such file (expected the {what})")
  try:
    with fs.open(path, encoding="utf-8") as f:
      data = json.load(f)
  except (ValueError, UnicodeDecodeError) as e:
    raise ConfigError(f"{path}: not valid JSON ({str(e).splitlines()[0]}); expected the {what} "
                      "as a JSON object") from None
  if not isinstance(data, dict):
    raise ConfigError(f"{path}: expected a JSON object, got {type(data).__name__}")
  return data


def check_dir(path: str, what: str) -> str:
  path = os.path.abspath(path)
  if not os.path.isdir(path):
    found = "is not a directory" if os.path.exists(path) else "no such directory"
    raise ConfigError(f"{what} {path}: {found}; expected the directory of the model's files")
  return path


def _load_safetensors(path: str) -> dict[str, np.ndarray]:
  try:
    return load_file(path)
  except (SafetensorError, OSError, ValueError, TypeError) as e:
    raise ConvertError(f"{path}: cannot read safetensors ({str(e).splitlines()[0]})") from None


def _load_torch_bin(path: str) -> dict[str, np.ndarray]:
  try:
    import torch  # optional: only for pytorch_model.bin
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
    weight_map = read_json(index, "safetensors index").get("weight_map")
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


def resolve_lowercase(directory: str, hf_config: Mapping, override: Optional[bool]) -> tuple[bool, str]:
  """do_lower_case and where it came from."""
  if override is not None:
    return override, "from the command line"
  tok_config = os.path.join(directory, "tokenizer_config.json")
  if os.path.isfile(tok_config):
    value = read_json(tok_config, "tokenizer config").get("do_lower_case")
    if isinstance(value, bool):
      return value, "do_lower_case in tokenizer_config.json"
  name = f"{hf_config.get('_name_or_path', '')} {os.path.basename(directory)}".lower()
  if "uncased" in name:
    return True, "'uncased' in the model name"
  if "cased" in name:
    return False, "'cased' in the model name"
  return True, "default (no tokenizer_config.json or cased/uncased in the name)"


def read_hf_tokenizer(directory: str, hf_config: Mapping, config: ModelConfig,
                      config_file: str, override: Optional[bool] = None
                      ) -> tuple[bpe.AnyTokenizer, str]:
  """(tokenizer, where its lowercasing came from) of a HuggingFace directory, as
  transformers 4.x or 5.x writes it: a vocab.txt, a tokenizer.json (WordPiece or BPE,
  read with `tokenizers`; transformers 5 writes only this), or both, which must agree."""
  txt, tok_json = (os.path.join(directory, n) for n in ("vocab.txt", bpe.TOKENIZER_JSON))
  has_txt, has_json = os.path.isfile(txt), os.path.isfile(tok_json)
  if not has_txt and not has_json:
    raise ConfigError(f"{directory}: no vocab.txt and no tokenizer.json; expected the model's "
                      "WordPiece vocab.txt or its HuggingFace tokenizer.json (transformers 5 "
                      "saves only the latter)")
  if not has_json:
    lower, lower_from = resolve_lowercase(directory, hf_config, override)
    return read_vocab(directory, config, lower, config_file), lower_from
  doc = read_json(tok_json, "HuggingFace tokenizer")
  kind = (doc.get("model") or {}).get("type") if isinstance(doc.get("model"), dict) else None
  if kind == "BPE":
    if has_txt:
      raise ConfigError(f"{tok_json} is a BPE tokenizer but {txt} is a WordPiece vocabulary; "
                        "expected one tokenizer (remove the file that is not the model's)")
    return read_tokenizer_json(directory, config), "its tokenizer.json"
  if kind != "WordPiece":
    raise ConfigError(f"{tok_json}: a {kind!r} tokenizer model; expected WordPiece or BPE")
  vocab, json_lower = _wordpiece_json(doc, tok_json)
  lower, lower_from = resolve_lowercase(directory, hf_config, override)
  if override is None and not lower_from.startswith("do_lower_case"):
    lower, lower_from = json_lower, "the normalizer of tokenizer.json"
  if has_txt:
    tokenizer = read_vocab(directory, config, lower, config_file)
    if tokenizer.vocab != vocab:
      at = next((i for i, (a, b) in enumerate(zip(tokenizer.vocab, vocab)) if a != b),
                min(len(vocab), tokenizer.vocab_size))
      there, here = (repr(v[at]) if at < len(v) else "none" for v in (tokenizer.vocab, vocab))
      raise ConfigError(f"{txt} ({tokenizer.vocab_size} tokens) and {tok_json} ({len(vocab)}) "
                        f"disagree at id {at}: {there} in vocab.txt, {here} in tokenizer.json; "
                        "expected the same vocabulary in both (remove the stale one)")
    return tokenizer, lower_from
  tokenizer = Tokenizer(vocab, lower, source=tok_json)
  if tokenizer.vocab_size != config.vocab_size:
    raise ConfigError(f"{tok_json} has {tokenizer.vocab_size} tokens but {config_file} says "
                      f"vocab_size={config.vocab_size}; expected one token per id")
  return tokenizer, lower_from


def _wordpiece_json(doc: Mapping, path: str) -> tuple[list[str], bool]:
  """(tokens in id order, lowercase) of a WordPiece tokenizer.json; one line for what
  bert-jax's WordPiece cannot reproduce."""
  model = doc["model"]
  if model.get("continuing_subword_prefix", "##") != "##":
    raise ConfigError(f"{path}: continuing_subword_prefix {model['continuing_subword_prefix']!r}; "
                      "expected '##' (BERT's word pieces)")
  ids = dict(model.get("vocab") or {})
  for added in doc.get("added_tokens") or []:
    ids.setdefault(added.get("content"), added.get("id"))
  vocab: list = [None] * len(ids)
  for tok, i in ids.items():
    if not isinstance(i, int) or not 0 <= i < len(vocab) or vocab[i] is not None:
      raise ConfigError(f"{path}: token {tok!r} has id {i!r}; expected ids 0..{len(ids) - 1}, "
                        "one token per id")
    vocab[i] = tok
  norm = doc.get("normalizer") or {}
  if norm.get("type") != "BertNormalizer":
    raise ConfigError(f"{path}: normalizer {norm.get('type')!r}; expected BertNormalizer (a "
                      "BERT WordPiece tokenizer)")
  lower = bool(norm.get("lowercase", True))
  if norm.get("strip_accents") not in (None, lower):
    raise ConfigError(f"{path}: strip_accents={norm['strip_accents']} with lowercase={lower}; "
                      "expected accents stripped exactly when lowercasing (BERT's rule, which "
                      "bert-jax's WordPiece follows)")
  return vocab, lower


def read_vocab(directory: str, config: ModelConfig, lowercase: bool,
           config_file: str) -> Tokenizer:
  path = os.path.join(directory, "vocab.txt")
  if not os.path.isfile(path):
    raise ConfigError(f"{path}: no such file (expected the WordPiece vocabulary)")
  tokenizer = Tokenizer.from_vocab_file(path, lowercase)
  if tokenizer.vocab_size != config.vocab_size:
    raise ConfigError(f"{path} has {tokenizer.vocab_size} tokens but {config_file} says "
                      f"vocab_size={config.vocab_size}; expected one token per id")
  return tokenizer


def read_tokenizer_json(directory: str, config: ModelConfig):
  """A HuggingFace directory's BPE tokenizer.json (a ModernBERT's), one token per id."""
  path = os.path.join(directory, bpe.TOKENIZER_JSON)
  if not os.path.isfile(path):
    raise ConfigError(f"{directory}: no vocab.txt and no tokenizer.json; expected the model's "
                      "WordPiece vocabulary or its HuggingFace BPE tokenizer")
  tokenizer = bpe.BpeTokenizer.from_file(path)
  if tokenizer.vocab_size != config.vocab_size:
    raise ConfigError(f"{path} has {tokenizer.vocab_size} tokens but the model config says "
                      f"vocab_size={config.vocab_size}; expected one token per id")
  return tokenizer


# ----------------------------------------------------------------------------
# Writing outputs atomically


def tf_checkpoint_prefix(tf_dir: str) -> str:
  preferred = os.path.join(tf_dir, "bert_model.ckpt")
  if os.path.isfile(preferred + ".index"):
    return preferred
  prefixes = sorted(p[:-len(".index")] for p in glob.glob(os.path.join(tf_dir, "*.index")))
  if not prefixes:
    raise ConvertError(f"{tf_dir}: no TensorFlow checkpoint (expected bert_model.ckpt.index "
                       "and bert_model.ckpt.data-*)")
  step = lambda p: int(m.group(1)) if (m := re.search(r"-(\d+)$", p)) else -1
  return max(prefixes, key=step)  # the newest of model.ckpt-N


def load_tf_checkpoint(prefix: str) -> dict[str, np.ndarray]:
  try:
    import tensorflow as tf  # optional: only for google-research checkpoints
  except ImportError:
    raise ConvertError(f"{prefix}: reading a TensorFlow checkpoint needs TensorFlow, which is "
                       "not installed (pip install tensorflow-cpu)") from None
  try:
    reader = tf.train.load_checkpoint(prefix)
    names = reader.get_variable_to_shape_map()
    return {n: np.asarray(reader.get_tensor(n)) for n in sorted(names)
            if not TF_IGNORED.search(n)}
  except Exception as e:  # TF raises its own error types
    raise ConvertError(f"{prefix}: cannot read the TensorFlow checkpoint "
                       f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
