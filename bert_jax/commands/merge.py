"""`python -m bert_jax.merge` (`bert-jax-merge`): the weighted mean of checkpoints'
parameters, written as a checkpoint (the library: bert_jax.io.merge).

  python -m bert_jax.merge OUT_DIR CKPT CKPT [CKPT ...] [--weights 1,1,2] [--overwrite]
  python -m bert_jax.merge OUT_DIR WORKDIR --last 4
  python -m bert_jax.merge OUT_DIR WORKDIR --ema

A CKPT is a workdir, its checkpoints/ folder or a step folder, local or gs://, with
`@STEP` for a step other than the newest (runs/decay-a@9000). `--last K` takes the K
newest checkpoints of one workdir (the end of a decay). `--ema` takes each checkpoint's
moving average of the parameters (a run with --config.train.phase_ema) instead of its
parameters; one CKPT is then enough. The output is read by features,
probes, fine-tuning and `convert to-hf`; training does not resume from it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Optional

from bert_jax.commands import common
from bert_jax.errors import ConfigError
from bert_jax.io import merge as merge_lib


def _parser() -> common.Parser:
  p = common.Parser(prog=common.prog("merge"), description=__doc__.split("\n\n")[0])
  p.add_argument("out_dir", metavar="OUT_DIR")
  p.add_argument("sources", metavar="CKPT", nargs="+",
                 help="a workdir, its checkpoints/ or a step folder; PATH@STEP for a step")
  p.add_argument("--weights", default="", help="comma-separated, one per CKPT (default: equal)")
  p.add_argument("--last", type=int, default=0,
                 help="the K newest checkpoints of the one CKPT given")
  p.add_argument("--ema", action="store_true",
                 help="each checkpoint's moving average of the parameters (train.phase_ema)")
  p.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT_DIR")
  return p


def main(argv: Optional[Sequence[str]] = None) -> int:
  return common.run_main(_main, argv)


def _main(argv: list[str]) -> None:
  args = _parser().parse_args(argv)
  if args.last:
    if len(args.sources) != 1 or args.last < 2:
      raise ConfigError(f"--last {args.last} with {len(args.sources)} CKPT(s): expected one "
                        "workdir and K >= 2")
    sources = merge_lib.last_steps(args.sources[0], args.last)
  else:
    sources = [merge_lib.parse(s) for s in args.sources]
  if args.weights:
    try:
      weights = [float(w) for w in args.weights.split(",")]
    except ValueError:
      weights = []
    if len(weights) != len(sources):
      raise ConfigError(f"--weights {args.weights!r}: expected {len(sources)} numbers, one per "
                        "checkpoint, comma-separated")
    sources = [merge_lib.Source(s.path, s.step, w) for s, w in zip(sources, weights)]
  meta = merge_lib.merge(sources, args.out_dir, overwrite=args.overwrite, ema=args.ema)
  what = "moving averages of " if args.ema else ""
  print(f"merged the {what}{len(sources)} checkpoint(s) -> {args.out_dir} (step {meta['step']})")
  for m in meta["merged_from"]:
    print(f"  {m['checkpoint']} step {m['step']}: weight {m['weight']:.4g}")


def cli() -> None:
  """The console entry point (`bert-jax-merge`)."""
  sys.exit(main())


if __name__ == "__main__":
  cli()
