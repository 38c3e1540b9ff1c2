"""Import HuggingFace / google-research BERT checkpoints into bert-jax, and export back.

  python -m bert_jax.convert from-hf HF_DIR OUT_DIR [--no-heads] [--overwrite]
  python -m bert_jax.convert from-tf TF_DIR OUT_DIR [--no-heads] [--overwrite]
  python -m bert_jax.convert to-hf CKPT OUT_HF_DIR [--step N] [--overwrite]

An imported checkpoint is an Orbax params-only checkpoint (`OUT_DIR/checkpoints/0/`)
that `checkpointing.restore_params(OUT_DIR)` reads; its meta holds the model
config, vocabulary, lowercase flag, source and which heads were imported.
A fine-tuned checkpoint (`python -m bert_jax.finetune --save`) exports as a
BertForSequenceClassification (its meta's `classifier`: labels, problem type).

This module writes the checkpoint or the HF directory, atomically; its command line
is bert_jax.commands.convert; reading HF / TensorFlow sources is bert_jax.io.sources. The pure
name/shape mapping between HF tensors and our params, and the config
translation, are bert_jax.io.hf_weights.

Loading never executes code from a file: safetensors by default, a pickled
`pytorch_model.bin` only through `torch.load(..., weights_only=True)`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Optional

from safetensors.numpy import save_file

from bert_jax.io import checkpointing, hf_families
from bert_jax.storage import fs
from bert_jax.storage.outputs import atomic_output_dir, check_apart
from bert_jax.storage.workdir import opened
from bert_jax.io.hf_weights import (ConvertError, ImportReport, bert_config_from_hf,
                                 hf_state_to_params, tf_to_hf)
from bert_jax.io.sources import (check_dir, load_hf_weights, load_tf_checkpoint, read_json,
                                 read_hf_tokenizer, read_vocab, resolve_lowercase,
                                 tf_checkpoint_prefix)
from bert_jax.settings.model import ModelConfig
from bert_jax.data import bpe
from bert_jax.data.bpe import AnyTokenizer


def _save_imported(out_dir: str, overwrite: bool, params: dict, meta: dict,
                   source: str) -> str:
  with atomic_output_dir(out_dir, overwrite, reads=(("the source", source),)) as tmp:
    checkpointing.save_params(tmp, 0, params, meta)
  return fs.join(opened(fs.abspath(out_dir)).checkpoints, "0")


# ----------------------------------------------------------------------------
# The three operations


def _meta(config: ModelConfig, tokenizer: AnyTokenizer, lowercase_from: str, source: str,
          report: ImportReport) -> dict:
  return {"model_config": config.to_dict(), **bpe.to_meta(tokenizer),
          "lowercase_from": lowercase_from, "step": 0,
          "source": source, "heads": dict(report.groups), "ignored": report.ignored}


def read_hf(hf_dir: str, seed: int = 0,
            heads: bool = True) -> tuple[ModelConfig, dict, ImportReport]:
  """(config, params, what was imported) of a transformers directory of any family
  (config.json + safetensors or a weights_only .bin); heads it lacks, or every head
  with `heads=False`, are initialised from `seed`."""
  config_path = os.path.join(hf_dir, "config.json")
  hf_config = read_json(config_path, "model config")
  mapping = hf_families.for_hf_config(hf_config)
  config = mapping.config_from_hf(hf_config, config_path)
  config = dataclasses.replace(config, vocab_pad_multiple=mapping.import_pad_multiple).validate()
  state, weights_file = load_hf_weights(hf_dir)
  params, report = mapping.import_state(state, config, source=weights_file, heads=heads,
                                        seed=seed)
  return config, params, report


def write_hf(out_dir: str, params: dict, config: ModelConfig, special: dict,
             overwrite: bool = False, tokenizer: Optional[AnyTokenizer] = None,
             reads: tuple = (), classifier: Optional[dict] = None) -> None:
  """A directory transformers loads natively (no remote code), for any family:
  config.json, model.safetensors and, with `tokenizer`, its tokenizer files."""
  mapping = hf_families.of(config)
  state = mapping.export_state(jax_to_numpy(params), config)
  with atomic_output_dir(out_dir, overwrite, reads) as tmp:
    save_file(state, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    os.chmod(os.path.join(tmp, "model.safetensors"), 0o644)  # safetensors writes 0600
    _write_json(tmp, "config.json", mapping.hf_config(config, special, classifier))
    if tokenizer is not None:
      _write_tokenizer(tmp, tokenizer, config)


def _write_json(directory: str, name: str, obj: dict) -> None:
  with fs.open(os.path.join(directory, name), "w", encoding="utf-8") as f:
    json.dump(obj, f, indent=2)
    f.write("\n")


def jax_to_numpy(tree):
  import jax  # pylint: disable=import-outside-toplevel
  return jax.device_get(tree)


_SPECIALS = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
             "cls_token": "[CLS]", "mask_token": "[MASK]"}


def _write_tokenizer(directory: str, tokenizer: AnyTokenizer, config: ModelConfig) -> None:
  """The files transformers' AutoTokenizer loads, 4.x and 5.x alike: always a
  tokenizer.json (all that 5.x reads, for a ModernBERT too), and for a WordPiece its
  vocab.txt beside it (BertTokenizer's; what google-research/bert tools read)."""
  common = {"model_max_length": config.max_position_embeddings, **_SPECIALS}
  if isinstance(tokenizer, bpe.BpeTokenizer):
    fs.write_text(os.path.join(directory, bpe.TOKENIZER_JSON), tokenizer.json)
    tok_config = {"tokenizer_class": "PreTrainedTokenizerFast",
                  "clean_up_tokenization_spaces": False, **common}
  else:
    with fs.open(os.path.join(directory, "vocab.txt"), "w", encoding="utf-8") as f:
      f.write("".join(tok + "\n" for tok in tokenizer.vocab))
    fs.write_text(os.path.join(directory, bpe.TOKENIZER_JSON), tokenizer.hf_json())
    tok_config = {"tokenizer_class": "BertTokenizer", "do_lower_case": tokenizer.lowercase,
                  "strip_accents": None, "tokenize_chinese_chars": True, **common}
  _write_json(directory, "tokenizer_config.json", tok_config)
  _write_json(directory, "special_tokens_map.json", dict(_SPECIALS))


def import_hf(hf_dir: str, out_dir: str, heads: bool = True, overwrite: bool = False,
              seed: int = 0, lowercase: Optional[bool] = None) -> dict:
  """Imports a HuggingFace directory of any family; returns the checkpoint's meta."""
  hf_dir = check_dir(hf_dir, "HuggingFace model")
  config_path = os.path.join(hf_dir, "config.json")
  hf_config = read_json(config_path, "model config")
  config, params, report = read_hf(hf_dir, seed, heads)
  tokenizer, lower_from = read_hf_tokenizer(hf_dir, hf_config, config, config_path, lowercase)
  meta = _meta(config, tokenizer, lower_from, f"huggingface:{hf_dir}", report)
  meta["checkpoint"] = _save_imported(out_dir, overwrite, params, meta, hf_dir)
  return meta


def import_tf(tf_dir: str, out_dir: str, heads: bool = True, overwrite: bool = False,
              seed: int = 0, lowercase: Optional[bool] = None) -> dict:
  """Imports a google-research/bert checkpoint directory; returns the checkpoint's meta."""
  if os.path.isfile(tf_dir + ".index"):  # a checkpoint prefix was given
    tf_dir, prefix = os.path.dirname(os.path.abspath(tf_dir)), os.path.abspath(tf_dir)
  else:
    tf_dir, prefix = check_dir(tf_dir, "TensorFlow model"), None
  config_path = os.path.join(tf_dir, "bert_config.json")
  if not os.path.isfile(config_path) and os.path.isfile(os.path.join(tf_dir, "config.json")):
    config_path = os.path.join(tf_dir, "config.json")
  hf_config = read_json(config_path, "model config")
  config = bert_config_from_hf(hf_config, config_path)
  lower, lower_from = resolve_lowercase(tf_dir, hf_config, lowercase)
  tokenizer = read_vocab(tf_dir, config, lower, config_path)
  prefix = prefix or tf_checkpoint_prefix(tf_dir)
  state = tf_to_hf(load_tf_checkpoint(prefix))
  params, report = hf_state_to_params(state, config, source=prefix, heads=heads, seed=seed)
  meta = _meta(config, tokenizer, lower_from, f"tensorflow:{prefix}", report)
  meta["checkpoint"] = _save_imported(out_dir, overwrite, params, meta, tf_dir)
  return meta


def export_hf(ckpt: str, out_dir: str, step: Optional[int] = None,
              overwrite: bool = False) -> dict:
  """Writes a bert-jax checkpoint (imported or a training workdir) as a HF directory.

  Returns the meta of the exported checkpoint.
  """
  reads = (("the checkpoint", ckpt),)
  check_apart("output", out_dir, reads)  # before reading: a bad target costs nothing
  params, meta = checkpointing.restore_params(ckpt, step=step)
  where = f"checkpoint {os.path.abspath(ckpt)}"
  for field in ("model_config", "vocab", "lowercase"):
    if field not in meta:
      raise ConvertError(f"{where}: meta has no {field!r}")
  try:
    config = ModelConfig.from_dict(meta["model_config"]).validate()
  except TypeError as e:
    raise ConvertError(f"{where}: meta model_config is incomplete ({e})") from None
  tokenizer = bpe.from_meta(meta, source=f"{where} meta vocab")
  if tokenizer.vocab_size != config.vocab_size:
    raise ConvertError(f"{where}: meta vocab has {tokenizer.vocab_size} tokens but model_config "
                       f"vocab_size={config.vocab_size}")
  write_hf(out_dir, params, config, tokenizer.special_ids(), overwrite, tokenizer,
           reads, meta.get("classifier"))
  return meta


# ----------------------------------------------------------------------------
# CLI


if __name__ == "__main__":  # the old name of the command, kept working
  import runpy
  print("note: `python -m bert_jax.io.convert` is now `python -m bert_jax.convert`",
        file=sys.stderr)
  runpy.run_module("bert_jax.convert", run_name="__main__", alter_sys=True)
