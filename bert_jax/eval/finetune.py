"""Fine-tuning a bert-jax checkpoint on a downstream task (GLUE-style), and its report.

The model (eval/classifier.py) is the checkpoint's encoder and pooler plus a
new head; it computes in the checkpoint's dtype on pre-training's (data,
model) mesh: batches split over the data axis, state replicated.

The recipe is the BERT paper's: AdamW with pre-training's weight-decay mask
and its warm-up-then-linear-decay schedule (`optim.make_optimizer`: 10% of the
steps warm up, then linear decay to 0), batch 32, 3 epochs, max length 128,
learning rates {2e-5, 3e-5, 5e-5}, each learning rate run with seeds 0, 1, 2
(3 seeds: MosaicBERT and Cramming report medians over several seeds; 3 is
the least that gives a median that is not a mean). A seed sets the head's
initialisation, the dropout masks (`fold_in(key, step)`) and the order of the
examples (shuffled each epoch). Inputs are bucketed by length as feature
extraction buckets them (`features.buckets`): one compiled program per
bucket, shared by every learning rate and seed (the learning rate is an
argument of the step, not a constant in it).

Reported, as GLUE defines them (`eval.metrics.compute`, on every split of
`task.eval_splits`; MNLI: matched and mismatched): every (learning rate,
seed) run after its last epoch, and for each learning rate the median over
seeds; the best learning rate has the highest median of the task's first metric
on its first eval split (MosaicBERT's and Cramming's report), set against the
majority class. Dev metrics after each epoch go to TensorBoard too, but only
the last epoch's count (picking an epoch on dev would be tuning on dev).

  from bert_jax.eval import finetune, finetune_report, tasks
  task = tasks.load_task("glue_data/SST-2")
  tuner = finetune.FineTuner.from_checkpoint("runs/base", task, finetune.Recipe())
  results = tuner.sweep(output_dir="finetune/sst2")   # results.json, TensorBoard events
  print(finetune_report.format_table(results))
  tuner.save(results, "sst2-model")    # the best run: python -m bert_jax.convert to-hf ...

The command line is `python -m bert_jax.finetune` (bert_jax/commands/finetune.py).

Shape legend: N examples, B batch, L padded length (a bucket), D hidden
size, C classes (1 for regression).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Sequence
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm import tqdm

from bert_jax import console
from bert_jax.parallel import sharding
from bert_jax.features import extract as features, restore
from bert_jax.io import checkpointing
from bert_jax.storage import fs, outputs, workdir
from bert_jax.train import optim
from bert_jax.errors import ConfigError
from bert_jax.eval import finetune_report as report, metrics as metrics_lib, tasks as tasks_lib
from bert_jax.eval.classifier import SequenceClassifier, init_head, with_head
from bert_jax.eval.finetune_data import Split, encode_split, pad_batch, plan_batches
from bert_jax.eval.finetune_report import RESULTS_FILE, RunResult, run_name, summarize
from bert_jax.settings.model import ModelConfig
from bert_jax.settings import OptimizerSettings
from bert_jax.data import bpe
from bert_jax.data.bpe import AnyTokenizer

DTYPES = ("float32", "bfloat16", "float16")
DEFAULT_MAX_LENGTH = 128
# Train loss / learning rate go to TensorBoard every this many steps.
_LOG_EVERY = 20


# --- recipe ---


def _is_int(v: Any) -> bool:
  return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


@dataclasses.dataclass(frozen=True)
class Recipe:
  """How to fine-tune; the defaults are the BERT paper's GLUE recipe."""
  learning_rates: tuple[float, ...] = (2e-5, 3e-5, 5e-5)
  seeds: tuple[int, ...] = (0, 1, 2)
  epochs: int = 3
  batch_size: int = 32  # global, over all devices
  max_length: Optional[int] = None  # None: 128, or the checkpoint's positions if fewer
  warmup_fraction: float = 0.1  # of all steps, then linear decay to 0
  weight_decay: float = 0.01  # not on biases and LayerNorm (optim.decay_mask)
  max_grad_norm: float = 1.0  # 0 = no clipping
  head_dropout: float = 0.1  # on the pooled output, before the new Dense layer
  eval_batch_size: int = 128
  dtype: Optional[str] = None  # compute dtype; None: the checkpoint's

  def validate(self) -> Recipe:
    """Raises a one-line ConfigError naming the flag of a value that cannot work."""
    if not self.learning_rates:
      raise ConfigError("--learning_rates: none given; expected e.g. 2e-5,3e-5,5e-5")
    for lr in self.learning_rates:
      if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise ConfigError(f"--learning_rates: {lr!r} is not a finite number > 0")
    if not self.seeds:
      raise ConfigError("--seeds: none given; expected e.g. 0,1,2")
    for s in self.seeds:
      if not _is_int(s) or s < 0:
        raise ConfigError(f"--seeds: {s!r} is not an integer >= 0")
    if len(set(self.seeds)) != len(self.seeds) or len(set(self.learning_rates)) != len(self.learning_rates):
      raise ConfigError(f"--learning_rates={self.learning_rates} --seeds={self.seeds}: "
                        "expected each value once")
    for name in ("epochs", "batch_size", "eval_batch_size"):
      v = getattr(self, name)
      if not _is_int(v) or v <= 0:
        raise ConfigError(f"--{name}={v!r}: expected a positive integer")
    if self.max_length is not None and (not _is_int(self.max_length) or self.max_length < 3):
      raise ConfigError(f"--max_length={self.max_length!r}: expected an integer >= 3 "
                        "([CLS] A [SEP] B [SEP] needs 3 special tokens)")
    if not 0.0 <= self.warmup_fraction < 1.0:
      raise ConfigError(f"--warmup_fraction={self.warmup_fraction!r}: expected 0 <= value < 1")
    for name in ("weight_decay", "max_grad_norm"):
      v = getattr(self, name)
      if not (math.isfinite(v) and v >= 0):
        raise ConfigError(f"--{name}={v!r}: expected a finite number >= 0")
    if not 0.0 <= self.head_dropout < 1.0:
      raise ConfigError(f"--head_dropout={self.head_dropout!r}: expected 0 <= rate < 1")
    if self.dtype is not None and self.dtype not in DTYPES:
      raise ConfigError(f"--dtype={self.dtype!r}: expected one of {', '.join(DTYPES)} "
                        "(default: the checkpoint's)")
    return self


