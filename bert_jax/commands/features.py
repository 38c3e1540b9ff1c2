"""The `python -m bert_jax.features` / `bert-jax-features` command line.

Owns argument parsing and checking, reading the input text file (one input
per line) and writing the output files; the extraction itself is
`bert_jax.features.extract.Extractor`.

  --output X.npy  pooled features: float32 [N, Y, D], row i = input line i.
  --output X.npz  per-token features (--pooling none), inputs concatenated:
    hidden       float32 [total_tokens, Y, D]
    offsets      int64 [N + 1]: line i is rows offsets[i]:offsets[i + 1]
    lengths      int64 [N]: tokens of line i ([CLS] and [SEP] included)
    tokens       str [total_tokens]: word pieces, e.g. "[CLS]", "hello", "##s"
    token_ids    int32 [total_tokens]
    segment_ids  int32 [total_tokens]: 0 for [CLS] A [SEP], 1 for B [SEP]
    layers       int32 [Y]: absolute layer indices (0 = embeddings)

Like features.py, this module never imports the optimizer or the trainer.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Optional

import jax
import numpy as np

from bert_jax.commands import common
from bert_jax.storage import fs, outputs
from bert_jax.storage.workdir import opened
from bert_jax.errors import BertJaxError, ConfigError
from bert_jax.features.extract import DTYPES, POOLINGS, Extractor, Features
from bert_jax.data.tokenizer import CLS, SEP
from bert_jax.settings.model import ATTENTION_KERNELS, CPU_FORWARD_DOTS


class InputFileError(BertJaxError):
  """The text file to extract features from cannot be read as inputs."""


def _warn(msg: str) -> None:
  print(f"warning: {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------
# Files


def read_inputs(path: str) -> list[str]:
  """One input per line (a text or `A<TAB>B`); blank lines are kept as empty texts.

  Keeping them means output row i is always line i + 1 of the file.
  """
  if not fs.exists(path):
    raise InputFileError(f"input file '{path}' does not exist")
  if fs.isdir(path):
    raise InputFileError(f"input file '{path}' is a directory; expected a text file "
                         "with one input per line")
  data = fs.read_bytes(path)
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


def write_features(path: str, features: Features) -> None:
  """`.npy`: pooled [N, Y, D]; `.npz`: per-token arrays (module docstring)."""
  ext = os.path.splitext(path)[1].lower()
  if ext == ".npy":
    if features.pooled_NxYxD is None:
      raise ConfigError(f"output '{path}': per-token features need a .npz file")
    fs.write_with(path, lambda f: np.save(f, features.pooled_NxYxD))
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
    fs.write_with(path, lambda f: np.savez(f, **arrays))
  else:
    raise ConfigError(f"output '{path}': expected a .npy (pooled) or .npz (per-token) file")


# ----------------------------------------------------------------------------
# CLI


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
  p = common.Parser(prog=common.prog("features"),
              description="Per-token or pooled BERT features of a text file, one input per "
              "line (a text or 'A<TAB>B'), from a bert-jax checkpoint.")
  p.add_argument("--checkpoint", required=True,
                 help="workdir, its checkpoints/ folder, or one step folder")
  p.add_argument("--input", required=True, help="UTF-8 text file, one input per line")
  p.add_argument("--output", required=True,
                 help=".npy for pooled features [N, layers, D], .npz for --pooling none")
  p.add_argument("--layers", default="-1",
                 help="comma-separated: 0 = embeddings, -1 = last layer (default -1); "
                 "'all' = every layer, 0..num_layers")
  p.add_argument("--pooling", default="cls", help=f"one of {', '.join(POOLINGS)} (default cls)")
  p.add_argument("--max_length", type=int, default=None,
                 help="tokens per input incl. [CLS]/[SEP]; longer inputs are truncated "
                 "(default: the checkpoint's max_position_embeddings; short inputs are "
                 "padded only to their length bucket either way)")
  p.add_argument("--batch_size", type=int, default=32,
                 help="rounded up to a multiple of the device count")
  p.add_argument("--dtype", default="float32", help=f"compute dtype: {', '.join(DTYPES)}")
  p.add_argument("--attention_kernel", default="einsum",
                 help=f"attention core: {', '.join(k for k in ATTENTION_KERNELS if k != 'splash')} "
                 "(default einsum; "
                 "cudnn: cuDNN's fused attention, NVIDIA GPUs only)")
  p.add_argument("--cpu_forward_dots", default=None,
                 help=f"dots on XLA:CPU: {', '.join(CPU_FORWARD_DOTS)} (default: the "
                 "checkpoint's, normally auto: eigen in float32, faster there)")
  p.add_argument("--step", type=int, default=None, help="checkpoint step (default: newest)")
  p.add_argument("--expect_config", default="",
                 help="e.g. num_layers=12,hidden_size=768: fail unless the checkpoint matches")
  return p


def run(args: argparse.Namespace) -> Features:
  """Checks the cheap things first so bad input fails before any restore."""
  common.check_choice("--pooling", args.pooling, POOLINGS)
  common.check_choice("--dtype", args.dtype, DTYPES)
  # splash needs rows of multiples of 128; extraction pads to the batch's own length.
  common.check_choice("--attention_kernel", args.attention_kernel,
                      [k for k in ATTENTION_KERNELS if k != "splash"])
  if args.cpu_forward_dots is not None:  # None: the checkpoint's
    common.check_choice("--cpu_forward_dots", args.cpu_forward_dots, CPU_FORWARD_DOTS)
  if args.attention_kernel == "cudnn" and args.dtype == "float32":
    raise ConfigError("--attention_kernel=cudnn with --dtype float32: cuDNN's fused attention "
                      "takes bfloat16; expected --dtype bfloat16")
  layers = common.parse_layers(args.layers)
  ext = os.path.splitext(args.output)[1].lower()
  if ext not in (".npy", ".npz"):
    raise ConfigError(f"--output '{args.output}': expected a .npy (pooled) or .npz "
                      "(--pooling none) file")
  if (ext == ".npz") != (args.pooling == "none"):
    raise ConfigError(
        f"--output '{args.output}' with --pooling {args.pooling}: expected a "
        f"{'.npz' if args.pooling == 'none' else '.npy'} file (per-token features, --pooling "
        "none, go to .npz; pooled ones, cls/mean/pooler, to .npy)")
  outputs.check_file_target("--output", args.output)
  expect = _parse_expect(args.expect_config)
  texts = read_inputs(args.input)
  # A file over its input, or among the checkpoints it reads, would change what is read
  # (beside them in a workdir is fine: the workdir is not read).
  ckpts = opened(args.checkpoint).checkpoints
  outputs.check_apart("--output", args.output, (
      ("--checkpoint", ckpts if fs.isdir(ckpts) else args.checkpoint), ("--input", args.input)))
  ex = Extractor.from_checkpoint(args.checkpoint, step=args.step, dtype=args.dtype,
                                 max_length=args.max_length, batch_size=args.batch_size,
                                 expect_config=expect,
                                 attention_kernel=args.attention_kernel,
                                 cpu_forward_dots=args.cpu_forward_dots)
  feats = ex.extract(texts, layers=layers, pooling=args.pooling)
  write_features(args.output, feats)
  return feats


def main(argv: Optional[Sequence[str]] = None) -> int:
  return common.run_main(_main, argv)


def _main(argv: list[str]) -> None:
  args = _parser().parse_args(common.join_negative_values(argv))
  feats = run(args)
  print(f"wrote {args.output}: {feats.throughput()} on {jax.device_count()} "
        f"{jax.devices()[0].platform} device(s)", file=sys.stderr)


def cli() -> None:
  """The console entry point (`bert-jax-features`)."""
  sys.exit(main())


if __name__ == "__main__":
  cli()
