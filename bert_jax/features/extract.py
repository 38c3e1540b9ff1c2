"""Feature extraction: hidden states and pooled vectors from a checkpoint.

Restores only the params of a bert-jax checkpoint (trained by train.py or
imported by bert_jax.io.convert), on whatever devices this machine has, and runs
the encoder over texts in batches sharded over the data axis of `sharding`'s mesh:

  ex = Extractor.from_checkpoint("runs/tiny", max_length=128)
  f = ex.extract(["a sentence", "first half\tsecond half"], layers=(-4, -3, -2, -1),
                 pooling="mean")
  f.pooled_NxYxD            # float32 [N, 4, D], row i = input i

Each input is a text or an `A<TAB>B` pair, encoded as `[CLS] A [SEP] (B [SEP])`
with segment ids 0 / 1. Layer indices follow BERT's extract_features:
hidden_states[0] is the embedding output, 1..num_layers the Transformer layers,
-1 the last layer, (-4, -3, -2, -1) the last four, "all" every one (0..num_layers).

Poolings: "cls" the [CLS] vector, "mean" the average over real tokens
([CLS]/[SEP] included, padding excluded), "pooler" the model's tanh pooled output
(last layer only), "none" every real token.

The command line (`python -m bert_jax.features --help`, reading the input file and
writing .npy/.npz outputs) is bert_jax.commands.features, run by `python -m bert_jax.features`.

This module never imports the optimizer or the trainer.

Shape legend: N inputs, B batch, L padded length (a bucket), T real tokens of
one input, Y selected layers, D hidden size.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from tqdm import tqdm

from bert_jax.parallel import sharding
from bert_jax.features import restore
from bert_jax.io import checkpointing
from bert_jax.errors import CheckpointError, ConfigError
from bert_jax.settings.model import ModelConfig
from bert_jax.model import precision
from bert_jax.model.build import encoder_model
from bert_jax.data.tokenizer import Tokenizer

POOLINGS = ("cls", "mean", "pooler", "none")
DTYPES = ("float32", "bfloat16")
# Padded lengths: every length in a bucket shares one compiled program.
_MIN_BUCKET = 16
# Shorter runs finish before a progress bar would tell anything.
_PROGRESS_MIN_BATCHES = 10

Input = Union[str, tuple[str, str]]


def _warn(msg: str) -> None:
  print(f"warning: {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------
# Encoding (numpy only)


def trim_pair_from_end(a: list, b: list, max_tokens: int) -> None:
  """Trims the longer list from its end until both fit: run_classifier.py's rule for
  inference (pre-training data trims at random ends: data/pretraining_data.truncate_seq_pair)."""
  while len(a) + len(b) > max_tokens:
    (a if len(a) > len(b) else b).pop()


def buckets(max_length: int) -> tuple[int, ...]:
  """Padded lengths 16, 32, 64, ... below max_length, then max_length itself."""
  out, b = [], _MIN_BUCKET
  while b < max_length:
    out.append(b)
    b *= 2
  return tuple(out) + (max_length,)


@dataclasses.dataclass
class Encoded:
  ids: list[list[int]]  # [CLS] A [SEP] (B [SEP]) per input
  segments: list[list[int]]
  num_truncated: int


def encode(tokenizer: Tokenizer, inputs: Sequence[Input], max_length: int) -> Encoded:
  """Word-piece ids with specials; inputs longer than max_length are truncated."""
  firsts, seconds = [], []
  for i, x in enumerate(inputs):
    if isinstance(x, str):
      a, tab, b = x.partition("\t")
      firsts.append(a)
      seconds.append(b if tab else None)
    elif isinstance(x, (tuple, list)) and len(x) == 2 and all(isinstance(s, str) for s in x):
      firsts.append(x[0])
      seconds.append(x[1])
    else:
      raise ConfigError(f"inputs[{i}]={x!r:.60}: expected a text or an (A, B) pair of texts")
  ids_a = tokenizer.encode_batch(firsts)
  pair_rows = [i for i, b in enumerate(seconds) if b is not None]
  ids_b = dict(zip(pair_rows, tokenizer.encode_batch([seconds[i] for i in pair_rows])))
  cls, sep = tokenizer.cls_id, tokenizer.sep_id
  out_ids, out_segments, truncated = [], [], 0
  for i, a in enumerate(ids_a):
    if i in ids_b:
      b = ids_b[i]
      before = len(a) + len(b)
      trim_pair_from_end(a, b, max_length - 3)
      truncated += len(a) + len(b) < before
      out_ids.append([cls] + a + [sep] + b + [sep])
      out_segments.append([0] * (len(a) + 2) + [1] * (len(b) + 1))
    else:
      truncated += len(a) > max_length - 2
      a = a[:max_length - 2]
      out_ids.append([cls] + a + [sep])
      out_segments.append([0] * (len(a) + 2))
  return Encoded(out_ids, out_segments, truncated)


# ----------------------------------------------------------------------------
# Results


@dataclasses.dataclass
class Features:
  """What `Extractor.extract` returns; every list and row is in input order."""
  layers: tuple[int, ...]  # absolute indices: 0 = embeddings, num_layers = last
  pooling: str
  lengths_N: np.ndarray  # int64, real tokens per input ([CLS]/[SEP] included)
  tokens: list[list[str]]  # word pieces per input
  token_ids: list[np.ndarray]  # int32 [T] per input
  segment_ids: list[np.ndarray]  # int32 [T] per input
  pooled_NxYxD: Optional[np.ndarray]  # float32, None when pooling == "none"
  hidden_TxYxD: Optional[list[np.ndarray]]  # float32 per input, only when pooling == "none"
  num_truncated: int  # inputs cut to max_length
  seconds: float  # wall time of extract (compilation included)
  num_compiled: int  # programs compiled by this call (one per new shape bucket)

  @property
  def sequences_per_s(self) -> float:
    return len(self.tokens) / max(self.seconds, 1e-9)

  @property
  def tokens_per_s(self) -> float:
    return float(self.lengths_N.sum()) / max(self.seconds, 1e-9)

  def throughput(self) -> str:
    """One line: sequences/s and tokens/s (real tokens, padding excluded)."""
    return (f"{len(self.tokens)} sequences ({int(self.lengths_N.sum())} tokens) in "
            f"{self.seconds:.2f} s: {self.sequences_per_s:.1f} sequences/s, "
            f"{self.tokens_per_s:.0f} tokens/s ({self.num_compiled} shapes compiled)")


# ----------------------------------------------------------------------------
# Extractor


def _layer_range(num_layers: int) -> str:
  return (f"expected -{num_layers + 1}..{num_layers} "
          f"(0 = embeddings, {num_layers} or -1 = last of {num_layers} layers)")


def resolve_layers(layers: Sequence[int] | str, num_layers: int) -> tuple[int, ...]:
  """Negative indices count from the last layer; returns absolute indices.

  "all" is every layer: 0 (the embeddings) to num_layers.
  """
  if isinstance(layers, str):
    if layers.strip().lower() != "all":
      raise ConfigError(f"layers: {layers!r} is not 'all' or integers; {_layer_range(num_layers)}"
                        " or 'all'")
    return tuple(range(num_layers + 1))
  if isinstance(layers, int):
    layers = (layers,)
  layers = tuple(layers)
  if not layers:
    raise ConfigError(f"layers: none given; {_layer_range(num_layers)}")
  out = []
  for l in layers:
    if not isinstance(l, (int, np.integer)) or isinstance(l, bool):
      raise ConfigError(f"layers: {l!r} is not an integer; {_layer_range(num_layers)}")
    if not -(num_layers + 1) <= l <= num_layers:
      raise ConfigError(f"layers: {l} is out of range; {_layer_range(num_layers)}")
    out.append(int(l) % (num_layers + 1))
  return tuple(out)


class Extractor:
  """A BertModel with restored params, jitted once per padded length."""

  def __init__(self, params: Any, config: ModelConfig, tokenizer: Tokenizer, *,
               dtype: str = "float32", max_length: Optional[int] = None,
               batch_size: int = 32, devices: Optional[Sequence[Any]] = None,
               mesh: Optional[Mesh] = None, attention_kernel: str = "einsum",
               cpu_forward_dots: Optional[str] = None):
    """`params` is the BertModel tree (a pre-training tree's params["bert"]).

    `batch_size` is rounded up to a multiple of the data-parallel device count.
    With `mesh` (a training run's, over every process's devices) the parameters
    stay as they are sharded there (replicated or FSDP), every process passes
    the same inputs, and every process gets every feature (multi-host probes).
    `attention_kernel` is ModelConfig's ('cudnn': cuDNN's fused attention on a GPU), and
    so is `cpu_forward_dots` (None: the config's).
    """
    if dtype not in DTYPES:
      raise ConfigError(f"dtype={dtype!r}: expected one of {', '.join(DTYPES)}")
    config.validate()
    if tokenizer.vocab_size != config.vocab_size:
      raise CheckpointError(f"vocabulary has {tokenizer.vocab_size} tokens but the model "
                            f"config has vocab_size={config.vocab_size}")
    max_length = config.max_position_embeddings if max_length is None else max_length
    if not isinstance(max_length, int) or max_length < 3:
      raise ConfigError(f"max_length={max_length!r}: expected an integer >= 3 "
                        "([CLS] A [SEP] B [SEP] needs 3 special tokens)")
    if max_length > config.max_position_embeddings:
      raise ConfigError(f"max_length={max_length} is above the checkpoint's "
                        f"max_position_embeddings={config.max_position_embeddings}; "
                        "expected at most that")
    if not isinstance(batch_size, int) or batch_size <= 0:
      raise ConfigError(f"batch_size={batch_size!r}: expected a positive integer")
    self._keep_sharding = mesh is not None
    self.mesh = mesh if mesh is not None else sharding.make_mesh(
        1, list(jax.devices() if devices is None else devices))
    data = self.mesh.shape[sharding.DATA]
    self.batch_size = -(-batch_size // data) * data
    self.max_length = max_length
    self.buckets = buckets(max_length)
    self.tokenizer = tokenizer
    # Inference: no dropout, no rematerialisation; parameters stay float32.
    self.config = dataclasses.replace(config, dtype=dtype, dropout_rate=0.0,
                                      attention_dropout_rate=0.0, remat=False,
                                      attention_kernel=attention_kernel,
                                      cpu_forward_dots=cpu_forward_dots
                                      or config.cpu_forward_dots).validate()
    self._model = encoder_model(self.config)
    self._replicated = sharding.replicated(self.mesh)
    self._batch_sharding = sharding.batch_sharding(self.mesh)
    # Features come back replicated on a training mesh: each process reads all of them.
    self._out_sharding = self._replicated if self._keep_sharding else self._batch_sharding
    self.params = None
    self.step: Optional[int] = None  # the checkpoint step, when restored from one
    self.set_params(params)
    self._compiled: dict = {}

  @classmethod
  def from_checkpoint(cls, path: str, step: Optional[int] = None, dtype: str = "float32",
                      max_length: Optional[int] = None, batch_size: int = 32,
                      expect_config: Optional[Mapping[str, Any]] = None,
                      devices: Optional[Sequence[Any]] = None,
                      attention_kernel: str = "einsum",
                      cpu_forward_dots: Optional[str] = None) -> Extractor:
    """Restores params (never the optimizer state) of a workdir, checkpoints/ or step dir.

    `expect_config` (e.g. {"num_layers": 12}) must match the checkpoint's
    model config field by field.
    """
    devices = list(jax.devices() if devices is None else devices)
    params, config, tokenizer, meta = restore.load_checkpoint(path, step, expect_config, devices)
    ex = cls(params, config, tokenizer, dtype=dtype, max_length=max_length,
             batch_size=batch_size, devices=devices, attention_kernel=attention_kernel,
             cpu_forward_dots=cpu_forward_dots)
    ex.step = meta.get(checkpointing.RESTORED_STEP)  # a live workdir moves on: say which
    return ex

  def set_params(self, params: Any) -> None:
    """New parameters of the same shapes (e.g. a training run's current ones).

    `params` is the BertModel tree (a pre-training tree's params["bert"]); the
    programs compiled so far stay valid. On a training mesh they are used where
    they are (no copy, no transfer to the host).
    """
    self.params = params if self._keep_sharding else jax.device_put(params, self._replicated)

  # --- compiled programs ---

  @property
  def compiled_shapes(self) -> list[tuple]:
    """(padded length, layers, pooling) of every program compiled so far."""
    return sorted(self._compiled)

  def _program(self, length: int, layers: tuple[int, ...], pooling: str):
    key = (length, layers, pooling)
    if key in self._compiled:
      return self._compiled[key], False
    model = self._model

    def run(params, ids_BxL, segments_BxL, mask_BxL):
      out = model.apply({"params": params}, ids_BxL, segments_BxL, mask_BxL,
                        deterministic=True, output_hidden_states=pooling != "pooler")
      if pooling == "pooler":
        return out.pooled_BxD[:, None].astype(jnp.float32)
      h_BxLxYxD = jnp.stack([out.hidden_states[l] for l in layers], axis=2).astype(jnp.float32)
      if pooling == "none":
        return h_BxLxYxD
      if pooling == "cls":
        return h_BxLxYxD[:, 0]
      m_BxL = mask_BxL.astype(jnp.float32)
      n_B = jnp.maximum(m_BxL.sum(axis=1), 1.0)  # all-padding filler rows stay finite
      return jnp.einsum("blyd,bl->byd", h_BxLxYxD, m_BxL) / n_B[:, None, None]

    bs = self._batch_sharding
    param_shardings = jax.tree.map(lambda x: x.sharding, self.params)
    batch = jax.ShapeDtypeStruct((self.batch_size, length), jnp.int32, sharding=bs)
    compiled = jax.jit(run, in_shardings=(param_shardings, bs, bs, bs),
                       out_shardings=self._out_sharding).lower(
        self.params, batch, batch, batch).compile(precision.forward_compiler_options(
            self.config.cpu_forward_dots, self.config.dtype))
    self._compiled[key] = compiled
    return compiled, True

  # --- extraction ---

  def _check_request(self, inputs: Sequence[Input], layers: Sequence[int],
                     pooling: str) -> tuple[tuple[int, ...], list[Input]]:
    """(absolute layers, inputs as a list), or a one-line ConfigError."""
    if pooling not in POOLINGS:
      raise ConfigError(f"pooling={pooling!r}: expected one of {', '.join(POOLINGS)}")
    layers = resolve_layers(layers, self.config.num_layers)
    if pooling == "pooler" and layers != (self.config.num_layers,):
      raise ConfigError(f"layers={layers}: pooling 'pooler' is the tanh pooled output of the "
                        "last layer; expected layers -1")
    if isinstance(inputs, str):
      raise ConfigError("inputs: expected a list of texts, got one string")
    inputs = list(inputs)
    if not inputs:
      raise ConfigError("inputs: empty; expected at least one text")
    return layers, inputs

  def _plan_batches(self, lengths_N: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """(padded length, input rows) per batch: rows of one bucket, shortest first."""
    bucket_N = np.asarray(self.buckets)[np.searchsorted(self.buckets, lengths_N)]
    # Sorting by length keeps padding low; results are scattered back by index.
    order = np.argsort(lengths_N, kind="stable")
    B = self.batch_size
    batches = []
    for L in self.buckets:
      rows = order[bucket_N[order] == L]
      batches += [(L, rows[i:i + B]) for i in range(0, len(rows), B)]
    return batches

  def _padded_batch(self, enc: Encoded, rows: np.ndarray, lengths_N: np.ndarray,
                    L: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, segments, mask) int32 [B, L] of `rows`; filler rows stay all padding."""
    B = self.batch_size
    ids_BxL = np.zeros((B, L), np.int32)
    segments_BxL = np.zeros((B, L), np.int32)
    mask_BxL = np.zeros((B, L), np.int32)
    for j, r in enumerate(rows):
      T = lengths_N[r]
      ids_BxL[j, :T] = enc.ids[r]
      segments_BxL[j, :T] = enc.segments[r]
      mask_BxL[j, :T] = 1
    return ids_BxL, segments_BxL, mask_BxL


  def _global(self, x_BxL: np.ndarray) -> jax.Array:
    # The same host batch on every process; each places the rows of its devices.
    return jax.make_array_from_callback(x_BxL.shape, self._batch_sharding,
                                        lambda index: x_BxL[index])

  def extract(self, inputs: Sequence[Input], layers: Sequence[int] | str = (-1,),
              pooling: str = "cls", progress: Optional[bool] = None) -> Features:
    """Features of `inputs` (texts, `A<TAB>B` strings or (A, B) tuples), in input order.

    pooled_NxYxD[i, j] is input i at layers[j] (layers="all": 0..num_layers, the
    embeddings first); with pooling "none",
    hidden_TxYxD[i] holds its T real tokens instead. Inputs longer than
    max_length are truncated (longer side of a pair first) and counted in a
    one-line warning. `progress` None shows a bar (stderr) on long inputs.
    """
    start = time.perf_counter()
    layers, inputs = self._check_request(inputs, layers, pooling)
    enc = encode(self.tokenizer, inputs, self.max_length)
    if enc.num_truncated:
      _warn(f"{enc.num_truncated} of {len(inputs)} inputs were longer than "
            f"max_length={self.max_length} tokens and were truncated")
    lengths_N = np.array([len(x) for x in enc.ids], np.int64)
    batches = self._plan_batches(lengths_N)

    Y, D = len(layers), self.config.hidden_size
    pooled = None if pooling == "none" else np.zeros((len(inputs), Y, D), np.float32)
    hidden: list = [None] * len(inputs) if pooling == "none" else None
    show = len(batches) >= _PROGRESS_MIN_BATCHES if progress is None else progress
    bar = tqdm(total=len(inputs), unit="seq", file=sys.stderr, disable=not show,
               dynamic_ncols=True)
    num_compiled = 0

    def collect(rows, out):
      # A replicated output spans other processes' devices: read this process's copy.
      out = np.asarray(out.addressable_data(0) if out.is_fully_replicated else jax.device_get(out))
      if pooled is not None:
        pooled[rows] = out[:len(rows)]
      else:
        for j, r in enumerate(rows):
          hidden[r] = out[j, :lengths_N[r]].copy()
      bar.update(len(rows))

    pending = None
    try:
      for L, rows in batches:
        fn, new = self._program(L, layers, pooling)
        num_compiled += new
        out = fn(self.params, *map(self._global, self._padded_batch(enc, rows, lengths_N, L)))
        # Dispatch is asynchronous: copy the previous batch out while this one runs.
        if pending is not None:
          collect(*pending)
        pending = (rows, out)
      if pending is not None:
        collect(*pending)
    finally:
      bar.close()

    return Features(
        layers=layers, pooling=pooling, lengths_N=lengths_N,
        tokens=[self.tokenizer.convert_ids_to_tokens(x) for x in enc.ids],
        token_ids=[np.asarray(x, np.int32) for x in enc.ids],
        segment_ids=[np.asarray(x, np.int32) for x in enc.segments],
        pooled_NxYxD=pooled, hidden_TxYxD=hidden, num_truncated=enc.num_truncated,
        seconds=time.perf_counter() - start, num_compiled=num_compiled)
