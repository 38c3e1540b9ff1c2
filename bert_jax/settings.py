"""The typed boundary: an `ml_collections` config becomes frozen settings, once.

`from_config` is the only code of the package that reads a ConfigDict. Every
check of a config value lives here and fails with one line naming the
`--config.` field and what was expected, before anything is written. Lower modules
take the settings they need (`DataSettings`, `OptimizerSettings`, a `BertConfig`),
never the whole config.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import ml_collections

from bert_jax import default_config
from bert_jax.data import corpus, pretraining_data
from bert_jax.errors import ConfigError
from bert_jax.storage.retries import check_path
from bert_jax.options import wsd_decay_start
from bert_jax.options import (  # noqa: F401  (re-exported: settings' names)
    PROBE_POOLINGS, BatchRampSettings, ProbeSettings, ProfileSettings, SpikeSettings,
    fail as _fail, is_int as _is_int, positive_int as _positive_int)
from bert_jax.model.config import BertConfig

MIN_SEQ_LEN = 8  # [CLS] a [SEP] b [SEP] plus room to mask something
# `config.train.optimizer`; optim.make_optimizer builds them. 'stable_adamw': AdamW with
# StableAdamW's per-tensor update clipping (ModernBERT's optimizer).
OPTIMIZERS = ("adamw", "lamb", "stable_adamw")
SCHEDULES = ("linear", "cosine", "wsd", "inverse_sqrt")  # `config.train.schedule` (train/schedules)
DECAY_SHAPES = ("linear", "cosine", "sqrt")  # `config.train.decay_shape`, of a wsd schedule
TOKENIZERS = ("wordpiece", "bpe")  # `config.data.tokenizer`: the kind of a trained vocabulary (data/bpe)


@dataclasses.dataclass(frozen=True)
class DataSettings:
  """What data preparation reads (`config.data`, and `config.objective`)."""
  corpus: str = "builtin"
  format: str = "auto"
  vocab_file: str = ""
  vocab_size: int = 30522
  vocab_sample_bytes: int = 100_000_000
  lowercase: bool = True
  tokenizer: str = "wordpiece"  # a trained vocabulary's kind (TOKENIZERS)
  short_seq_prob: float = 0.1
  dupe_factor: int = 5
  eval_dupe_factor: int = 0  # 0 = dupe_factor
  eval_fraction: float = 0.05
  max_eval_examples: int = 2048
  max_documents: int = 0
  cache_dir: str = ""
  num_workers: int = 0  # 0 = the host's usable cores; not part of the data's key
  streams: int = 1  # example streams (parts p with p % streams == s): how batches are drawn
  objective: str = "mlm+nsp"  # `config.objective`: which examples are made
  packing: bool = False  # 'mlm' rows hold several documents' spans (data/packing)

  @property
  def eval_passes(self) -> int:
    """Passes over the eval documents, each with fresh pairs and split points."""
    return self.eval_dupe_factor or self.dupe_factor

  def __post_init__(self):
    if self.objective not in pretraining_data.OBJECTIVES:
      raise _fail("objective", self.objective,
                  f"one of {', '.join(map(repr, pretraining_data.OBJECTIVES))}")
    if self.packing not in (True, False) or (self.packing and self.objective != "mlm"):
      raise _fail("data.packing", self.packing, "True only with --config.objective='mlm' (a "
                  "row of NSP/SOP is one sentence pair: nothing to pack), or False")
    if not 0.0 < self.eval_fraction < 1.0:
      raise _fail("data.eval_fraction", self.eval_fraction, "a fraction in (0, 1)")
    if self.max_eval_examples < 0:
      raise _fail("data.max_eval_examples", self.max_eval_examples, ">= 0 (0 = no cap)")
    if self.dupe_factor < 1:
      raise _fail("data.dupe_factor", self.dupe_factor, ">= 1")
    if not _is_int(self.eval_dupe_factor) or self.eval_dupe_factor < 0:
      raise _fail("data.eval_dupe_factor", self.eval_dupe_factor, ">= 0 (0 = data.dupe_factor)")
    if not 0.0 <= self.short_seq_prob <= 1.0:
      raise _fail("data.short_seq_prob", self.short_seq_prob, "a probability in [0, 1]")
    if self.max_documents < 0:
      raise _fail("data.max_documents", self.max_documents, ">= 0 (0 = all)")
    if not _is_int(self.num_workers) or self.num_workers < 0:
      raise _fail("data.num_workers", self.num_workers, ">= 0 (0 = this host's cores)")
    if not _is_int(self.streams) or self.streams < 1:
      raise _fail("data.streams", self.streams, "an integer >= 1")
    if self.format not in corpus.FORMATS:
      raise _fail("data.format", self.format, f"one of {', '.join(corpus.FORMATS)}")
    if self.tokenizer not in TOKENIZERS:
      raise _fail("data.tokenizer", self.tokenizer, f"one of {', '.join(map(repr, TOKENIZERS))}")
    if self.vocab_sample_bytes < 1:
      raise _fail("data.vocab_sample_bytes", self.vocab_sample_bytes, ">= 1")
    if not self.vocab_file and self.vocab_size < 1:
      raise _fail("data.vocab_size", self.vocab_size, "a positive integer")
    v = self.vocab_file  # one in a bucket is checked when it is copied to this host
    if v and not v.startswith("gs://") and not os.path.isfile(v):
      raise ConfigError(f"--config.data.vocab_file: '{v}' " + ("is a directory" if os.path.isdir(
          v) else "does not exist or is not a file") + "; expected a vocab.txt file (one token "
          "per line, or a HuggingFace tokenizer.json)")

  @property
  def is_bpe(self) -> bool:  # a tokenizer.json given, or a vocabulary trained as 'bpe'
    return self.vocab_file.endswith(".json") if self.vocab_file else self.tokenizer == "bpe"


@dataclasses.dataclass(frozen=True)
class MaskingSettings:
  """`config.masking`: the share of tokens chosen, and whole-word masking."""
  mask_prob: float = 0.15
  whole_word: bool = False

  def __post_init__(self):
    if not 0.0 < self.mask_prob < 1.0:
      raise _fail("masking.mask_prob", self.mask_prob, "0 < p < 1")


@dataclasses.dataclass(frozen=True)
class OptimizerSettings:
  """What the optimizer reads (from `config.train`)."""
  learning_rate: float = 1e-4
  warmup_steps: int = 10_000
  num_steps: int = 1_000_000
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-6
  weight_decay: float = 0.01
  max_grad_norm: float = 1.0
  optimizer: str = "adamw"  # or "lamb"
  schedule: str = "linear"  # SCHEDULES
  decay_fraction: float = 0.1  # wsd: the final share of num_steps that decays
  decay_shape: str = "linear"  # wsd: DECAY_SHAPES
  min_lr_ratio: float = 0.0  # cosine, wsd: where the decay ends, as a share of the peak

  def __post_init__(self):
    if self.optimizer not in OPTIMIZERS:
      raise _fail("train.optimizer", self.optimizer, f"one of {', '.join(map(repr, OPTIMIZERS))}")
    _positive_int("train.num_steps", self.num_steps)
    if not _is_int(self.warmup_steps) or self.warmup_steps < 0:
      raise _fail("train.warmup_steps", self.warmup_steps, "an integer >= 0")
    self._check_schedule()
    # NaN compares false everywhere, so every check is written to fail on it.
    if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
      raise _fail("train.learning_rate", self.learning_rate, "a finite number > 0")
    for name in ("b1", "b2"):
      if not 0.0 <= getattr(self, name) < 1.0:
        raise _fail(f"train.{name}", getattr(self, name), "0 <= value < 1")
    if not (math.isfinite(self.eps) and self.eps > 0):
      raise _fail("train.eps", self.eps, "a finite number > 0")
    if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
      raise _fail("train.weight_decay", self.weight_decay, "a finite number >= 0")
    if not (math.isfinite(self.max_grad_norm) and self.max_grad_norm >= 0):
      raise _fail("train.max_grad_norm", self.max_grad_norm,
                  "a finite number >= 0 (0 = no clipping)")


  def _check_schedule(self) -> None:
    if self.schedule not in SCHEDULES:
      raise _fail("train.schedule", self.schedule, f"one of {', '.join(map(repr, SCHEDULES))}")
    if self.decay_shape not in DECAY_SHAPES:
      raise _fail("train.decay_shape", self.decay_shape,
                  f"one of {', '.join(map(repr, DECAY_SHAPES))}")
    if not (isinstance(self.decay_fraction, (int, float)) and 0.0 < self.decay_fraction <= 1.0):
      raise _fail("train.decay_fraction", self.decay_fraction, "0 < fraction <= 1")
    if not (isinstance(self.min_lr_ratio, (int, float)) and 0.0 <= self.min_lr_ratio < 1.0):
      raise _fail("train.min_lr_ratio", self.min_lr_ratio, "0 <= ratio < 1 (of the peak)")
    if self.schedule == "inverse_sqrt" and self.warmup_steps <= 0:
      raise _fail("train.warmup_steps", self.warmup_steps, "> 0 with schedule='inverse_sqrt'")
    start = wsd_decay_start(self.num_steps, self.decay_fraction)
    if self.schedule == "wsd" and start < self.warmup_steps:
      raise _fail("train.decay_fraction", self.decay_fraction, f"a share whose decay starts "
                  f"after the warm-up ({self.warmup_steps} of {self.num_steps} steps)")
    if self.schedule == "wsd" and start >= self.num_steps:
      raise _fail("train.decay_fraction", self.decay_fraction, f"a share that decays over at "
                  f"least 1 of the {self.num_steps} steps (it rounds to 0 decay steps; at "
                  f"least {1 / self.num_steps:.3g})")


@dataclasses.dataclass(frozen=True)
class Phase:
  """Steps [start, end) train at one sequence length."""
  index: int
  start: int  # first step (inclusive)
  end: int  # last step (exclusive)
  seq_len: int
  max_predictions: int


@dataclasses.dataclass(frozen=True)
class TrainSettings:
  """The rest of `config.train`: batch, accumulation, phases, the NaN/inf limit."""
  batch_size: int
  grad_accum_steps: int
  max_consecutive_nonfinite: int
  phases: tuple[Phase, ...]
  spike: SpikeSettings = SpikeSettings()
  ramp: BatchRampSettings = BatchRampSettings()

  @property
  def num_steps(self) -> int:
    return self.phases[-1].end

  @property
  def seq_lens(self) -> list[int]:
    return sorted({ph.seq_len for ph in self.phases})


@dataclasses.dataclass(frozen=True)
class MeshSettings:
  model_parallel: int = 1
  param_sharding: str = "replicated"

  def __post_init__(self):
    _positive_int("mesh.model_parallel", self.model_parallel)
    if self.param_sharding not in ("replicated", "fsdp"):
      raise _fail("mesh.param_sharding", self.param_sharding, "'replicated' or 'fsdp'")


@dataclasses.dataclass(frozen=True)
class RunSettings:
  """Bookkeeping: seed, how often to log / evaluate / checkpoint."""
  seed: int = 0
  log_every: int = 100
  eval_every: int = 10_000
  eval_batches: int = 0
  checkpoint_every: int = 10_000
  keep_checkpoints: int = 3
  progress_bar: bool = True
  compile_cache_dir: str = ""  # JAX persistent compilation cache ('' = off)
  watchdog_s: float = 0.0  # train/watchdog: no step for this long dumps the stacks (0 = off)
  watchdog_exit: bool = False  # and then exits with status 3
  straggler_factor: float = 3.0  # train/stragglers: name a process waiting this x the median

  def __post_init__(self):
    for name in ("log_every", "eval_every", "checkpoint_every", "keep_checkpoints"):
      _positive_int(name, getattr(self, name))
    if not (isinstance(self.straggler_factor, (int, float)) and (
        self.straggler_factor == 0 or 1 < self.straggler_factor < float("inf"))):
      raise _fail("straggler_factor", self.straggler_factor, "0 (off) or a number > 1")
    if not (isinstance(self.watchdog_s, (int, float)) and 0 <= self.watchdog_s < float("inf")
            and (self.watchdog_s == 0 or self.watchdog_s >= MIN_WATCHDOG_S)):
      raise _fail("watchdog_s", self.watchdog_s, f"0 (off) or seconds >= {MIN_WATCHDOG_S:g} "
                  "(a shorter wait fires between healthy steps; the watchdog is for hangs of "
                  "minutes)")
    if not _is_int(self.eval_batches) or self.eval_batches < 0:
      raise _fail("eval_batches", self.eval_batches, "an integer >= 0 (0 = the whole eval split)")


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
  config file or a --config flag set; each must then equal the source's value.
  """
  path: str = ""
  extend_vocab: int = 0
  overrides: tuple = ()  # ((field, value), ...)


