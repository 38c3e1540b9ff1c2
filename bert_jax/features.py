"""Feature extraction: hidden states and pooled vectors from a checkpoint.

Restores only the params of a bert-jax checkpoint (trained by train.py or
imported by bert_jax.convert), on whatever devices this machine has, and runs
the encoder over texts in batches sharded over the data axis of `sharding`'s mesh:

  ex = Extractor.from_checkpoint("runs/tiny", max_length=128)
  f = ex.extract(["a sentence", "first half\tsecond half"], layers=(-4, -3, -2, -1),
                 pooling="mean")
  f.pooled_NxYxD            # float32 [N, 4, D], row i = input i

Each input is a text or an `A<TAB>B` pair, encoded as `[CLS] A [SEP] (B [SEP])`
with segment ids 0 / 1. Layer indices follow BERT's extract_features:
hidden_states[0] is the embedding output, 1..num_layers the Transformer layers,
-1 the last layer, (-4, -3, -2, -1) the last four.

Poolings: "cls" the [CLS] vector, "mean" the average over real tokens
([CLS]/[SEP] included, padding excluded), "pooler" the model's tanh pooled output
(last layer only), "none" every real token.

CLI (`python -m bert_jax.features --help`):
  --output X.npy  pooled features: float32 [N, Y, D], row i = input line i.
  --output X.npz  per-token features (--pooling none), inputs concatenated:
    hidden       float32 [total_tokens, Y, D]
    offsets      int64 [N + 1]: line i is rows offsets[i]:offsets[i + 1]
    lengths      int64 [N]: tokens of line i ([CLS] and [SEP] included)
    tokens       str [total_tokens]: word pieces, e.g. "[CLS]", "hello", "##s"
    token_ids    int32 [total_tokens]
    segment_ids  int32 [total_tokens]: 0 for [CLS] A [SEP], 1 for B [SEP]
    layers       int32 [Y]: absolute layer indices (0 = embeddings)

This module never imports the optimizer or the trainer.

Shape legend: N inputs, B batch, L padded length (a bucket), T real tokens of
one input, Y selected layers, D hidden size.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, Optional, Union

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import checkpointing, sharding
from bert_jax.errors import BertJaxError, CheckpointError, ConfigError
from bert_jax.model import BertConfig, BertModel, abstract_params
from bert_jax.tokenizer import CLS, SEP, Tokenizer

POOLINGS = ("cls", "mean", "pooler", "none")
DTYPES = ("float32", "bfloat16")
# Padded lengths: every length in a bucket shares one compiled program.
_MIN_BUCKET = 16
# Shorter runs finish before a progress bar would tell anything.
_PROGRESS_MIN_BATCHES = 10

Input = Union[str, tuple[str, str]]


class InputFileError(BertJaxError):
  """The text file to extract features from cannot be read as inputs."""


def _warn(msg: str) -> None:
  print(f"warning: {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------
# Encoding (numpy only)


def truncate_seq_pair(a: list, b: list, max_tokens: int) -> None:
  """Trims the longer list from its end until both fit (the reference's rule)."""
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
      truncate_seq_pair(a, b, max_length - 3)
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


def resolve_layers(layers: Sequence[int], num_layers: int) -> tuple[int, ...]:
  """Negative indices count from the last layer; returns absolute indices."""
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


def _check_params(params: Any, config: BertConfig, where: str) -> None:
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


class Extractor:
  """A BertModel with restored params, jitted once per padded length."""

  def __init__(self, params: Any, config: BertConfig, tokenizer: Tokenizer, *,
               dtype: str = "float32", max_length: Optional[int] = None,
               batch_size: int = 32, devices: Optional[Sequence[Any]] = None):
    """`params` is the BertModel tree (a pre-training tree's params["bert"]).

    `batch_size` is rounded up to a multiple of the device count.
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
    devices = list(jax.devices() if devices is None else devices)
    self.mesh = sharding.make_mesh(1, devices)
    self.batch_size = -(-batch_size // len(devices)) * len(devices)
    self.max_length = max_length
    self.buckets = buckets(max_length)
    self.tokenizer = tokenizer
    # Inference: no dropout, no rematerialisation; parameters stay float32.
    self.config = dataclasses.replace(config, dtype=dtype, dropout_rate=0.0,
                                      attention_dropout_rate=0.0, remat=False)
    self._model = BertModel(self.config)
    self._replicated = sharding.replicated(self.mesh)
    self._batch_sharding = sharding.batch_sharding(self.mesh)
    self.params = jax.device_put(params, self._replicated)
    self._compiled: dict = {}

  @classmethod
  def from_checkpoint(cls, path: str, step: Optional[int] = None, dtype: str = "float32",
                      max_length: Optional[int] = None, batch_size: int = 32,
                      expect_config: Optional[Mapping[str, Any]] = None,
                      devices: Optional[Sequence[Any]] = None) -> Extractor:
    """Restores params (never the optimizer state) of a workdir, checkpoints/ or step dir.

    `expect_config` (e.g. {"num_layers": 12}) must match the checkpoint's
    model config field by field.
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
                              "checkpoint written by train.py or bert_jax.convert")
    try:
      config = BertConfig.from_dict(meta["model_config"]).validate()
    except (TypeError, ValueError) as e:
      raise CheckpointError(f"checkpoint {path}: unreadable model_config in meta ({e})") from None
    for key, want in (expect_config or {}).items():
      if key not in meta["model_config"]:
        raise ConfigError(f"expect_config: {key!r} is not a model config field "
                          f"(fields: {', '.join(sorted(meta['model_config']))})")
      if meta["model_config"][key] != want:
        raise CheckpointError(f"checkpoint {path} has model {key}={meta['model_config'][key]!r} "
                              f"but {want!r} was expected")
    if isinstance(params, Mapping) and "bert" in params:
      params = params["bert"]  # a BertForPreTraining tree: heads are not needed
    _check_params(params, config, path)
    tokenizer = Tokenizer(meta["vocab"], meta["lowercase"], source=f"checkpoint {path} vocab")
    return cls(params, config, tokenizer, dtype=dtype, max_length=max_length,
               batch_size=batch_size, devices=devices)

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

    bs, rep = self._batch_sharding, self._replicated
    batch = jax.ShapeDtypeStruct((self.batch_size, length), jnp.int32, sharding=bs)
    compiled = jax.jit(run, in_shardings=(rep, bs, bs, bs), out_shardings=bs).lower(
        self.params, batch, batch, batch).compile()
    self._compiled[key] = compiled
    return compiled, True

  # --- extraction ---

  def extract(self, inputs: Sequence[Input], layers: Sequence[int] = (-1,),
              pooling: str = "cls", progress: Optional[bool] = None) -> Features:
    """Features of `inputs` (texts, `A<TAB>B` strings or (A, B) tuples), in input order.

    pooled_NxYxD[i, j] is input i at layers[j]; with pooling "none",
    hidden_TxYxD[i] holds its T real tokens instead. Inputs longer than
    max_length are truncated (longer side of a pair first) and counted in a
    one-line warning. `progress` None shows a bar (stderr) on long inputs.
    """
    start = time.perf_counter()
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

    enc = encode(self.tokenizer, inputs, self.max_length)
    if enc.num_truncated:
      _warn(f"{enc.num_truncated} of {len(inputs)} inputs were longer than "
            f"max_length={self.max_length} tokens and were truncated")
    lengths_N = np.array([len(x) for x in enc.ids], np.int64)
    bucket_N = np.asarray(self.buckets)[np.searchsorted(self.buckets, lengths_N)]
    # Sorting by length keeps padding low; results are scattered back by index.
    order = np.argsort(lengths_N, kind="stable")
    B = self.batch_size
    batches = []
    for L in self.buckets:
      rows = order[bucket_N[order] == L]
      batches += [(L, rows[i:i + B]) for i in range(0, len(rows), B)]

    Y, D = len(layers), self.config.hidden_size
    pooled = None if pooling == "none" else np.zeros((len(inputs), Y, D), np.float32)
    hidden: list = [None] * len(inputs) if pooling == "none" else None
    show = len(batches) >= _PROGRESS_MIN_BATCHES if progress is None else progress
    from tqdm import tqdm
    bar = tqdm(total=len(inputs), unit="seq", file=sys.stderr, disable=not show,
               dynamic_ncols=True)
    num_compiled = 0

    def collect(rows, out):
      out = np.asarray(jax.device_get(out))
      if pooled is not None:
        pooled[rows] = out[:len(rows)]
      else:
        for j, r in enumerate(rows):
          hidden[r] = out[j, :lengths_N[r]].copy()
      bar.update(len(rows))

    pending = None
    try:
      for L, rows in batches:
        ids_BxL = np.zeros((B, L), np.int32)  # filler rows stay all padding
        segments_BxL = np.zeros((B, L), np.int32)
        mask_BxL = np.zeros((B, L), np.int32)
        for j, r in enumerate(rows):
          T = lengths_N[r]
          ids_BxL[j, :T] = enc.ids[r]
          segments_BxL[j, :T] = enc.segments[r]
          mask_BxL[j, :T] = 1
        fn, new = self._program(L, layers, pooling)
        num_compiled += new
        put = lambda x: jax.device_put(x, self._batch_sharding)
        out = fn(self.params, put(ids_BxL), put(segments_BxL), put(mask_BxL))
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


