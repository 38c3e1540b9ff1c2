"""Continue pre-training a published BERT: `--config.init_from=PATH`.

PATH is one of
  - a HuggingFace BERT directory (config.json, model.safetensors / its sharded
    index / pytorch_model.bin, vocab.txt),
  - a google-research/bert TensorFlow checkpoint directory (bert_config.json,
    vocab.txt, bert_model.ckpt.*; needs TensorFlow),
  - a checkpoint written by `python -m bert_jax.convert from-hf/from-tf`,
  - a bert-jax workdir, its checkpoints/ folder or one step folder
    (PATH/checkpoints/<step>); the newest step unless one is named.

`resolve` reads the source's config and vocabulary (weights only for bert-jax
sources, whose config lives beside them), checks the rest of it without
loading the weights (`source_check`: every tensor's header, bytes and shape)
and checks the run's config against it before anything is written: the
model's shape and numerics, the vocabulary and the lowercasing come from the
source; a config field that a config file or flag set to another value
(settings.InitSettings.overrides) is one error line.
`initial_state` builds the run's step-0 state: the source's parameters (the
pooler and heads initialised when absent, as `convert` does), extended by
`vocab_extension` if asked, and a fresh optimizer state.

The readers are bert_jax.io.convert's and the tensor mapping bert_jax.io.hf_weights':
every source becomes a HuggingFace state dict, then our parameters.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import importlib.util
import os
import shutil
import tempfile
from typing import Any, Iterator, Optional

import jax

from bert_jax import console
from bert_jax.io import source_check
from bert_jax.model import family
from bert_jax.train.eval_report import describe_eval, with_stderr
from bert_jax.data import corpus, dataset, vocab_extension
from bert_jax.io import checkpointing, hf_families, hf_weights, sources
from bert_jax.storage import fs
from bert_jax.storage.workdir import opened
from bert_jax.errors import BertJaxError, ConfigError
from bert_jax.io.hf_weights import ENCODER, GROUP_NAMES, MLM, NSP
from bert_jax.settings.model import ModelConfig
from bert_jax.settings import SOURCE_MODEL_FIELDS, DataSettings, Settings
from bert_jax.settings.init import SOURCE_DATA_FIELDS
from bert_jax.data import bpe
from bert_jax.data.bpe import AnyTokenizer

HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


@dataclasses.dataclass
class Source:
  """A resolved source: what it is, its model config (float32) and tokenizer."""
  path: str
  kind: str  # 'huggingface' | 'tensorflow' | 'bert-jax'
  config: ModelConfig
  tokenizer: AnyTokenizer
  lowercase_from: str
  heads: Optional[dict] = None  # bert-jax sources: what their meta says about the heads
  step: Optional[int] = None
  _params: Any = None  # bert-jax sources: read with their meta
  fresh_heads: tuple = ()  # pre-training heads not in the source (set by initial_params)

  def describe(self) -> str:
    c = self.config
    step = f" step {self.step}" if self.step is not None else ""
    return (f"{self.kind} model {self.path}{step}: {c.num_layers} layers, hidden "
            f"{c.hidden_size}, {c.num_heads} heads, intermediate {c.intermediate_size}, "
            f"{c.max_position_embeddings} positions, vocab {self.tokenizer.vocab_size}, "
            f"lowercase {self.tokenizer.lowercase} ({self.lowercase_from})")

  def hf_state(self) -> dict:
    """The source's weights as a HuggingFace state dict (numpy)."""
    if self.kind == "huggingface":
      return sources.load_hf_weights(self.path)[0]
    if self.kind == "tensorflow":
      return hf_weights.tf_to_hf(sources.load_tf_checkpoint(
          sources.tf_checkpoint_prefix(self.path)))
    return hf_families.of(self.config).export_state(jax.device_get(self._params), self.config)


def _flag(path: str) -> str:
  return f"--config.init_from={path!r}"


def _local_unless_checkpoint(path: str) -> str:
  """A bert-jax checkpoint is read where it is (Orbax reads a bucket too); a HuggingFace
  or TensorFlow directory in a bucket is copied to this host first (fs.local_mirror,
  which gives a local path back as it is)."""
  if _is_checkpoint(path):
    return fs.abspath(path).rstrip("/")
  return os.path.abspath(fs.local_mirror(path.rstrip("/")))


def _is_checkpoint(path: str) -> bool:
  return fs.isdir(opened(path).checkpoints) or fs.isdir(fs.join(path, "params"))