def _init_settings(c: ml_collections.ConfigDict, data: dict) -> InitSettings:
  path = c.get("init_from", "")
  extend = data.pop("extend_vocab", 0)
  if not isinstance(path, str):
    raise _fail("init_from", path, "a path (a HuggingFace or TF BERT directory, a bert_jax."
                "convert checkpoint or a bert-jax workdir), or '' to start from scratch")
  if not _is_int(extend) or extend < 0:
    raise _fail("data.extend_vocab", extend, "an integer >= 0 (0 = off)")
  if extend and not path:
    raise _fail("data.extend_vocab", extend, "0 without --config.init_from (a trained "
                "vocabulary has no source vocabulary to extend)")
  if path and data.get("vocab_file"):
    raise ConfigError(f"--config.data.vocab_file={data['vocab_file']!r} with --config.init_from="
                      f"{path!r}: expected only one of them (the source's vocab.txt is the "
                      "vocabulary of a continued run)")
  shipped = default_config.get_config()
  overrides = [(f"model.{k}", c.model[k]) for k in SOURCE_MODEL_FIELDS
               if k in c.model and c.model[k] != shipped.model[k]]
  if data.get("lowercase", True) != shipped.data.lowercase:
    overrides.append(("data.lowercase", data["lowercase"]))
  return InitSettings(os.path.expanduser(path) if path else "", extend,
                      tuple(overrides) if path else ())


