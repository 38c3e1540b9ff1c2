"""`python -m bert_jax.convert` (`bert-jax-convert`): HuggingFace and google-research
BERT checkpoints into bert-jax, and back (the library: bert_jax.io.convert).

  python -m bert_jax.convert from-hf HF_DIR OUT_DIR [--no-heads] [--overwrite]
  python -m bert_jax.convert from-tf TF_DIR OUT_DIR [--no-heads] [--overwrite]
  python -m bert_jax.convert to-hf CKPT OUT_HF_DIR [--step N] [--overwrite]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Optional

from bert_jax.commands import common
from bert_jax.io.convert import export_hf, import_hf, import_tf
from bert_jax.io.hf_weights import ENCODER, GROUP_NAMES, POOLER
from bert_jax.settings.model import ModelConfig
from bert_jax.storage import fs, outputs


def _describe(config: ModelConfig) -> str:
  act = "tanh-approximate GELU" if config.gelu_approximate else "exact GELU"
  return (f"{config.num_layers} layers, hidden {config.hidden_size}, {config.num_heads} heads, "
          f"intermediate {config.intermediate_size}, vocab {config.vocab_size}, "
          f"{config.max_position_embeddings} positions, {config.type_vocab_size} token types, "
          f"{act}, layer_norm_eps {config.layer_norm_eps:g}, float32")


def _print_import(meta: dict, heads: bool) -> None:
  print(f"imported {meta['source']} -> {meta['checkpoint']}")
  print(f"  model: {_describe(ModelConfig.from_dict(meta['model_config']))}")
  print(f"  lowercase: {meta['lowercase']} ({meta['lowercase_from']})")
  for group, state in meta["heads"].items():
    if group != ENCODER:
      why = "not in the source" if heads or group == POOLER else "--no-heads"
      note = "" if state == "imported" else f" randomly ({why})"
      print(f"  {GROUP_NAMES[group]}: {state}{note}")
  if meta["ignored"]:
    print(f"  ignored {len(meta['ignored'])} tensor(s): {', '.join(meta['ignored'][:5])}"
          + (" ..." if len(meta["ignored"]) > 5 else ""))


def _parser() -> argparse.ArgumentParser:
  p = common.Parser(prog=common.prog("convert"), description=__doc__.split(
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
  return common.run_main(_main, argv)


def _main(argv: list[str]) -> None:
  args = _parser().parse_args(argv)
  # Before anything is read or mirrored: an output that is (or holds, or sits inside) the
  # source would replace it with --overwrite.
  outputs.check_apart("OUT_HF_DIR" if args.command == "to-hf" else "OUT_DIR", args.out_dir,
                      (("CKPT" if args.command == "to-hf" else "the source", args.source),))
  if args.command == "to-hf":
    meta = export_hf(args.source, args.out_dir, step=args.step, overwrite=args.overwrite)
    print(f"exported {fs.abspath(args.source)} (step {meta.get('step')}) -> "
          f"{fs.abspath(args.out_dir)}")
    initialised = [g for g, s in meta.get("heads", {}).items() if s == "initialised"]
    if initialised:
      print("  note: " + ", ".join(GROUP_NAMES[g] for g in initialised)
            + " were randomly initialised at import, not trained")
    return
  lower = {"auto": None, "true": True, "false": False}[args.lowercase]
  run = import_hf if args.command == "from-hf" else import_tf
  args.source = fs.local_mirror(args.source.rstrip("/"))  # a bucket's model: copied here first
  meta = run(args.source, args.out_dir, heads=not args.no_heads, overwrite=args.overwrite,
             seed=args.seed, lowercase=lower)
  _print_import(meta, not args.no_heads)
  return


def cli() -> None:
  """The console entry point (`bert-jax-convert`)."""
  sys.exit(main())


if __name__ == "__main__":
  cli()