def _kind(path: str) -> str:
  if _is_checkpoint(path):  # local or in a bucket
    return "bert-jax"
  if not os.path.exists(path):
    raise ConfigError(f"{_flag(path)}: no such file or directory; expected a HuggingFace or "
                      "TensorFlow BERT directory, a bert_jax.io.convert checkpoint or a bert-jax "
                      "workdir")
  if os.path.isdir(path):
    has = lambda name: os.path.exists(os.path.join(path, name))
    if has("config.json") and any(has(w) for w in HF_WEIGHTS):
      return "huggingface"
    if has("bert_config.json") or glob.glob(os.path.join(path, "*.index")):
      return "tensorflow"
    if (os.path.isdir(opened(path).checkpoints) or has("params") or
        any(n.isdigit() for n in os.listdir(path))):
      return "bert-jax"
  raise ConfigError(
      f"{_flag(path)}: not a recognised BERT source; expected a HuggingFace directory "
      f"(config.json and {' or '.join(HF_WEIGHTS)}), a google-research/bert checkpoint directory "
      "(bert_config.json, bert_model.ckpt.*), a bert_jax.io.convert checkpoint or a bert-jax workdir "
      "(or its checkpoints/<step>)")


def _read_hf_like(path: str, kind: str) -> Source:
  """config, vocabulary and lowercasing of a HF or TF directory, with convert's readers."""
  names = ("config.json",) if kind == "huggingface" else ("bert_config.json", "config.json")
  config_path = next((os.path.join(path, n) for n in names
                      if os.path.isfile(os.path.join(path, n))), os.path.join(path, names[0]))
  hf_config = sources.read_json(config_path, "model config")
  config = hf_families.for_hf_config(hf_config).config_from_hf(hf_config, config_path)
  # vocab.txt, tokenizer.json (WordPiece or BPE: transformers 5 saves only this) or both.
  tokenizer, lower_from = sources.read_hf_tokenizer(path, hf_config, config, config_path)
  return Source(path, kind, config, tokenizer, lower_from)


def _read_bert_jax(path: str) -> Source:
  params, meta = checkpointing.restore_params(path)
  for field in ("model_config", "vocab", "lowercase"):
    if field not in meta:
      raise ConfigError(f"checkpoint meta has no {field!r}; expected a checkpoint written by "
                        "train.py or bert_jax.io.convert")
  config = dataclasses.replace(ModelConfig.from_dict(meta["model_config"]), dtype="float32")
  tokenizer = bpe.from_meta(meta, source="checkpoint meta vocab")
  return Source(path, "bert-jax", config.validate(), tokenizer,
                meta.get("lowercase_from", "the checkpoint's meta"), meta.get("heads"),
                meta.get("step"), params)


def resolve(s: Settings) -> Source:
  """The source of `s.init.path`, checked against the run's config; one error line if not."""
  path = _local_unless_checkpoint(s.init.path)
  kind = _kind(path)
  if kind == "tensorflow" and importlib.util.find_spec("tensorflow") is None:
    raise ConfigError(f"{_flag(path)} is a google-research/bert TensorFlow checkpoint; reading "
                      "it needs TensorFlow, which is not installed (pip install tensorflow-cpu)")
  try:
    source = _read_bert_jax(path) if kind == "bert-jax" else _read_hf_like(path, kind)
    # The whole source, before any data is prepared or folder made (not at step 0).
    if kind == "bert-jax":
      source_check.check_params(source._params, source.config, path)
    else:
      hf_families.of(source.config).check_source(path, kind, source.config, source.hf_state)
    if s.init.extend_vocab and (not family.of(source.config).extend_vocab
                                or isinstance(source.tokenizer, bpe.BpeTokenizer)):
      raise ConfigError("--config.data.extend_vocab with a ModernBERT or BPE source: not "
                        "supported yet (WordPiece BERT sources only); expected 0")
  except BertJaxError as e:
    raise ConfigError(f"{_flag(path)}: {e}") from None
  theirs = {f"model.{k}": getattr(source.config, k) for k in SOURCE_MODEL_FIELDS}
  theirs["data.lowercase"] = source.tokenizer.lowercase
  kind = bpe.KIND if isinstance(source.tokenizer, bpe.BpeTokenizer) else "wordpiece"
  theirs.update({"data.tokenizer": kind, "data.vocab_size": source.tokenizer.vocab_size})
  for field, ours in s.init.overrides:
    if theirs[field] != ours:
      raise ConfigError(
          f"--config.{field}={ours!r} contradicts {_flag(path)}, whose model has "
          f"{field.split('.')[-1]}={theirs[field]!r}; expected {theirs[field]!r}, or the field "
          "unset (a continued run takes its shape, vocabulary and lowercasing from the source)")
  # A config file's vocabulary settings (not a flag's: refused above) are said, not used.
  unused = [f"data.{k}={getattr(s.data, k)!r}" for k in SOURCE_DATA_FIELDS
            if getattr(s.data, k) != theirs[f"data.{k}"]
            and f"data.{k}" not in dict(s.init.overrides)]
  if unused:
    console.log(f"init_from: the config's {' and '.join(unused)} not used: the vocabulary "
                f"is the source's ({kind}, {source.tokenizer.vocab_size} tokens)")
  longest, positions = max(s.train.seq_lens), source.config.max_position_embeddings
  if longest > positions:
    raise ConfigError(f"--config.train.seq_lens={tuple(s.train.seq_lens)}: {longest} is above "
                      f"the {positions} positions of {_flag(path)}; expected at most {positions}")
  return source