@dataclasses.dataclass(frozen=True)
class Settings:
  data: DataSettings
  masking: MaskingSettings
  model: BertConfig  # vocab_size is a placeholder until the vocabulary is known
  optimizer: OptimizerSettings
  train: TrainSettings
  mesh: MeshSettings
  run: RunSettings
  config_json: str  # the whole config, stored in checkpoints for people
  requested_dtype: str = ""  # config.model.dtype as given ('auto' before resolving)
  init: InitSettings = InitSettings()  # --config.init_from ('' = from scratch)
  probe: ProbeSettings = ProbeSettings()  # config.probe (no tasks = no probes)
  profile: ProfileSettings = ProfileSettings()  # config.profile

  @property
  def objective(self) -> str:
    """`config.objective` ('mlm+nsp', 'mlm', 'mlm+sop'): the data's and the loss's."""
    return self.data.objective

  def model_config(self, vocab_size: int) -> BertConfig:
    """The model of this run once the vocabulary is known."""
    return dataclasses.replace(self.model, vocab_size=vocab_size).validate()


def phases(fractions: tuple, seq_lens: tuple, max_predictions: tuple, num_steps: int,
           max_positions: int) -> tuple[Phase, ...]:
  """Splits `num_steps` into phases by fraction (the last one ends at num_steps)."""
  fractions, seq_lens, preds = tuple(fractions), tuple(seq_lens), tuple(max_predictions)
  if not (len(fractions) == len(seq_lens) == len(preds)) or not fractions:
    raise ConfigError("--config.train.phase_fractions, seq_lens and max_predictions: expected "
                      f"tuples of one equal length, got {fractions}, {seq_lens}, {preds}")
  if any(f <= 0 for f in fractions) or abs(sum(fractions) - 1.0) > 1e-6:
    raise _fail("train.phase_fractions", fractions, "positive fractions summing to 1")
  for name, values in (("seq_lens", seq_lens), ("max_predictions", preds)):
    if not all(_is_int(v) for v in values):
      raise _fail(f"train.{name}", values, "integers, e.g. '(128,512)'")
  out, start, acc = [], 0, 0.0
  for i, (f, seq_len, p) in enumerate(zip(fractions, seq_lens, preds)):
    if seq_len > max_positions:
      raise ConfigError(f"--config.train.seq_lens[{i}]={seq_len} is above --config.model."
                        f"max_position_embeddings={max_positions}; expected at most that")
    if seq_len < MIN_SEQ_LEN or not 0 < p <= seq_len:
      raise ConfigError(f"--config.train.seq_lens[{i}]={seq_len}, max_predictions[{i}]={p}: "
                        f"expected seq_len >= {MIN_SEQ_LEN} and 0 < max_predictions <= seq_len")
    acc += f
    end = num_steps if i == len(fractions) - 1 else int(round(acc * num_steps))
    out.append(Phase(i, start, end, int(seq_len), int(p)))
    start = end
  # num_steps=0 (an evaluation of a continued run's source) keeps an empty first phase.
  return tuple(ph for ph in out if ph.end > ph.start) or tuple(out[:1])


