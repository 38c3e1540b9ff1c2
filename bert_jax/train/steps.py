"""The step maths of pre-training: sharded state, the jitted train and eval steps.

Each step is jitted once per phase, with its shardings and the parameters and
optimizer state donated. Randomness is a pure function of (seed, step):
masking and dropout keys come from `fold_in(train_key, step)`.

The objective (`config.objective`) sets the second loss term: 'mlm+nsp'
adds next-sentence prediction; 'mlm+sop' adds sentence-order prediction
through the same 2-way head and loss (the model's `nsp` head is reused:
label 0 = in order, 1 = swapped), reported as sop_*; 'mlm' adds nothing,
so the NSP head and the pooler get no gradient (weight decay still shrinks
them; they stay in the parameters, so every checkpoint has one structure)
and no nsp_* metric is reported.

Shape legend: B global batch, L sequence length, P max predictions, A gradient
accumulation steps, b = B / A micro-batch, V padded vocabulary.
"""

import dataclasses
from typing import Any, Callable, Iterable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from bert_jax.parallel import sharding
from bert_jax.model import losses, masking, precision, splash
from bert_jax.model import build
from bert_jax.train import optim
from bert_jax.errors import ConfigError
from bert_jax.settings.model import ModelConfig
from bert_jax.data.pretraining_data import Batch
from bert_jax.settings.data import OBJECTIVES
from bert_jax.data.tokenizer import SpecialIds
from bert_jax.settings import Phase, Settings

# Metric prefix of the 2-way head's task per objective; None: MLM alone.
HEAD_TASK = {"mlm+nsp": "nsp", "mlm": None, "mlm+sop": "sop"}
assert set(HEAD_TASK) == set(OBJECTIVES)


