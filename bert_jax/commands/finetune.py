"""The `python -m bert_jax.finetune` / `bert-jax-finetune` command line.

Fine-tunes a bert-jax checkpoint (a training workdir, its checkpoints/ folder,
a step folder, or a `bert_jax.io.convert` import) on a downstream task with the
BERT paper's GLUE recipe, and reports the GLUE metric of every (learning
rate, seed) run and the median over seeds of the best learning rate:

  python -m bert_jax.finetune --checkpoint runs/base --task glue_data/SST-2
  python -m bert_jax.finetune --checkpoint runs/base --task glue_data/MNLI \\
      --learning_rates 3e-5 --seeds 0 --output_dir out/mnli --save out/mnli-model
  python -m bert_jax.convert to-hf out/mnli-model out/mnli-hf   # BertForSequenceClassification

--task is a GLUE task directory as the official distribution ships it
(CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE, WNLI), `tfds:glue/<task>`
already built under --data_dir (never downloaded), a plain directory with
train.tsv and dev.tsv (header `label<TAB>text[<TAB>text_b]`; float labels
make a regression task), or a built-in task name (bert_jax.eval.tasks).

Writes to --output_dir (default finetune/<task name>):
  results.json                   every run's metrics, the medians, the best learning rate
  runs/lr<LR>_seed<S>/tensorboard/  train loss and learning rate, dev metrics per epoch
                                    (`tensorboard --logdir OUTPUT_DIR/runs`)
  runs/lr<LR>_seed<S>/metrics.jsonl the same as JSON lines
--save DIR writes the best run (by the selection metric) as a params-only
bert-jax checkpoint that `convert to-hf` exports as BertForSequenceClassification.

Defaults (all flags): --learning_rates 2e-5,3e-5,5e-5 --seeds 0,1,2 --epochs 3
--batch_size 32 --max_length 128 (or the checkpoint's positions if fewer),
--warmup_fraction 0.1, --weight_decay 0.01, --max_grad_norm 1.0,
--head_dropout 0.1, the checkpoint's compute dtype. The model, recipe and
report are bert_jax.eval.finetune.

Several processes (a multi-host TPU pod or GPU cluster) run the same command with
--jax_distributed (or --coordinator_address, --num_processes, --process_id, as
train.py takes them): every process reads the task, batches are split over all
devices, and process 0 alone prints and writes (results.json, TensorBoard, --save).

Bad input (a missing checkpoint or one without params, an unreadable task, a
bad flag) is one `error:` line, exit status 2, and nothing is written.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence
from typing import Optional

from bert_jax.commands import common
from bert_jax.errors import ConfigError
from bert_jax.storage import fs, outputs


def _floats(flag: str, text: str) -> tuple[float, ...]:
  try:
    return tuple(float(x) for x in text.split(",") if x.strip())
  except ValueError:
    raise ConfigError(f"--{flag}={text!r}: expected comma-separated numbers such as "
                      "2e-5,3e-5,5e-5") from None


def _ints(flag: str, text: str) -> tuple[int, ...]:
  try:
    return tuple(int(x) for x in text.split(",") if x.strip())
  except ValueError:
    raise ConfigError(f"--{flag}={text!r}: expected comma-separated integers such as "
                      "0,1,2") from None


def _parser() -> argparse.ArgumentParser:
  p = common.Parser(prog=common.prog("finetune"),
              description="Fine-tune a bert-jax checkpoint on a GLUE-style task and report "
              "the GLUE metric (every learning rate and seed, and the median over seeds of "
              "the best learning rate).")
  p.add_argument("--checkpoint", required=True,
                 help="workdir, its checkpoints/ folder, a step folder, or a convert import")
  p.add_argument("--task", required=True,
                 help="GLUE task dir, tfds:glue/<task>, plain task dir, or built-in task name")
  p.add_argument("--data_dir", default=None, help="TFDS data dir for tfds:glue/<task>")
  p.add_argument("--output_dir", default=None,
                 help="results.json and TensorBoard events (default finetune/<task name>)")
  p.add_argument("--learning_rates", default="2e-5,3e-5,5e-5", help="comma-separated")
  p.add_argument("--seeds", default="0,1,2", help="comma-separated; runs per learning rate")
  p.add_argument("--epochs", type=int, default=3,
                 help="passes over the train split per run (the BERT paper: 2-4)")
  p.add_argument("--batch_size", type=int, default=32, help="global, over all devices")
  p.add_argument("--eval_batch_size", type=int, default=128, help="dev batches, global")
  p.add_argument("--max_length", type=int, default=None,
                 help="tokens per example incl. [CLS]/[SEP] (default 128, or the "
                 "checkpoint's max_position_embeddings if fewer)")
  p.add_argument("--warmup_fraction", type=float, default=0.1,
                 help="share of the steps with a linear learning-rate warm-up")
  p.add_argument("--weight_decay", type=float, default=0.01,
                 help="decoupled (AdamW), not on LayerNorm or biases")
  p.add_argument("--max_grad_norm", type=float, default=1.0, help="0 = no clipping")
  p.add_argument("--head_dropout", type=float, default=0.1,
                 help="dropout before the classifier head")
  p.add_argument("--dtype", default=None,
                 help="compute dtype: float32, bfloat16, float16 (default: the checkpoint's)")
  p.add_argument("--step", type=int, default=None, help="checkpoint step (default: newest)")
  p.add_argument("--save", default=None,
                 help="write the best run here as a bert-jax checkpoint (convert to-hf exports it)")
  p.add_argument("--overwrite", action="store_true", help="replace a non-empty --save directory")
  p.add_argument("--no_progress", action="store_true", help="no progress bar")
  # Several processes (a multi-host TPU pod, multi-process GPU): as train.py's flags.
  p.add_argument("--jax_distributed", action="store_true",
                 help="join a multi-process run first (auto-detects the cluster unless the "
                 "three flags below are given)")
  p.add_argument("--coordinator_address", default=None,
                 help="host:port of process 0's coordinator (implies --jax_distributed)")
  p.add_argument("--num_processes", type=int, default=None, help="processes in the run")
  p.add_argument("--process_id", type=int, default=None, help="this process's index")
  p.add_argument("--distributed_timeout", type=int, default=120,
                 help="seconds for all processes to join; then one error line and exit 2")
  return p


def _check_save(path: Optional[str], overwrite: bool, checkpoint: str) -> None:
  if path is None:
    return
  # --save onto (or inside, or above) the checkpoint it fine-tunes would replace it.
  outputs.check_apart("--save", path, (("--checkpoint", checkpoint),))
  path = fs.abspath(path)
  if fs.isfile(path):
    raise ConfigError(f"--save {path}: exists and is not a directory; expected a directory "
                      "(created if missing)")
  if fs.listdir_or_empty(path) and not overwrite:
    raise ConfigError(f"--save {path}: exists and is not empty; pass --overwrite to replace it")


def run(args: argparse.Namespace) -> dict:
  """Checks everything cheap first, so bad input fails before anything is written."""
  import jax  # after argument parsing: `--help` and flag errors stay fast

  from bert_jax.parallel import startup

  from bert_jax.eval import finetune, finetune_report, tasks

  recipe = finetune.Recipe(
      learning_rates=_floats("learning_rates", args.learning_rates),
      seeds=_ints("seeds", args.seeds), epochs=args.epochs, batch_size=args.batch_size,
      max_length=args.max_length, warmup_fraction=args.warmup_fraction,
      weight_decay=args.weight_decay, max_grad_norm=args.max_grad_norm,
      head_dropout=args.head_dropout, eval_batch_size=args.eval_batch_size,
      dtype=args.dtype).validate()
  _check_save(args.save, args.overwrite, args.checkpoint)
  if args.output_dir is not None and fs.isfile(args.output_dir):
    raise ConfigError(f"--output_dir {args.output_dir}: exists and is not a directory")
  if not fs.isdir(args.checkpoint):
    found = "is not a directory" if fs.exists(args.checkpoint) else "no such directory"
    raise ConfigError(f"--checkpoint {args.checkpoint}: {found}; expected a workdir, its "
                      "checkpoints/ folder, a step folder or a convert import")
  task = tasks.load_task(args.task, args.data_dir)
  explicit = (args.coordinator_address, args.num_processes, args.process_id)
  if args.jax_distributed or any(v is not None for v in explicit):
    startup.initialize_distributed(*explicit, initialization_timeout=args.distributed_timeout)
  output_dir = args.output_dir or os.path.join("finetune", task.name)
  with contextlib.ExitStack() as outputs:
    if jax.process_index() == 0:  # the writer: its outputs are checked and taken up front
      _take_outputs(outputs, output_dir, args.save)
    tuner = finetune.FineTuner.from_checkpoint(args.checkpoint, task, recipe, step=args.step)
    log = lambda msg: print(msg, flush=True) if jax.process_index() == 0 else None
    log(tuner.describe())
    results = tuner.sweep(output_dir=output_dir, progress=False if args.no_progress else None)
    results_file = fs.join(output_dir, finetune_report.RESULTS_FILE)
    log(finetune_report.format_table(results))
    log(f"wrote {results_file} and TensorBoard events under {fs.join(output_dir, 'runs')}")
    if args.save is not None:
      where = _save(tuner, results, args.save, args.overwrite, results_file)
      best = results["summary"]["best_run"]
      log(f"saved the best run (lr {best['learning_rate']:g}, seed {best['seed']}) -> {where}; "
          f"export: python -m bert_jax.convert to-hf {args.save} OUT_HF_DIR")
  return results


def _take_outputs(stack: contextlib.ExitStack, output_dir: str, save: Optional[str]) -> None:
  """Writability of --output_dir and of --save's folder, checked before any work, and both
  locked for the run: a second fine-tuning with the same outputs stops at once with one
  line, instead of overwriting the first's results.json."""
  from bert_jax.storage import workdir_lock
  check = outputs.check_writable_dir
  check("--output_dir", output_dir)
  taken = [("--output_dir", output_dir, None)]
  if save is not None:
    parent, base = fs.parent(fs.abspath(save)), fs.basename(save)
    check("--save", parent)  # the checkpoint is made beside it (or locally) and moved
    taken.append(("--save", parent, f".{base}.lock"))
  for flag, where, lock_file in taken:
    try:
      stack.enter_context(workdir_lock.hold(where, lock_file=lock_file))
    except workdir_lock.WorkdirInUse as e:
      path = save if flag == "--save" else output_dir
      raise ConfigError(f"{flag} {path} is in use by another fine-tuning "
                        f"({workdir_lock.describe(e.holder)}); wait for it to end or pass "
                        f"another {flag}") from None


def _save(tuner, results: dict, save: str, overwrite: bool, results_file: str) -> str:
  """tuner.save; a disk that fills up or turns read-only meanwhile is one line (the
  results are already written, and nothing is left at --save: it is written beside it
  and renamed when complete)."""
  from bert_jax.io import checkpointing
  try:
    return tuner.save(results, save, overwrite=overwrite)
  except Exception as e:  # pylint: disable=broad-except
    kind, why = checkpointing.classify(e)
    if kind != "environment":
      raise
    error = ConfigError(f"--save {save}: cannot write the fine-tuned checkpoint ({why}); "
                        f"nothing was written there; the sweep's results are in "
                        f"{results_file}")
    error.background_failure = True  # Orbax's writer threads: exit without waiting for them
    raise error from None


def main(argv: Optional[Sequence[str]] = None) -> int:
  return common.run_main(lambda a: run(_parser().parse_args(a)), argv)


def cli() -> None:
  """The console entry point (`bert-jax-finetune`)."""
  sys.exit(main())


if __name__ == "__main__":
  cli()