def _fields(cls, node: ml_collections.ConfigDict, exclude: tuple = ()) -> dict:
  names = {f.name for f in dataclasses.fields(cls)} - set(exclude)
  return {k: v for k, v in node.items() if k in names}


def data_settings(config: ml_collections.ConfigDict) -> DataSettings:
  """The checked data settings of `config` alone: what `dataset.prepare` takes."""
  data = config.data.to_dict()
  data.pop("extend_vocab", None)  # read by InitSettings: it changes the vocabulary file
  return DataSettings(**data, objective=config.get("objective", "mlm+nsp"))


MIN_WATCHDOG_S = 1.0  # train/watchdog: below this, healthy steps' gaps look like hangs

def _check_model_with_recipe(c: ml_collections.ConfigDict, model: BertConfig,
                             init: "InitSettings") -> None:
  """Cross-field checks of the model against the data and recipe, before any work."""
  if c.data.get("packing", False) and model.attention_kernel == "cudnn":
    raise ConfigError("--config.data.packing=True with --config.model.attention_kernel="
                      "'cudnn': expected 'einsum' or 'jax' (cuDNN's key-length mask cannot "
                      "keep attention inside each document)")
  if model.attention_kernel == "splash" and any(l % 128 for l in c.train.seq_lens):
    raise _fail("train.seq_lens", tuple(c.train.seq_lens), "multiples of 128 with "
                "--config.model.attention_kernel='splash' (its blocks are TPU tiles of 128)")
  if model.family == "modernbert" and c.get("objective", "mlm+nsp") != "mlm":
    raise _fail("objective", c.get("objective", "mlm+nsp"), "'mlm' with --config.model.family="
                "'modernbert' (it has no next-sentence or sentence-order head)")
  if c.masking.get("whole_word", False) and data_settings(c).is_bpe:
    raise _fail("masking.whole_word", True, "False with a BPE vocabulary (whole words are "
                "found from WordPiece's '##' pieces)")
  if model.family == "bert" and model.type_vocab_size < 2 and not init.path:  # A and B alike
    raise _fail("model.type_vocab_size", model.type_vocab_size,
                ">= 2 (segment A and segment B of a sentence pair)")