class TrainSteps:
  """The model, optimizer, shardings and compiled steps of one run."""

  def __init__(self, s: Settings, vocab_size: int, special: SpecialIds, mesh: Mesh,
               is_continuation_V: Optional[np.ndarray] = None):
    """The steps of a run with settings `s` on a vocabulary of `vocab_size` tokens whose
    special ids are `special`, compiled for `mesh`; `is_continuation_V` marks WordPiece
    continuations (whole-word masking)."""
    if s.objective not in HEAD_TASK:
      raise ConfigError(f"--config.objective={s.objective!r}: expected one of "
                        f"{', '.join(OBJECTIVES)}")
    self.head_task = HEAD_TASK[s.objective]
    self.bert_config = s.model_config(vocab_size)
    self.model = build.pretraining_model(self.bert_config)
    # ModernBERT's context extension: the global RoPE base of each phase (() or 0: the
    # model's). The parameters are the same in every phase; only the model applied differs.
    self.phase_thetas = (tuple(ph.rope_theta for ph in s.train.phases)
                         if any(ph.rope_theta for ph in s.train.phases) else ())
    self._models = {0.0: self.model}
    self.phases = s.train.phases  # what each step function is compiled for
    self.tx, self.schedule = optim.make_optimizer(s.optimizer)
    self.mesh = mesh
    # The platform the steps are compiled for (a TPU mesh on a CPU host is TPU).
    self.platform = mesh.devices.flat[0].platform
    self.rules = sharding.logical_rules(s.mesh.param_sharding)
    self.grad_accum_steps = s.train.grad_accum_steps
    self.mask_prob = s.masking.mask_prob
    self.special = SpecialIds(*special)
    # Packed rows (data/packing): each [CLS] starts a document.
    self.packed = s.data.packing
    self.is_continuation = (jnp.asarray(is_continuation_V) if s.masking.whole_word
                            else None)
    self.train_key, self.eval_key = jax.random.split(jax.random.key(s.run.seed))
    self._init_shardings()
    self._steps: dict = {}

  def _init_shardings(self):
    boxed = build.abstract_params(self.bert_config)
    self.param_shardings = sharding.tree_shardings(boxed, self.mesh, self.rules)
    abstract_params = nn.meta.unbox(boxed)
    abstract_opt = jax.eval_shape(self.tx.init, abstract_params)
    rep = sharding.replicated(self.mesh)
    self.opt_shardings = optax.tree_map_params(
        self.tx, lambda _, s: s, abstract_opt, self.param_shardings,
        transform_non_params=lambda _: rep)
    self.abstract_params = sharding.with_shardings(abstract_params, self.param_shardings)
    self.abstract_opt_state = sharding.with_shardings(abstract_opt, self.opt_shardings)

  def reset_moments(self, params, opt_state) -> Any:
    """`opt_state` with fresh moments (optim.reset_moments), in its shardings."""
    if "reset" not in self._steps:
      self._steps["reset"] = jax.jit(
          lambda p, st: optim.reset_moments(st, self.tx.init(p)),
          in_shardings=(self.param_shardings, self.opt_shardings),
          out_shardings=self.opt_shardings, donate_argnums=(1,))
    return self._steps["reset"](params, opt_state)

  def init_state(self) -> tuple[Any, Any]:
    """Fresh (params, opt_state), created directly in their shardings."""
    init = jax.jit(lambda k: build.init_params(self.bert_config, k),
                   out_shardings=self.param_shardings)
    params = init(jax.random.fold_in(self.train_key, 2**31 - 1))
    opt_state = jax.jit(self.tx.init, out_shardings=self.opt_shardings)(params)
    return params, opt_state

  def _mask(self, key, batch: Batch, max_predictions, mask_prob=None):
    # Prepared rows are padded with 0; a vocabulary whose [PAD] is another id (a published
    # ModernBERT's tokenizer.json) gets its own: padding is never a masking candidate and
    # the model sees what its reference would. With [PAD] = 0 nothing changes.
    ids_BxL = jnp.asarray(batch.input_ids_BxL)
    if self.special.pad != 0:
      ids_BxL = jnp.where(batch.input_mask_BxL > 0, ids_BxL, self.special.pad)
    return masking.mask_tokens(
        key, ids_BxL, vocab_size=self.bert_config.vocab_size, mask_id=self.special.mask,
        special_ids=self.special, max_predictions=max_predictions,
        mask_prob=self.mask_prob if mask_prob is None else mask_prob,
        is_continuation_V=self.is_continuation)

  def config_at(self, phase_index: int) -> ModelConfig:
    """The model config phase `phase_index` trains (its RoPE base; what its checkpoints'
    meta records, so features and exports of a step use the base it was trained with)."""
    theta = self.phase_thetas[min(phase_index, len(self.phase_thetas) - 1)] if (
        self.phase_thetas) else 0.0
    return self._config_with(theta)

  def _config_with(self, rope_theta: float) -> ModelConfig:
    if not rope_theta:
      return self.bert_config
    return dataclasses.replace(self.bert_config, global_rope_theta=float(rope_theta))

  def _model_for(self, rope_theta: float):
    if rope_theta not in self._models:
      self._models[rope_theta] = build.pretraining_model(self._config_with(rope_theta))
    return self._models[rope_theta]

  def _sums(self, params, batch: Batch, masked, dropout_key, deterministic, rope_theta=0.0):
    documents_BxL = None
    if self.packed:  # from the ids before masking: it may draw [CLS] at random
      documents_BxL = jnp.cumsum(batch.input_ids_BxL == self.special.cls, axis=1,
                                 dtype=jnp.int32)
    # The mixed dots' layout; splash's shard_map over the step's mesh.
    with precision.target_platform(self.platform), splash.sharded_over(self.mesh):
      out = self._model_for(rope_theta).apply(
          {"params": params}, masked.ids_BxL, batch.segment_ids_BxL, batch.input_mask_BxL,
          masked.positions_BxP, deterministic=deterministic, documents_BxL=documents_BxL,
          rngs=None if deterministic else {"dropout": dropout_key})
    return (losses.mlm_sums(out.mlm_logits_BxPxV, masked.labels_BxP, masked.weights_BxP),
            losses.nsp_sums(out.nsp_logits_Bx2, batch.next_sentence_label_B,
                            batch.example_mask_B))

  def _grads(self, params, batch: Batch, masked, dropout_key, mlm_n, nsp_n, rope_theta):
    """(loss, (mlm, nsp)), grads of the whole batch, accumulated over A micro-batches."""
    def loss_fn(p, micro, m, k):
      mlm, nsp = self._sums(p, micro, m, k, deterministic=False, rope_theta=rope_theta)
      if self.head_task is None:  # 'mlm': the head's loss is computed but not trained on
        return mlm.loss / mlm_n, (mlm, nsp)
      return mlm.loss / mlm_n + nsp.loss / nsp_n, (mlm, nsp)

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    accum = self.grad_accum_steps
    if accum == 1:
      return grad_fn(params, batch, masked, dropout_key)
    # Micro-batch i takes rows i, i+A, i+2A, ...: each device keeps its rows.
    split = lambda x: jnp.moveaxis(x.reshape(x.shape[0] // accum, accum, *x.shape[1:]), 1, 0)
    micro_all = jax.tree.map(split, (batch, masked))

    def body(carry, xs):
      i, (micro, m) = xs
      (l, (mlm_i, nsp_i)), g = grad_fn(params, micro, m, jax.random.fold_in(dropout_key, i))
      return jax.tree.map(jnp.add, carry, (l, (mlm_i, nsp_i), g)), None

    zero = jax.tree.map(jnp.zeros_like, (jnp.float32(0), (
        losses.Sums(*(jnp.float32(0),) * 3),) * 2, params))
    (loss, (mlm, nsp), grads), _ = jax.lax.scan(body, zero, (jnp.arange(accum), micro_all))
    return (loss, (mlm, nsp)), grads

  def train_step_fn(self, phase: Phase) -> Callable:
    """The jitted step of `phase`: (params, opt_state, step, batch) -> new state, metrics.
    The phase gives its predictions per row, its RoPE base and its masking rate (constant,
    or a ramp over its steps). Phases that compute alike share one executable."""
    max_predictions, rope_theta = phase.max_predictions, phase.rope_theta
    a, b = phase.mask_start or self.mask_prob, phase.mask_end or self.mask_prob
    ramp = (phase.start, phase.end, a, b) if a != b else (0, 0, a, a)
    key = ("train", max_predictions, rope_theta, ramp)
    if key in self._steps:
      return self._steps[key]

    def step_fn(params, opt_state, step, batch: Batch):
      key = jax.random.fold_in(self.train_key, step)
      mask_key, dropout_key = jax.random.split(key)
      mask_prob = _mask_prob(ramp, step, self.mask_prob)
      # Mask the whole batch first: the loss is normalised by the global
      # number of predictions, so accumulated gradients equal one big batch.
      masked = self._mask(mask_key, batch, max_predictions, mask_prob)
      mlm_n = jnp.maximum(masked.weights_BxP.sum(), 1.0)
      nsp_n = float(batch.input_ids_BxL.shape[0])
      (loss, (mlm, nsp)), grads = self._grads(params, batch, masked, dropout_key, mlm_n, nsp_n,
                                              rope_theta)
      # A non-finite loss or gradient yields a zero update and keeps the
      # optimizer state (optim.skip_nonfinite): the step changes nothing.
      updates, opt_state = self.tx.update(grads, opt_state, params, loss=loss)
      params = optax.apply_updates(params, updates)
      ok = opt_state.streak == 0
      good = lambda x: jnp.where(ok, x, 0.0)  # a skipped step's NaNs stay out of the averages
      metrics = {"loss": good(loss), "mlm_loss": good(mlm.loss),
                 "mlm_correct": good(mlm.correct), "mlm_count": good(mlm.count),
                 **self._head_sums(nsp, good), "grad_norm": good(optax.tree.norm(grads)),
                 "learning_rate": self.schedule(step), "mask_prob": jnp.float32(mask_prob),
                 "skipped": 1.0 - ok.astype(jnp.float32),
                 "nonfinite_streak": opt_state.streak, "skipped_total": opt_state.skipped}
      return params, opt_state, metrics

    bs = sharding.batch_sharding(self.mesh)
    rep = sharding.replicated(self.mesh)
    jitted = jax.jit(step_fn, in_shardings=(self.param_shardings, self.opt_shardings, rep, bs),
                     out_shardings=(self.param_shardings, self.opt_shardings, rep),
                     donate_argnums=(0, 1))
    self._steps[key] = jitted
    return jitted

  @staticmethod
  def memory_plan(step_fn: Callable, *args) -> Optional[int]:
    """Bytes per device XLA plans for the jitted `step_fn` on these arguments (what
    `python -m bert_jax.plan` reports for the config). Compiled ahead of time here, the
    jitted step's next call finds the executable in JAX's cache: it costs a trace."""
    return planned_bytes(step_fn.lower(*args).compile())

  def _head_sums(self, sums: losses.Sums, f: Callable = lambda x: x) -> dict:
    """The 2-way head's sums named by its task (nsp_* or sop_*); none for 'mlm'."""
    task = self.head_task
    if task is None:
      return {}
    return {f"{task}_loss": f(sums.loss), f"{task}_correct": f(sums.correct),
            f"{task}_count": f(sums.count)}

  def params_finite(self, params) -> bool:
    """True if no parameter is NaN or inf (checked before every checkpoint)."""
    if "finite" not in self._steps:
      self._steps["finite"] = jax.jit(lambda p: jnp.all(jnp.stack(
          [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(p)])))
    return bool(self._steps["finite"](params))

  def eval_step_fn(self, phase: Phase, mask_prob: Optional[float] = None) -> Callable:
    """The jitted evaluation of `phase`'s batches (its predictions and RoPE base), masked at
    `mask_prob` (None: the run's rate)."""
    max_predictions, rope_theta = phase.max_predictions, phase.rope_theta
    # The run's rate asked for by value or as None: one executable, not two.
    mask_prob = self.mask_prob if mask_prob is None else float(mask_prob)
    key = ("eval", max_predictions, rope_theta, mask_prob)
    if key in self._steps:
      return self._steps[key]
    vocab = self.bert_config.padded_vocab_size

    def step_fn(params, index, batch: Batch):
      masked = self._mask(jax.random.fold_in(self.eval_key, index), batch,
                          max_predictions, mask_prob)
      mlm, nsp = self._sums(params, batch, masked, None, deterministic=True,
                            rope_theta=rope_theta)
      # Label histogram: the best constant guess is the chance level to beat.
      hist_V = jnp.zeros(vocab, jnp.float32).at[masked.labels_BxP].add(masked.weights_BxP)
      return {"mlm_loss": mlm.loss, "mlm_correct": mlm.correct, "mlm_count": mlm.count,
              **self._head_sums(nsp), "label_hist": hist_V}

    bs = sharding.batch_sharding(self.mesh)
    rep = sharding.replicated(self.mesh)
    jitted = jax.jit(step_fn, in_shardings=(self.param_shardings, rep, bs), out_shardings=rep)
    self._steps[key] = jitted
    return jitted

  def evaluate(self, params, batches: Iterable[Batch], phase: Phase, max_batches: int = 0,
               mask_prob: Optional[float] = None) -> dict:
    """Eval metrics over `phase`'s `batches`, masked at `mask_prob` (None: the run's
    rate), which the result records as `mask_prob`."""
    step = self.eval_step_fn(phase, mask_prob)
    total = None
    for i, local in enumerate(batches):
      if max_batches and i >= max_batches:
        break
      out = step(params, jnp.int32(i), sharding.global_batch(local, self.mesh))
      total = out if total is None else jax.tree.map(jnp.add, total, out)
    if total is None:
      raise ConfigError("evaluation split is empty: expected at least one eval batch")
    t = jax.device_get(total)
    counts = {f"{k}_count": float(t[f"{k}_count"]) for k in ("mlm", "nsp", "sop")
              if f"{k}_count" in t}  # for standard errors
    return summarize(t) | counts | {
        "mlm_best_constant_accuracy": float(t["label_hist"].max() / max(t["mlm_count"], 1.0)),
        "mask_prob": float(self.mask_prob if mask_prob is None else mask_prob)}


def _mask_prob(ramp: Optional[tuple], step, default: float):
  """The masking rate of `step`: a Python float where it is constant (the step as before
  rates could change), else the linear ramp (start, end, first, last) over the phase's
  steps, as settings.Phase.mask_prob_at computes it."""
  if ramp is None or ramp[2] == ramp[3]:
    return default if ramp is None else ramp[2]
  start, end, a, b = ramp
  frac = jnp.clip((step - start).astype(jnp.float32) / max(end - start - 1, 1), 0.0, 1.0)
  return a + (b - a) * frac


def planned_bytes(compiled) -> Optional[int]:
  """A compiled step's memory per device: arguments and outputs (less what donation
  aliases), temporaries and code; None where the backend gives no analysis."""
  mem = compiled.memory_analysis()
  if mem is None:
    return None
  return int(mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
             + mem.temp_size_in_bytes + mem.generated_code_size_in_bytes)


def summarize(sums: dict) -> dict:
  """(sum, count) metrics -> means; nsp_* / sop_* only when the sums have them."""
  mlm_n = max(float(sums["mlm_count"]), 1.0)
  out = {"mlm_loss": float(sums["mlm_loss"]) / mlm_n,
         "mlm_accuracy": float(sums["mlm_correct"]) / mlm_n}
  loss = out["mlm_loss"]
  for task in ("nsp", "sop"):
    if f"{task}_count" in sums:
      n = max(float(sums[f"{task}_count"]), 1.0)
      out[f"{task}_loss"] = float(sums[f"{task}_loss"]) / n
      out[f"{task}_accuracy"] = float(sums[f"{task}_correct"]) / n
      loss = loss + out[f"{task}_loss"]
  out["loss"] = loss
  return out


def make_steps(s: Settings, vocab_size: int, special: SpecialIds,
               is_continuation_V=None, mesh=None) -> TrainSteps:
  """The compiled-step owner of a run with these settings and vocabulary."""
  if mesh is None:  # a caller that passes a mesh has checked the batch against it
    mesh = sharding.make_mesh(s.mesh.model_parallel)
    for batch, field in s.train.batch_fields():  # every phase's global batch
      sharding.check_batch(batch, mesh, s.train.grad_accum_steps, field)
  return TrainSteps(s, vocab_size, special, mesh, is_continuation_V)