# ----------------------------------------------------------------------------
# Files


def read_inputs(path: str) -> list[str]:
  """One input per line (a text or `A<TAB>B`); blank lines are kept as empty texts.

  Keeping them means output row i is always line i + 1 of the file.
  """
  if not os.path.exists(path):
    raise InputFileError(f"input file '{path}' does not exist")
  if os.path.isdir(path):
    raise InputFileError(f"input file '{path}' is a directory; expected a text file "
                         "with one input per line")
  with open(path, "rb") as f:
    data = f.read()
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    line = data[:e.start].count(b"\n") + 1
    raise InputFileError(f"input file '{path}' is not UTF-8: line {line}, byte offset "
                         f"{e.start} (0x{data[e.start]:02x}); expected UTF-8 text") from None
  if text.startswith("\ufeff"):
    text = text[1:]  # a UTF-8 byte order mark is not part of the first text
  # Only "\n" ends a line: str.splitlines would also split on form feeds and
  # other separators and shift row numbers against the file's lines.
  lines = [l[:-1] if l.endswith("\r") else l for l in text.split("\n")]
  if lines and lines[-1] == "":
    lines.pop()
  blank = [i + 1 for i, l in enumerate(lines) if not l.strip()]
  if not lines or len(blank) == len(lines):
    raise InputFileError(f"input file '{path}' is empty" + (" (only blank lines)" if lines else "")
                         + "; expected one text or 'A<TAB>B' pair per line")
  if blank:
    _warn(f"input file '{path}': {len(blank)} blank line(s) (first: line {blank[0]}) "
          f"give features of '{CLS} {SEP}' to keep one row per line")
  return lines


