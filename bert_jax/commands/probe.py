"""The `python -m bert_jax.probe` command line: a linear probe of a checkpoint on a task.

  python -m bert_jax.probe --checkpoint runs/tiny --task word_order
  python -m bert_jax.probe --checkpoint runs/minilm --task glue_data/CoLA --layers -4,-3,-2,-1 \\
      --pooling mean --output cola_probe.json

Restores only the params of any bert-jax checkpoint (trained, or imported by
bert_jax.io.convert), extracts pooled features of the task's train and eval
splits (bert_jax.features.extract), fits an L2 logistic regression (ridge for
regression tasks) with the penalty picked on held-out train, and prints the
task's metric(s) on the eval split(s), one `name: value` line each, on
stdout. `--output` also writes them, with the settings, as JSON (atomically).
Task forms (a GLUE or plain task directory, tfds:glue/<task>, word_order):
bert_jax.eval.tasks. Bad input is one `error:` line, exit 2, nothing written.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Optional

from bert_jax.commands import common
from bert_jax.features.extract import DTYPES, Extractor
from bert_jax.storage import fs, outputs

PROBE_POOLINGS = ("cls", "mean", "pooler")


def _parser() -> argparse.ArgumentParser:
  p = common.Parser(prog=common.prog("probe"),
              description="Linear probe (L2 logistic regression; ridge for regression tasks) "
              "of a bert-jax checkpoint's features on a task; prints the task's metric(s).")
  p.add_argument("--checkpoint", required=True,
                 help="workdir, its checkpoints/ folder, or one step folder")
  p.add_argument("--task", required=True,
                 help="a GLUE task directory (official layout), a plain task directory "
                 "(train.tsv, dev.tsv: label<TAB>text[<TAB>text_b]), tfds:glue/<task>, or "
                 "the built-in word_order")
  p.add_argument("--layers", default="-1",
                 help="comma-separated, concatenated: 0 = embeddings, -1 = last (default -1); "
                 "'all' = every layer")
  p.add_argument("--pooling", default="mean",
                 help=f"one of {', '.join(PROBE_POOLINGS)} (default mean)")
  p.add_argument("--data_dir", default=None,
                 help="TFDS data dir for tfds: tasks; also searched for a relative task directory")
  p.add_argument("--output", default=None, help="JSON file for the results (optional)")
  p.add_argument("--max_examples", type=int, default=None,
                 help="cap on each split (a seeded random subset; default: all)")
  p.add_argument("--max_length", type=int, default=None,
                 help="tokens per input incl. [CLS]/[SEP]; longer inputs are truncated "
                 "(default: the checkpoint's max_position_embeddings)")
  p.add_argument("--batch_size", type=int, default=32)
  p.add_argument("--dtype", default="float32", help=f"compute dtype: {', '.join(DTYPES)}")
  p.add_argument("--step", type=int, default=None, help="checkpoint step (default: newest)")
  p.add_argument("--seed", type=int, default=0,
                 help="picks the held-out part of train (and --max_examples subsets)")
  return p


def run(args: argparse.Namespace) -> dict:
  """Checks the cheap things and reads the task before restoring the checkpoint."""
  from bert_jax.eval import probe, tasks  # after argument errors: these import more
  common.check_choice("--pooling", args.pooling, PROBE_POOLINGS)
  common.check_choice("--dtype", args.dtype, DTYPES)
  layers = common.parse_layers(args.layers)
  if args.output is not None:
    outputs.check_file_target("--output", args.output)
  task = tasks.load_task(args.task, data_dir=args.data_dir)
  print(f"task {task.summary()}", file=sys.stderr, flush=True)
  ex = Extractor.from_checkpoint(args.checkpoint, step=args.step, dtype=args.dtype,
                                 max_length=args.max_length, batch_size=args.batch_size)
  result = probe.probe(ex, task, layers=layers, pooling=args.pooling,
                       max_examples=args.max_examples, seed=args.seed)
  return {"checkpoint": args.checkpoint, "step": ex.step, "task": task.name,
          "task_spec": args.task, "layers": list(layers) if not isinstance(layers, str) else layers,
          "pooling": args.pooling, "metric_names": list(task.metric_names), **result}


def main(argv: Optional[Sequence[str]] = None) -> int:
  return common.run_main(_main, argv)


def _main(argv: list[str]) -> None:
  args = _parser().parse_args(common.join_negative_values(argv))
  result = run(args)
  from bert_jax.eval import probe  # pylint: disable=import-outside-toplevel
  for k in (k for k in result if probe.is_metric(k)):
    print(f"{k}: {probe.describe_metric(result, k)}")  # `<metric>: <value>` first, for scripts
  penalty = "C" if "C" in result else "alpha"
  print(f"probe of {args.checkpoint} at step {result['step']}: {penalty}={result[penalty]:g} "
        f"picked on held-out train, {int(result['num_train'])} train examples, "
        f"{result['seconds']:.1f} s", file=sys.stderr)
  if args.output is not None:
    fs.write_json(args.output, dict(sorted(result.items())))
    print(f"wrote {args.output}", file=sys.stderr)


def cli() -> None:
  """The console entry point (`bert-jax-probe`, once registered in pyproject)."""
  sys.exit(main())


if __name__ == "__main__":
  cli()
