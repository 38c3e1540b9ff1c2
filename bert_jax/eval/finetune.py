"""Fine-tuning a bert-jax checkpoint on a downstream task (GLUE-style), and its report.

The model is the checkpoint's encoder and pooler (`model.BertModel`, restored
params-only as feature extraction restores them) plus a new head on the
pooled output: dropout (0.1) then a Dense layer of `num_classes` outputs
(softmax cross-entropy), or of 1 output for a regression task (mean squared
error). It computes in the checkpoint's dtype, on the same (data, model) mesh
as pre-training (`sharding.make_mesh`): every batch is split over the data
axis, parameters and optimizer state are replicated.

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
seeds; the best learning rate is the one whose median of the task's first
metric on its first eval split is highest (MosaicBERT's and Cramming's
report). Dev metrics after each epoch go to TensorBoard too, but only the
last epoch's count (picking an epoch on dev would be tuning on dev).

  from bert_jax.eval import finetune, tasks
  task = tasks.load_task("glue_data/SST-2")
  tuner = finetune.FineTuner.from_checkpoint("runs/base", task, finetune.Recipe())
  results = tuner.sweep(output_dir="finetune/sst2")   # results.json, TensorBoard events
  print(finetune.format_table(results))
  tuner.save(results, "sst2-model")    # the best run: python -m bert_jax.io.convert to-hf ...

The command line is `python -m bert_jax.finetune` (bert_jax/finetune.py).

Shape legend: N examples, B batch, L padded length (a bucket), D hidden
size, C classes (1 for regression).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm import tqdm

from bert_jax import console
from bert_jax.dist import sharding
from bert_jax.features import extract as features
from bert_jax.io import checkpointing
from bert_jax.train import optim
from bert_jax.errors import ConfigError
from bert_jax.eval import metrics as metrics_lib
from bert_jax.eval import tasks as tasks_lib
# The pre-training heads' building blocks, so the new head is made exactly as
# the NSP head is (same initialiser, float32 output, the mixed-precision dot).
from bert_jax.model.config import BertConfig
from bert_jax.model.bert import BertModel, Dropout, _dense_kw, _init, _zeros
from bert_jax.settings import OptimizerSettings
from bert_jax.data.tokenizer import Tokenizer

DTYPES = ("float32", "bfloat16", "float16")
DEFAULT_MAX_LENGTH = 128
RESULTS_FILE = "results.json"
# Train loss / learning rate go to TensorBoard every this many steps.
_LOG_EVERY = 20


# ----------------------------------------------------------------------------
# Recipe


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
    if len(set(self.seeds)) != len(self.seeds) or len(set(self.learning_rates)) != len(
        self.learning_rates):
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
# The model


class SequenceClassifier(nn.Module):
  """BertModel + dropout + Dense(num_classes) on the pooled output (HF's
  BertForSequenceClassification); params {"bert": ..., "classifier": ...}."""
  config: BertConfig
  num_classes: int
  head_dropout: float = 0.1

  @nn.compact
  def __call__(self, ids_BxL, segments_BxL, mask_BxL, deterministic: bool = True):
    c = self.config
    pooled_BxD = BertModel(c, name="bert")(ids_BxL, segments_BxL, mask_BxL,
                                           deterministic).pooled_BxD
    pooled_BxD = Dropout(self.head_dropout, c.dropout_rng)(pooled_BxD, deterministic=deterministic)
    return nn.Dense(self.num_classes, **_dense_kw(c, dtype=jnp.float32),
                    kernel_init=_init(c, ("embed", None)), bias_init=_zeros((None,)),
                    name="classifier")(pooled_BxD.astype(jnp.float32))


def init_head(config: BertConfig, num_classes: int, key: jax.Array) -> dict:
  """A fresh classifier head, initialised as model.py initialises the NSP head."""
  kernel = nn.initializers.truncated_normal(config.initializer_range)(
      key, (config.hidden_size, num_classes), jnp.float32)
  return {"kernel": np.asarray(kernel), "bias": np.zeros((num_classes,), np.float32)}


# ----------------------------------------------------------------------------
# Data (numpy only)


@dataclasses.dataclass
class Split:
  """One split, encoded: token ids per example and labels."""
  ids: list[list[int]]
  segments: list[list[int]]
  lengths_N: np.ndarray  # int64, real tokens per example
  labels_N: np.ndarray  # int32 class ids or float32 targets
  num_truncated: int

  def __len__(self) -> int:
    return len(self.ids)


def encode_split(tokenizer: Tokenizer, task: tasks_lib.Task, name: str,
                 max_length: int) -> Split:
  examples = task.splits[name]
  unlabelled = sum(e.label is None for e in examples)
  if unlabelled:
    raise ConfigError(f"task {task.name}: split '{name}' has {unlabelled} example(s) without a "
                      "label; expected labels to train or evaluate on")
  enc = features.encode(tokenizer, tasks_lib.inputs(examples), max_length)
  dtype = np.float32 if task.kind == "regression" else np.int32
  return Split(enc.ids, enc.segments, np.array([len(x) for x in enc.ids], np.int64),
               np.array([e.label for e in examples], dtype), enc.num_truncated)


def plan_batches(lengths_N: np.ndarray, bucket_lengths: Sequence[int], batch_size: int,
                 rng: Optional[np.random.Generator] = None) -> list[tuple[int, np.ndarray]]:
  """(padded length, rows) per batch; every batch holds rows of one length bucket.

  With `rng` (training): rows are shuffled within their bucket, then the
  batches are shuffled, so an epoch sees every row once in a random order of
  same-length batches. Without (evaluation): shortest first. The number of
  batches depends only on the bucket sizes, so it is the same every epoch.
  """
  bucket_lengths = np.asarray(bucket_lengths)
  bucket_N = bucket_lengths[np.searchsorted(bucket_lengths, lengths_N)]
  order = np.argsort(lengths_N, kind="stable") if rng is None else rng.permutation(len(lengths_N))
  batches = []
  for L in bucket_lengths:
    rows = order[bucket_N[order] == L]
    batches += [(int(L), rows[i:i + batch_size]) for i in range(0, len(rows), batch_size)]
  if rng is not None:
    batches = [batches[i] for i in rng.permutation(len(batches))]
  return batches


def pad_batch(split: Split, rows: np.ndarray, L: int, B: int) -> dict[str, np.ndarray]:
  """ids/segments/mask [B, L], labels/weights [B]; filler rows have weight 0."""
  ids_BxL = np.zeros((B, L), np.int32)
  segments_BxL = np.zeros((B, L), np.int32)
  mask_BxL = np.zeros((B, L), np.int32)
  labels_B = np.zeros((B,), split.labels_N.dtype)
  weights_B = np.zeros((B,), np.float32)
  for j, r in enumerate(rows):
    T = split.lengths_N[r]
    ids_BxL[j, :T] = split.ids[r]
    segments_BxL[j, :T] = split.segments[r]
    mask_BxL[j, :T] = 1
  labels_B[:len(rows)] = split.labels_N[rows]
  weights_B[:len(rows)] = 1.0
  return {"ids": ids_BxL, "segments": segments_BxL, "mask": mask_BxL, "labels": labels_B,
          "weights": weights_B}


# ----------------------------------------------------------------------------
# Results


@dataclasses.dataclass
class RunResult:
  learning_rate: float
  seed: int
  metrics: dict  # {eval split: {metric: value}} after the last epoch
  per_epoch: list  # [{eval split: {metric: value}}] after each epoch
  train_loss: float  # mean over the last epoch's steps (skipped steps left out)
  steps: int
  skipped_steps: int  # non-finite loss or gradient (optim.skip_nonfinite)
  seconds: float

  def to_json(self) -> dict:
    return dataclasses.asdict(self)


def median(values: Sequence[float]) -> float:
  return float(np.median(np.asarray(values, np.float64)))


def summarize(task: tasks_lib.Task, runs: Sequence[RunResult]) -> dict:
  """Medians over seeds per learning rate; the best learning rate and the best run.

  Selection is by the task's first metric on its first eval split (MNLI:
  matched accuracy), the median over seeds for the learning rate.
  """
  split, metric = task.eval_splits[0], task.metric_names[0]
  by_lr: dict[float, list[RunResult]] = {}
  for r in runs:
    by_lr.setdefault(r.learning_rate, []).append(r)
  medians = {lr: {s: {m: median([r.metrics[s][m] for r in rs]) for m in task.metric_names}
                  for s in task.eval_splits} for lr, rs in by_lr.items()}
  # NaN (e.g. a correlation of constant predictions) never wins.
  score = lambda v: v if math.isfinite(v) else -math.inf
  best_lr = max(medians, key=lambda lr: score(medians[lr][split][metric]))
  best_run = max(runs, key=lambda r: score(r.metrics[split][metric]))
  return {"selection": {"split": split, "metric": metric},
          "median_by_learning_rate": [{"learning_rate": lr, "metrics": m,
                                       "seeds": [r.seed for r in by_lr[lr]]}
                                      for lr, m in medians.items()],
          "best_learning_rate": best_lr, "best": medians[best_lr],
          "best_run": {"learning_rate": best_run.learning_rate, "seed": best_run.seed,
                       "metrics": best_run.metrics}}


def format_table(results: dict) -> str:
  """The console report: every run, the medians per learning rate, the best."""
  splits, names = results["eval_splits"], results["metric_names"]
  cols = [(s, m) for s in splits for m in names]
  head = [f"{s} {m}" if len(splits) > 1 or s != "dev" else m for s, m in cols]
  width = [max(9, len(h)) for h in head]
  fmt = lambda values: "  ".join(f"{v:>{w}.4f}" for v, w in zip(values, width))
  lines = [f"{'lr':>8}  {'seed':>4}  {'loss':>7}  " + "  ".join(
      f"{h:>{w}}" for h, w in zip(head, width))]
  for r in results["runs"]:
    lines.append(f"{r['learning_rate']:>8.1e}  {r['seed']:>4}  {r['train_loss']:>7.4f}  "
                 + fmt([r["metrics"][s][m] for s, m in cols]))
  summary = results["summary"]
  for row in summary["median_by_learning_rate"]:
    lines.append(f"{row['learning_rate']:>8.1e}  {'med':>4}  {'':>7}  "
                 + fmt([row["metrics"][s][m] for s, m in cols]))
  sel = summary["selection"]
  best = summary["best"]
  lines.append(
      f"best learning rate {summary['best_learning_rate']:g} (by the median of "
      f"{sel['split']} {sel['metric']} over {len(results['recipe']['seeds'])} seed(s)): "
      + ", ".join(f"{s} {m} {best[s][m]:.4f}" for s, m in cols))
  return "\n".join(lines)


def write_json_atomic(path: str, obj: Any) -> None:
  tmp = os.path.join(os.path.dirname(os.path.abspath(path)),
                     f".{os.path.basename(path)}.tmp-{os.getpid()}")
  try:
    with open(tmp, "w", encoding="utf-8") as f:
      json.dump(obj, f, indent=2, allow_nan=True)
      f.write("\n")
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def _run_name(lr: float, seed: int) -> str:
  return f"lr{lr:g}_seed{seed}"


# ----------------------------------------------------------------------------
# The fine-tuner


class FineTuner:
  """One task and one checkpoint: its data encoded once, its steps compiled once per bucket."""

  def __init__(self, params: Any, config: BertConfig, tokenizer: Tokenizer,
               task: tasks_lib.Task, recipe: Recipe, *, meta: Optional[dict] = None,
               devices: Optional[Sequence[Any]] = None):
    """`params` is the BertModel tree (a pre-training tree's params["bert"])."""
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
    self._base = jax.device_get(params)  # each run starts from a fresh copy
    self._rep = sharding.replicated(self.mesh)
    self._bs = sharding.batch_sharding(self.mesh)
    self._compile()
    self.compiled_lengths: set = set()  # (kind, padded length) of every program used so far

  @classmethod
  def from_checkpoint(cls, path: str, task: tasks_lib.Task, recipe: Recipe, *,
                      step: Optional[int] = None,
                      devices: Optional[Sequence[Any]] = None) -> FineTuner:
    params, config, tokenizer, meta = features.load_checkpoint(path, step, devices=devices)
    meta = {**meta, "checkpoint": os.path.abspath(path)}
    return cls(params, config, tokenizer, task, recipe, meta=meta, devices=devices)

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
    return self._put_replicated({"bert": self._base, "classifier": head})

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
            f"{self.config.dtype}, {self.mesh.shape[sharding.DATA]} device(s)")

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
      os.makedirs(output_dir, exist_ok=True)
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
            reporter = (Reporter(os.path.join(output_dir, "runs", _run_name(lr, seed)))
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
    results = {
        "task": self.task.name, "kind": self.task.kind, "labels": list(self.task.labels),
        "metric_names": list(self.task.metric_names),
        "eval_splits": list(self.task.eval_splits),
        "checkpoint": self.meta.get("checkpoint"),
        "recipe": {**dataclasses.asdict(r), "max_length": self.max_length,
                   "dtype": self.config.dtype, "steps_per_epoch": self.steps_per_epoch,
                   "num_steps": self.num_steps, "warmup_steps": self.warmup_steps},
        "num_examples": {"train": len(self.train_split),
                         **{n: len(s) for n, s in self.eval_data.items()}},
        "devices": self.mesh.devices.size, "platform": jax.devices()[0].platform,
        "seconds": time.perf_counter() - started,
        "runs": [x.to_json() for x in runs],
        "summary": summarize(self.task, runs),
    }
    if writes:
      write_json_atomic(os.path.join(output_dir, RESULTS_FILE), results)
    return results

  # --- saving ---

  def save_meta(self, results: dict) -> dict:
    """The meta of the saved fine-tuned checkpoint: convert to-hf reads `classifier`."""
    kind = self.task.kind
    labels = list(self.task.labels) if kind == "classification" else []
    run = self.best_run
    return {"model_config": self.config.to_dict(), "vocab": self.tokenizer.vocab,
            "lowercase": self.tokenizer.lowercase, "step": run.steps,
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
    (atomically); `python -m bert_jax.io.convert to-hf` exports it as
    BertForSequenceClassification. Returns the step folder."""
    from bert_jax.io import convert
    if self.best_params is None:
      raise ConfigError("save: no fine-tuned run to save; run sweep first")
    meta = self.save_meta(results)
    with convert._atomic_output_dir(directory, overwrite) as tmp:  # pylint: disable=protected-access
      checkpointing.save_params(tmp, meta["step"], self.best_params, meta)
    return os.path.join(os.path.abspath(directory), "checkpoints", str(meta["step"]))