def _write_atomic(path: str, write) -> None:
  # Write next to the target, then rename: a failure never leaves a partial file.
  tmp = os.path.join(os.path.dirname(os.path.abspath(path)),
                     f".{os.path.basename(path)}.tmp-{os.getpid()}")
  try:
    with open(tmp, "wb") as f:
      write(f)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def write_features(path: str, features: Features) -> None:
  """`.npy`: pooled [N, Y, D]; `.npz`: per-token arrays (module docstring)."""
  ext = os.path.splitext(path)[1].lower()
  if ext == ".npy":
    if features.pooled_NxYxD is None:
      raise ConfigError(f"output '{path}': per-token features need a .npz file")
    _write_atomic(path, lambda f: np.save(f, features.pooled_NxYxD))
  elif ext == ".npz":
    if features.hidden_TxYxD is None:
      raise ConfigError(f"output '{path}': pooled features need a .npy file")
    lengths = features.lengths_N.astype(np.int64)
    arrays = {
        "hidden": np.concatenate(features.hidden_TxYxD, axis=0),
        "offsets": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        "lengths": lengths,
        "tokens": np.array([t for toks in features.tokens for t in toks], dtype=str),
        "token_ids": np.concatenate(features.token_ids).astype(np.int32),
        "segment_ids": np.concatenate(features.segment_ids).astype(np.int32),
        "layers": np.asarray(features.layers, np.int32)}
    _write_atomic(path, lambda f: np.savez(f, **arrays))
  else:
    raise ConfigError(f"output '{path}': expected a .npy (pooled) or .npz (per-token) file")


# ----------------------------------------------------------------------------
# CLI


class _Parser(argparse.ArgumentParser):
  def error(self, message):  # one line, like every other bert-jax error
    raise ConfigError(message)


def _parse_layers(text: str) -> tuple[int, ...]:
  try:
    return tuple(int(x) for x in text.split(","))
  except ValueError:
    raise ConfigError(f"--layers={text!r}: expected comma-separated integers "
                      "such as -1 or -4,-3,-2,-1") from None