def run_settings(s: Settings, source: Source) -> Settings:
  """`s` with the source's model shape and numerics; the rest stays the config's."""
  fields = {k: getattr(source.config, k) for k in SOURCE_MODEL_FIELDS}
  return dataclasses.replace(s, model=dataclasses.replace(s.model, **fields),
                             data=dataclasses.replace(s.data, lowercase=source.tokenizer.lowercase))


@contextlib.contextmanager
def data_settings(s: Settings, source: Source) -> Iterator[tuple[DataSettings, Any]]:
  """(data settings that make examples with the source's vocabulary, the extension or None).

  The (extended) vocab.txt lives in a temporary folder while the data is prepared;
  the prepared data keeps its own copy and its cache key hashes the file.
  """
  tok, ext = source.tokenizer, None
  if s.init.extend_vocab:
    docs = dataset.documents(s.data, s.run.seed, corpus.CorpusStats())
    texts = dataset.vocab_sample(docs, s.data.vocab_sample_bytes)
    ext = vocab_extension.learn(tok, texts, s.init.extend_vocab)
    console.log(f"init_from: vocabulary: {ext.describe(tok.vocab_size)}")
    tok = vocab_extension.extended_tokenizer(tok, ext)
  tmp = None
  try:
    tmp = tempfile.mkdtemp(prefix="bert_jax_init_from_")
    vocab_file = tok.save(tmp)
  except OSError as e:  # a full or read-only temporary folder: one line, nothing left there
    if tmp is not None:
      shutil.rmtree(tmp, ignore_errors=True)
    raise ConfigError(
        f"{_flag(source.path)}: cannot write the run's vocabulary ({tok.vocab_size} tokens) "
        f"to a temporary folder in {tempfile.gettempdir()} ({e.strerror}); expected a "
        "writable temporary folder with free space (or set TMPDIR to one)") from None
  try:
    yield dataclasses.replace(s.data, vocab_file=vocab_file, lowercase=tok.lowercase), ext
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


def initial_params(source: Source, config: ModelConfig, ext, seed: int) -> tuple[dict, dict]:
  """(our params as numpy for `config`, group -> 'imported' | 'initialised')."""
  state = source.hf_state()
  if ext is not None:
    state = vocab_extension.extend_hf_state(state, ext)
  params, report = hf_families.of(config).import_state(state, config, source=source.path,
                                                       heads=True, seed=seed)
  groups = dict(report.groups)
  if source.heads:  # a bert_jax.io.convert checkpoint: what its own import did
    groups = {g: ("initialised at its import" if source.heads.get(g) == "initialised" else v)
              for g, v in groups.items()}
  source.fresh_heads = tuple(g for g in (MLM, NSP) if groups.get(g, "").startswith("initial"))
  return params, groups


def initial_state(source: Source, steps, ext, seed: int) -> tuple[Any, Any]:
  """(params, fresh optimizer state) of a run's step 0, in the run's shardings."""
  params_np, groups = initial_params(source, steps.bert_config, ext, seed)
  console.log("init_from: " + "; ".join(
      f"{'encoder' if g == ENCODER else GROUP_NAMES[g]} {v}"
      + (" (not in the source)" if v == "initialised" else "") for g, v in groups.items())
      + "; optimizer state fresh, schedule from step 0")
  put = lambda x, sh: jax.make_array_from_callback(x.shape, sh, lambda idx: x[idx])
  params = jax.tree.map(put, params_np, steps.param_shardings)
  opt_state = jax.jit(steps.tx.init, out_shardings=steps.opt_shardings)(params)
  return params, opt_state


def log_start(loop, reporter, fresh_heads: tuple = ()) -> dict:
  """Evaluates (and probes) the starting model and logs it as step 0; returns the eval."""
  ev = with_stderr(loop.evaluate(loop.s.train.phases[0]))
  reporter.write("eval", 0, ev)
  console.log(f"eval @ 0 (the model of --config.init_from, before training): "
              f"{describe_eval(ev)}")
  if fresh_heads:  # e.g. a sentence-embedding model: its MLM numbers are of random weights
    heads = " and the ".join(GROUP_NAMES[g] for g in fresh_heads)
    one = len(fresh_heads) == 1
    console.warn(f"warning: --config.init_from: the {heads} of this evaluation "
                 f"{'was' if one else 'were'} freshly initialised (not in the source), so "
                 f"{'its accuracy is' if one else 'their accuracies are'} of random weights, "
                 "not of the source")
  loop.probe(0, loop.s.train.phases[0])
  return ev