# ----------------------------------------------------------------------------
# The fine-tuner


class FineTuner:
  """One task and one checkpoint: its data encoded once, its steps compiled once per bucket."""

  def __init__(self, params: Any, config: ModelConfig, tokenizer: AnyTokenizer,
               task: tasks_lib.Task, recipe: Recipe, *, meta: Optional[dict] = None,
               devices: Optional[Sequence[Any]] = None):
    """`params`: the BertModel tree, or {"bert": it, the family's head} (with_head)."""
    recipe.validate()
    config.validate()
    if tokenizer.vocab_size != config.vocab_size:
      raise ConfigError(f"vocabulary has {tokenizer.vocab_size} tokens but the model config "
                        f"has vocab_size={config.vocab_size}")
    max_length = recipe.max_length
    if max_length is None:
      max_length = min(DEFAULT_MAX_LENGTH, config.max_position_embeddings)
    if max_length > config.max_position_embeddings:
      raise ConfigError(f"--max_length={max_length} is above the checkpoint's "
                        f"max_position_embeddings={config.max_position_embeddings}; "
                        "expected at most that")
    devices = list(jax.devices() if devices is None else devices)
    self.mesh = sharding.make_mesh(1, devices)
    data = self.mesh.shape[sharding.DATA]
    for name in ("batch_size", "eval_batch_size"):
      if getattr(recipe, name) % data:
        raise ConfigError(f"--{name}={getattr(recipe, name)}: expected a multiple of the "
                          f"{data} data-parallel devices")
    for name in ("train",) + tuple(task.eval_splits):
      if not task.splits.get(name):
        raise ConfigError(f"task {task.name}: split '{name}' is missing or empty; expected "
                          "labelled examples to " + ("train on" if name == "train" else
                                                     "evaluate on"))
    self.task, self.recipe, self.meta = task, recipe, dict(meta or {})
    self.tokenizer = tokenizer
    self.max_length = max_length
    self.buckets = features.buckets(max_length)
    self.config = dataclasses.replace(config, dtype=recipe.dtype or config.dtype)
    self.model = SequenceClassifier(self.config, task.num_classes, recipe.head_dropout)
    self.train_split = encode_split(tokenizer, task, "train", max_length)
    self.eval_data = {s: encode_split(tokenizer, task, s, max_length) for s in task.eval_splits}
    truncated = self.train_split.num_truncated + sum(
        s.num_truncated for s in self.eval_data.values())
    if truncated:
      console.warn(f"warning: {truncated} example(s) of task {task.name} were longer than "
                   f"max_length={max_length} tokens and were truncated")
    self.steps_per_epoch = len(plan_batches(self.train_split.lengths_N, self.buckets,
                                            recipe.batch_size, np.random.default_rng(0)))
    self.num_steps = self.steps_per_epoch * recipe.epochs
    self.warmup_steps = int(round(recipe.warmup_fraction * self.num_steps))
    # learning_rate 1: the schedule's shape. The step multiplies the updates by
    # the run's learning rate (AdamW's decoupled decay included, as optax.adamw
    # and the reference scale it), so every learning rate shares the compiled steps.
    self.tx, self.schedule = optim.make_optimizer(OptimizerSettings(
        learning_rate=1.0, warmup_steps=self.warmup_steps, num_steps=self.num_steps,
        weight_decay=recipe.weight_decay, max_grad_norm=recipe.max_grad_norm))
    self._base = with_head(jax.device_get(params), self.config, self.model)
    self._rep = sharding.replicated(self.mesh)
    self._bs = sharding.batch_sharding(self.mesh)
    self._compile()
    self.compiled_lengths: set = set()  # (kind, padded length) of every program used so far

  @classmethod
  def from_checkpoint(cls, path: str, task: tasks_lib.Task, recipe: Recipe, *,
                      step: Optional[int] = None,
                      devices: Optional[Sequence[Any]] = None) -> FineTuner:
    params, config, tok, meta = restore.load_checkpoint(path, step, devices=devices, head=True)
    return cls(params, config, tok, task, recipe, meta={**meta, "checkpoint": fs.abspath(path)},
               devices=devices)

  # --- compiled steps ---

  def _loss_B(self, logits_BxC, labels_B):
    if self.task.kind == "regression":
      return jnp.square(logits_BxC[:, 0] - labels_B.astype(jnp.float32))
    return optax.softmax_cross_entropy_with_integer_labels(logits_BxC, labels_B)

  def _compile(self) -> None:
    model, tx, schedule = self.model, self.tx, self.schedule

    def train_step(params, opt_state, step, key, lr, batch):
      dropout_key = jax.random.fold_in(key, step)

      def loss_fn(p):
        logits_BxC = model.apply({"params": p}, batch["ids"], batch["segments"], batch["mask"],
                                 deterministic=False, rngs={"dropout": dropout_key})
        w_B = batch["weights"]
        # The mean over real rows: filler rows of a bucket's last batch count nothing.
        return jnp.sum(self._loss_B(logits_BxC, batch["labels"]) * w_B) / jnp.maximum(
            w_B.sum(), 1.0)

      loss, grads = jax.value_and_grad(loss_fn)(params)
      updates, opt_state = tx.update(grads, opt_state, params, loss=loss)
      updates = jax.tree.map(lambda u: u * lr, updates)
      params = optax.apply_updates(params, updates)
      ok = opt_state.streak == 0
      return params, opt_state, {"loss": jnp.where(ok, loss, 0.0),
                                 "skipped": 1 - ok.astype(jnp.int32),
                                 "learning_rate": lr * schedule(step)}

    def eval_step(params, batch):
      return model.apply({"params": params}, batch["ids"], batch["segments"], batch["mask"],
                         deterministic=True).astype(jnp.float32)

    rep, bs = self._rep, self._bs
    self._train_step = jax.jit(train_step, in_shardings=(rep, rep, rep, rep, rep, bs),
                               out_shardings=(rep, rep, rep), donate_argnums=(0, 1))
    self._eval_step = jax.jit(eval_step, in_shardings=(rep, bs), out_shardings=rep)
    self._opt_init = jax.jit(tx.init, out_shardings=rep)

  def _put_batch(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    # Every process holds the whole global batch (all read the same task files
    # and draw the same order), so each takes its devices' rows from it.
    return {k: jax.make_array_from_callback(v.shape, self._bs, lambda idx, v=v: v[idx])
            for k, v in batch.items()}

  def _put_replicated(self, tree: Any) -> Any:
    return jax.tree.map(lambda v: sharding.replicate(np.asarray(v), self.mesh), tree)

  # --- one run ---

  def initial_params(self, seed: int) -> Any:
    head = init_head(self.config, self.task.num_classes,
                     jax.random.fold_in(jax.random.key(seed), 0))
    return self._put_replicated({**self._base, "classifier": head})

  def predict(self, params: Any, split: Split) -> np.ndarray:
    """Class ids (classification) or values (regression), in row order."""
    B = self.recipe.eval_batch_size
    out_NxC = np.zeros((len(split), self.task.num_classes), np.float32)
    for L, rows in plan_batches(split.lengths_N, self.buckets, B):
      self.compiled_lengths.add(("eval", L))
      logits = self._eval_step(params, self._put_batch(pad_batch(split, rows, L, B)))
      out_NxC[rows] = np.asarray(jax.device_get(logits))[:len(rows)]
    if self.task.kind == "regression":
      return out_NxC[:, 0]
    return out_NxC.argmax(axis=1).astype(np.int32)

  def evaluate(self, params: Any) -> dict:
    """{eval split: {metric: value}} by GLUE's definitions."""
    out = {}
    for name, split in self.eval_data.items():
      out[name] = {k: float(v) for k, v in metrics_lib.compute(
          self.task, self.predict(params, split), split.labels_N).items()}
    return out

  def run(self, learning_rate: float, seed: int, *, reporter: Any = None,
          bar: Optional[tqdm] = None) -> tuple[RunResult, Any]:
    """Fine-tunes from the checkpoint with one (learning rate, seed); (result, params)."""
    start = time.perf_counter()
    params = self.initial_params(seed)
    opt_state = self._opt_init(params)
    key = jax.random.fold_in(jax.random.key(seed), 1)
    lr = sharding.replicate(np.float32(learning_rate), self.mesh)
    B = self.recipe.batch_size
    step, skipped, per_epoch, window, epoch_loss = 0, 0, [], [], []

    def flush(epoch: int) -> None:  # one transfer per window of steps, not one per step
      nonlocal skipped, window
      got = jax.device_get(window)
      skipped += sum(int(x["skipped"]) for x in got)
      epoch_loss.extend(float(x["loss"]) for x in got if not x["skipped"])
      good = [float(x["loss"]) for x in got if not x["skipped"]]
      loss = float(np.mean(good)) if good else float("nan")
      if reporter is not None:
        reporter.write("train", step, {"loss": loss,
                                       "learning_rate": float(got[-1]["learning_rate"])})
      if bar is not None:
        bar.set_postfix_str(f"lr {learning_rate:g} seed {seed} epoch {epoch + 1} "
                            f"loss {loss:.4f}", refresh=False)
        bar.update(len(got))
      window = []

    for epoch in range(self.recipe.epochs):
      epoch_loss.clear()
      rng = np.random.default_rng([seed, epoch])
      for L, rows in plan_batches(self.train_split.lengths_N, self.buckets, B, rng):
        self.compiled_lengths.add(("train", L))
        params, opt_state, m = self._train_step(
            params, opt_state, np.int32(step), key, lr,
            self._put_batch(pad_batch(self.train_split, rows, L, B)))
        step += 1
        window.append(m)
        if len(window) == _LOG_EVERY:
          flush(epoch)
      if window:
        flush(epoch)
      scores = self.evaluate(params)
      per_epoch.append(scores)
      if reporter is not None:
        for split, values in scores.items():
          reporter.write(split, step, values)
    result = RunResult(learning_rate=float(learning_rate), seed=int(seed),
                       metrics=per_epoch[-1], per_epoch=per_epoch,
                       train_loss=float(np.mean(epoch_loss)) if epoch_loss else float("nan"),
                       steps=step, skipped_steps=skipped,
                       seconds=time.perf_counter() - start)
    return result, params

  # --- the sweep ---

  def describe(self) -> str:
    r = self.recipe
    return (f"task {self.task.name} ({self.task.kind}, {self.task.num_classes} output(s)): "
            f"{len(self.train_split)} train examples, "
            + ", ".join(f"{len(s)} {n}" for n, s in self.eval_data.items())
            + f"; {len(r.learning_rates)} learning rate(s) x {len(r.seeds)} seed(s), "
            f"{r.epochs} epoch(s) of {self.steps_per_epoch} steps (batch {r.batch_size}, "
            f"{self.warmup_steps} warm-up steps), max length {self.max_length}, "
            f"{self.config.dtype}, {self.mesh.shape[sharding.DATA]} device(s); checkpoint "
            f"{self.meta.get('checkpoint')} at step {self.meta.get(checkpointing.RESTORED_STEP)}")

  def sweep(self, output_dir: Optional[str] = None, progress: Optional[bool] = None) -> dict:
    """Every (learning rate, seed); writes results.json and TensorBoard events to
    `output_dir` (process 0 only; None writes nothing) and returns the results.

    The best run's parameters (by the selection metric, see `summarize`) are
    kept on the host for `save`.
    """
    from bert_jax.train.reporting import Reporter  # tensorboardX only for a run that logs
    r = self.recipe
    writes = output_dir is not None and jax.process_index() == 0
    if writes:
      fs.makedirs(output_dir)
    runs: list[RunResult] = []
    best_score, self.best_params = -math.inf, None
    split, metric = self.task.eval_splits[0], self.task.metric_names[0]
    total = len(r.learning_rates) * len(r.seeds) * self.num_steps
    bar = tqdm(total=total, unit="step", file=sys.stderr, dynamic_ncols=True,
               disable=(True if jax.process_index() != 0 else
                        None if progress is None else not progress))  # None: off unless a tty
    started = time.perf_counter()
    try:
      with console.through(bar):
        for lr in r.learning_rates:
          for seed in r.seeds:
            reporter = (Reporter(fs.join(output_dir, "runs", run_name(lr, seed)))
                        if output_dir is not None else None)
            try:
              result, params = self.run(lr, seed, reporter=reporter, bar=bar)
            finally:
              if reporter is not None:
                reporter.close()
            runs.append(result)
            console.log(f"lr {lr:g} seed {seed}: " + ", ".join(
                f"{s} {m} {v:.4f}" for s, vs in result.metrics.items() for m, v in vs.items())
                + f" ({result.steps} steps, {result.seconds:.1f} s)")
            score = result.metrics[split][metric]
            if self.best_params is None or (math.isfinite(score) and score > best_score):
              best_score = score if math.isfinite(score) else best_score
              self.best_params = jax.device_get(params)
              self.best_run = result
            del params
    finally:
      bar.close()
    results = self._results(runs, time.perf_counter() - started)
    if writes:
      fs.write_json(fs.join(output_dir, RESULTS_FILE), results)
    return results

  def _results(self, runs: list[RunResult], seconds: float) -> dict:
    """What results.json holds: the task, the recipe, every run and the summary."""
    r = self.recipe
    return {
        "task": self.task.name, "kind": self.task.kind, "labels": list(self.task.labels),
        "metric_names": list(self.task.metric_names),
        "eval_splits": list(self.task.eval_splits),
        "checkpoint": self.meta.get("checkpoint"),
        "checkpoint_step": self.meta.get(checkpointing.RESTORED_STEP),
        "majority_accuracy": report.majority_accuracy(self.task),
        "recipe": {**dataclasses.asdict(r), "max_length": self.max_length,
                   "dtype": self.config.dtype, "steps_per_epoch": self.steps_per_epoch,
                   "num_steps": self.num_steps, "warmup_steps": self.warmup_steps},
        "num_examples": {"train": len(self.train_split),
                         **{n: len(s) for n, s in self.eval_data.items()}},
        "devices": self.mesh.devices.size, "platform": jax.devices()[0].platform,
        "seconds": seconds,
        "runs": [x.to_json() for x in runs],
        "summary": summarize(self.task, runs),
    }

  # --- saving ---

  def save_meta(self, results: dict) -> dict:
    """The meta of the saved fine-tuned checkpoint: convert to-hf reads `classifier`."""
    kind = self.task.kind
    labels = list(self.task.labels) if kind == "classification" else []
    run = self.best_run
    return {"model_config": self.config.to_dict(), **bpe.to_meta(self.tokenizer),
            "step": run.steps,
            "source": f"finetune:{self.meta.get('checkpoint', '')}",
            "classifier": {"task": self.task.name, "kind": kind, "labels": labels,
                           "num_labels": self.task.num_classes,
                           "dropout": self.recipe.head_dropout,
                           "problem_type": ("regression" if kind == "regression"
                                            else "single_label_classification")},
            "finetune": {"learning_rate": run.learning_rate, "seed": run.seed,
                         "metrics": run.metrics, "max_length": self.max_length,
                         "recipe": results.get("recipe", {})}}

  def save(self, results: dict, directory: str, overwrite: bool = False) -> str:
    """Writes the best run as a params-only bert-jax checkpoint in `directory`
    (atomically; on several processes, process 0 alone writes it, as it writes
    results.json); `python -m bert_jax.convert to-hf` exports it as
    BertForSequenceClassification. Returns the step folder."""
    if self.best_params is None:
      raise ConfigError("save: no fine-tuned run to save; run sweep first")
    meta = self.save_meta(results)
    if jax.process_index() == 0:
      with outputs.atomic_output_dir(directory, overwrite,
                                     (("--checkpoint", self.meta.get("checkpoint", "")),)) as tmp:
        checkpointing.save_params(tmp, meta["step"], self.best_params, meta,
                                  this_process_only=True)
    return fs.join(workdir.opened(fs.abspath(directory)).checkpoints, str(meta["step"]))