# Config fields that hold a path: each a local path or a gs:// URL, checked first.
PATH_FIELDS = ("data.corpus", "data.vocab_file", "data.cache_dir", "init_from",
               "compile_cache_dir")


def _check_paths(c: ml_collections.ConfigDict) -> None:
  for name in PATH_FIELDS:
    node = c
    for part in name.split("."):
      node = node.get(part, "") if node is not None else ""
    if isinstance(node, str) and node:
      check_path(f"--config.{name}", node)


def from_config(config: ml_collections.ConfigDict) -> Settings:
  """Checks `config` and returns its typed settings; raises ConfigError naming the field."""
  c = config
  _check_paths(c)
  t = c.train
  opt_fields = _fields(OptimizerSettings, t)
  if t.num_steps == 0 and _is_int(t.num_steps):
    if not c.get("init_from", ""):
      raise _fail("train.num_steps", 0, "a positive integer (0 only with --config.init_from: "
                  "evaluate and probe the source, write its step-0 checkpoint, train nothing)")
    opt_fields["num_steps"] = 1  # built for the checkpoint's optimizer state, never stepped
  optimizer = OptimizerSettings(**opt_fields)
  if not _is_int(t.batch_size) or t.batch_size <= 0:
    raise _fail("train.batch_size", t.batch_size, "> 0")
  _positive_int("train.grad_accum_steps", t.grad_accum_steps)
  streams = c.data.get("streams", 1)
  if _is_int(streams) and streams >= 1 and t.batch_size % streams:
    raise _fail("data.streams", streams, f"a divisor of --config.train.batch_size="
                f"{t.batch_size} (each batch is one sub-batch per stream)")
  _positive_int("train.max_consecutive_nonfinite", t.max_consecutive_nonfinite)
  fields = _fields(BertConfig, c.model, exclude=("vocab_size",))
  requested_dtype = fields["dtype"]
  if requested_dtype not in ("auto", "float32", "bfloat16", "float16"):
    raise _fail("model.dtype", requested_dtype, "'auto', 'float32', 'bfloat16' or 'float16'")
  from bert_jax.model import precision  # 'auto' asks the backend: JAX only from here
  fields["dtype"] = precision.resolve_dtype(requested_dtype)
  model = BertConfig(vocab_size=1, **fields)
  data = c.data.to_dict()
  init = _init_settings(c, data)
  if not init.path:  # else the shape is the source's: bert_jax.train.init_from checks the config
    model.validate()
  _check_model_with_recipe(c, model, init)
  # A continued run's position table is its source's: bert_jax.train.init_from checks seq_lens.
  max_positions = model.max_position_embeddings if not init.path else 1 << 30
  train = TrainSettings(
      batch_size=t.batch_size, grad_accum_steps=t.grad_accum_steps,
      max_consecutive_nonfinite=t.max_consecutive_nonfinite,
      phases=phases(t.phase_fractions, t.seq_lens, t.max_predictions, t.num_steps,
                    max_positions),
      spike=SpikeSettings(**t.get("spike_rollback", ml_collections.ConfigDict()).to_dict()),
      ramp=BatchRampSettings(**t.get("batch_ramp", ml_collections.ConfigDict()).to_dict()))
  if train.ramp.start and not train.ramp.start < t.batch_size:
    raise _fail("train.batch_ramp.start", train.ramp.start,
                f"0 (off) or a global batch below --config.train.batch_size={t.batch_size}")
  run = RunSettings(**_fields(RunSettings, c))
  probe = ProbeSettings(**{k: tuple(v) if isinstance(v, list) else v
                           for k, v in c.get("probe", ml_collections.ConfigDict()).items()})
  return Settings(
      data=data_settings(c),
      masking=MaskingSettings(**c.masking.to_dict()),
      model=model, optimizer=optimizer, train=train, mesh=MeshSettings(**c.mesh.to_dict()),
      run=run, config_json=c.to_json(), requested_dtype=requested_dtype, init=init, probe=probe,
      profile=ProfileSettings(**{k: tuple(v) if isinstance(v, list) else v for k, v in
                                 c.get("profile", ml_collections.ConfigDict()).items()}))