def _parse_expect(text: str) -> dict:
  out = {}
  for item in filter(None, text.split(",")):
    key, eq, value = item.partition("=")
    if not eq:
      raise ConfigError(f"--expect_config={text!r}: expected key=value[,key=value...]")
    try:
      out[key.strip()] = int(value)
    except ValueError:
      out[key.strip()] = {"true": True, "false": False}.get(value.lower(), value)
  return out


def _parser() -> argparse.ArgumentParser:
  p = _Parser(prog="python -m bert_jax.features",
              description="Per-token or pooled BERT features of a text file, one input per "
              "line (a text or 'A<TAB>B'), from a bert-jax checkpoint.")
  p.add_argument("--checkpoint", required=True,
                 help="workdir, its checkpoints/ folder, or one step folder")
  p.add_argument("--input", required=True, help="UTF-8 text file, one input per line")
  p.add_argument("--output", required=True,
                 help=".npy for pooled features [N, layers, D], .npz for --pooling none")
  p.add_argument("--layers", default="-1",
                 help="comma-separated: 0 = embeddings, -1 = last layer (default -1)")
  p.add_argument("--pooling", default="cls", help=f"one of {', '.join(POOLINGS)} (default cls)")
  p.add_argument("--max_length", type=int, default=None,
                 help="tokens per input incl. [CLS]/[SEP]; longer inputs are truncated "
                 "(default: the checkpoint's max_position_embeddings; short inputs are "
                 "padded only to their length bucket either way)")
  p.add_argument("--batch_size", type=int, default=32,
                 help="rounded up to a multiple of the device count")
  p.add_argument("--dtype", default="float32", help=f"compute dtype: {', '.join(DTYPES)}")
  p.add_argument("--step", type=int, default=None, help="checkpoint step (default: newest)")
  p.add_argument("--expect_config", default="",
                 help="e.g. num_layers=12,hidden_size=768: fail unless the checkpoint matches")
  return p


def _join_negative_values(argv: list[str]) -> list[str]:
  # argparse would take "-4,-3,-2,-1" after --layers for an option name.
  out, i = [], 0
  while i < len(argv):
    if argv[i] == "--layers" and i + 1 < len(argv):
      out.append(f"--layers={argv[i + 1]}")
      i += 2
    else:
      out.append(argv[i])
      i += 1
  return out


def run(args: argparse.Namespace) -> Features:
  """Checks the cheap things first so bad input fails before any restore."""
  if args.pooling not in POOLINGS:
    raise ConfigError(f"--pooling={args.pooling!r}: expected one of {', '.join(POOLINGS)}")
  if args.dtype not in DTYPES:
    raise ConfigError(f"--dtype={args.dtype!r}: expected one of {', '.join(DTYPES)}")
  layers = _parse_layers(args.layers)
  ext = os.path.splitext(args.output)[1].lower()
  if ext not in (".npy", ".npz"):
    raise ConfigError(f"--output '{args.output}': expected a .npy (pooled) or .npz "
                      "(--pooling none) file")
  if (ext == ".npz") != (args.pooling == "none"):
    raise ConfigError(
        f"--output '{args.output}' with --pooling {args.pooling}: expected a "
        f"{'.npz' if args.pooling == 'none' else '.npy'} file (per-token features, --pooling "
        "none, go to .npz; pooled ones, cls/mean/pooler, to .npy)")
  out_dir = os.path.dirname(os.path.abspath(args.output))
  if not os.path.isdir(out_dir):
    raise ConfigError(f"--output '{args.output}': directory {out_dir} does not exist")
  if os.path.isdir(args.output):
    raise ConfigError(f"--output '{args.output}' is a directory; expected a file name")
  expect = _parse_expect(args.expect_config)
  texts = read_inputs(args.input)
  ex = Extractor.from_checkpoint(args.checkpoint, step=args.step, dtype=args.dtype,
                                 max_length=args.max_length, batch_size=args.batch_size,
                                 expect_config=expect)
  feats = ex.extract(texts, layers=layers, pooling=args.pooling)
  write_features(args.output, feats)
  return feats


def main(argv: Optional[Sequence[str]] = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  try:
    args = _parser().parse_args(_join_negative_values(argv))
    feats = run(args)
  except BertJaxError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  except KeyboardInterrupt:
    print("interrupted", file=sys.stderr)
    return 130
  print(f"wrote {args.output}: {feats.throughput()} on {jax.device_count()} "
        f"{jax.devices()[0].platform} device(s)", file=sys.stderr)
  return 0


def cli() -> None:
  """The console entry point (`bert-jax-features`)."""
  sys.exit(main())


if __name__ == "__main__":
  cli()
