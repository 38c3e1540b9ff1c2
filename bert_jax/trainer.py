"""Pre-training loop: sharded state, one jitted step per phase, eval, checkpoints.

Shape legend: B global batch, L sequence length, P max predictions, A gradient
accumulation steps, b = B / A micro-batch, V padded vocabulary.
"""

import dataclasses
import json
import os
import re
import signal
import sys
import threading
import time
from typing import Any, Callable, Iterator, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from bert_jax import checkpointing, losses, masking, optim, sharding
from bert_jax.errors import BertJaxError, CheckpointError, ConfigError, NonFiniteError, Preempted
from bert_jax.model import BertConfig, BertForPreTraining


@dataclasses.dataclass(frozen=True)
class Phase:
  index: int
  start: int  # first step (inclusive)
  end: int  # last step (exclusive)
  seq_len: int
  max_predictions: int


def phases_from_config(config: ml_collections.ConfigDict) -> list[Phase]:
  t = config.train
  fractions, lens, preds = tuple(t.phase_fractions), tuple(t.seq_lens), tuple(t.max_predictions)
  if not (len(fractions) == len(lens) == len(preds)) or not fractions:
    raise ConfigError(
        "config.train.phase_fractions, seq_lens and max_predictions: expected tuples "
        f"of one equal length, got {fractions}, {lens}, {preds}")
  if any(f <= 0 for f in fractions) or abs(sum(fractions) - 1.0) > 1e-6:
    raise ConfigError(f"config.train.phase_fractions={fractions}: expected positive "
                      "fractions summing to 1")
  for name, values in (("seq_lens", lens), ("max_predictions", preds)):
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
      raise ConfigError(f"config.train.{name}={values}: expected integers, e.g. '(128,512)'")
  out, start, acc = [], 0, 0.0
  for i, (f, seq_len, p) in enumerate(zip(fractions, lens, preds)):
    if seq_len > config.model.max_position_embeddings:
      raise ConfigError(
          f"config.train.seq_lens[{i}]={seq_len} is above "
          f"config.model.max_position_embeddings={config.model.max_position_embeddings}; "
          "expected at most that")
    if seq_len < 8 or not 0 < p <= seq_len:
      raise ConfigError(f"config.train.seq_lens[{i}]={seq_len}, max_predictions[{i}]={p}: "
                        "expected seq_len >= 8 and 0 < max_predictions <= seq_len")
    acc += f
    end = t.num_steps if i == len(fractions) - 1 else int(round(acc * t.num_steps))
    out.append(Phase(i, start, end, int(seq_len), int(p)))
    start = end
  return [ph for ph in out if ph.end > ph.start]


def model_config(config: ml_collections.ConfigDict, vocab_size: int) -> BertConfig:
  m = config.model
  return BertConfig(
      vocab_size=vocab_size, hidden_size=m.hidden_size, num_layers=m.num_layers,
      num_heads=m.num_heads, intermediate_size=m.intermediate_size,
      max_position_embeddings=m.max_position_embeddings, type_vocab_size=m.type_vocab_size,
      dropout_rate=m.dropout_rate, attention_dropout_rate=m.attention_dropout_rate,
      layer_norm_eps=m.layer_norm_eps, initializer_range=m.initializer_range,
      gelu_approximate=m.gelu_approximate, vocab_pad_multiple=m.vocab_pad_multiple,
      dtype=m.dtype, remat=m.remat, dropout_rng=m.dropout_rng).validate()


def validate_config(config: ml_collections.ConfigDict) -> list[Phase]:
  """Everything that can be checked before any file is written."""
  model_config(config, vocab_size=max(1, config.data.vocab_size))
  if config.train.batch_size <= 0:
    raise ConfigError(f"config.train.batch_size={config.train.batch_size}: expected > 0")
  for name in ("log_every", "eval_every", "checkpoint_every", "keep_checkpoints"):
    if config[name] <= 0:
      raise ConfigError(f"config.{name}={config[name]}: expected a positive integer")
  if config.train.max_consecutive_nonfinite <= 0:
    raise ConfigError(f"config.train.max_consecutive_nonfinite="
                      f"{config.train.max_consecutive_nonfinite}: expected a positive integer")
  if not 0.0 < config.masking.mask_prob < 1.0:
    raise ConfigError(f"config.masking.mask_prob={config.masking.mask_prob}: expected 0 < p < 1")
  optim.make_optimizer(config.train)
  return phases_from_config(config)


# ----------------------------------------------------------------------------
# State


class Trainer:
  """Owns the mesh, model, optimizer, shardings and compiled steps of one run."""

  def __init__(self, config: ml_collections.ConfigDict, bert_config: BertConfig,
               special_ids: list[int], mask_id: int,
               is_continuation: Optional[np.ndarray] = None, mesh=None):
    self.config = config
    self.bert_config = bert_config
    self.model = BertForPreTraining(bert_config)
    self.tx, self.schedule = optim.make_optimizer(config.train)
    self.mesh = mesh or sharding.make_mesh(config.mesh.model_parallel)
    self.rules = sharding.logical_rules(config.mesh.param_sharding)
    sharding.check_batch(config.train.batch_size, self.mesh, config.train.grad_accum_steps)
    self.special_ids = list(special_ids)
    self.mask_id = mask_id
    self.is_continuation = (None if not config.masking.whole_word
                            else jnp.asarray(is_continuation))
    self.train_key, self.eval_key = jax.random.split(jax.random.key(config.seed))
    self._init_shardings()
    self._steps: dict = {}

  def _boxed_init(self, key):
    ids = jnp.zeros((1, 8), jnp.int32)
    variables = self.model.init({"params": key, "dropout": key}, ids, ids, ids,
                                jnp.zeros((1, 1), jnp.int32))
    return variables["params"]

  def _init_shardings(self):
    boxed = jax.eval_shape(self._boxed_init, self.train_key)
    with nn.logical_axis_rules(self.rules):
      self.param_shardings = sharding.tree_shardings(boxed, self.mesh, self.rules)
    abstract_params = nn.meta.unbox(boxed)
    abstract_opt = jax.eval_shape(self.tx.init, abstract_params)
    rep = sharding.replicated(self.mesh)
    self.opt_shardings = optax.tree_map_params(
        self.tx, lambda _, s: s, abstract_opt, self.param_shardings,
        transform_non_params=lambda _: rep)
    add = lambda tree, shard: jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), tree, shard)
    self.abstract_params = add(abstract_params, self.param_shardings)
    self.abstract_opt_state = add(abstract_opt, self.opt_shardings)

  def init_state(self) -> tuple[Any, Any]:
    """Fresh (params, opt_state), created directly in their shardings."""
    init = jax.jit(lambda k: nn.meta.unbox(self._boxed_init(k)),
                   out_shardings=self.param_shardings)
    params = init(jax.random.fold_in(self.train_key, 2**31 - 1))
    opt_state = jax.jit(self.tx.init, out_shardings=self.opt_shardings)(params)
    return params, opt_state

  # --------------------------------------------------------------------------
  # Steps

  def _mask(self, key, ids_BxL, max_predictions):
    return masking.mask_tokens(
        key, ids_BxL, vocab_size=self.bert_config.vocab_size, mask_id=self.mask_id,
        special_ids=self.special_ids, max_predictions=max_predictions,
        mask_prob=self.config.masking.mask_prob, is_continuation_V=self.is_continuation)

  def _sums(self, params, batch, masked, dropout_key, deterministic):
    out = self.model.apply(
        {"params": params}, masked.ids_BxL, batch["segment_ids"], batch["input_mask"],
        masked.positions_BxP, deterministic=deterministic,
        rngs=None if deterministic else {"dropout": dropout_key})
    nsp_w = batch.get("example_mask", jnp.ones(batch["input_ids"].shape[0], jnp.float32))
    return (losses.mlm_sums(out.mlm_logits_BxPxV, masked.labels_BxP, masked.weights_BxP),
            losses.nsp_sums(out.nsp_logits_Bx2, batch["next_sentence_label"], nsp_w))

  def train_step_fn(self, max_predictions: int) -> Callable:
    """The jitted step for one phase: (params, opt_state, step, batch) -> new state, metrics."""
    if max_predictions in self._steps:
      return self._steps[max_predictions]
    accum = self.config.train.grad_accum_steps

    def step_fn(params, opt_state, step, batch):
      key = jax.random.fold_in(self.train_key, step)
      mask_key, dropout_key = jax.random.split(key)
      # Mask the whole batch first: the loss is normalised by the global
      # number of predictions, so accumulated gradients equal one big batch.
      masked = self._mask(mask_key, batch["input_ids"], max_predictions)
      mlm_n = jnp.maximum(masked.weights_BxP.sum(), 1.0)
      nsp_n = float(batch["input_ids"].shape[0])

      def loss_fn(p, micro, m, k):
        mlm, nsp = self._sums(p, micro, m, k, deterministic=False)
        return mlm.loss / mlm_n + nsp.loss / nsp_n, (mlm, nsp)

      grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
      if accum == 1:
        (loss, (mlm, nsp)), grads = grad_fn(params, batch, masked, dropout_key)
      else:
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
      # A non-finite loss or gradient yields a zero update and keeps the
      # optimizer state (optim.skip_nonfinite): the step changes nothing.
      updates, opt_state = self.tx.update(grads, opt_state, params, loss=loss)
      params = optax.apply_updates(params, updates)
      ok = opt_state.streak == 0
      good = lambda x: jnp.where(ok, x, 0.0)  # a skipped step's NaNs stay out of the averages
      metrics = {"loss": good(loss), "mlm_loss": good(mlm.loss),
                 "mlm_correct": good(mlm.correct), "mlm_count": good(mlm.count),
                 "nsp_loss": good(nsp.loss), "nsp_correct": good(nsp.correct),
                 "nsp_count": good(nsp.count), "grad_norm": good(optax.tree.norm(grads)),
                 "learning_rate": self.schedule(step), "skipped": 1.0 - ok.astype(jnp.float32),
                 "nonfinite_streak": opt_state.streak, "skipped_total": opt_state.skipped}
      return params, opt_state, metrics

    bs = sharding.batch_sharding(self.mesh)
    rep = sharding.replicated(self.mesh)
    jitted = jax.jit(step_fn, in_shardings=(self.param_shardings, self.opt_shardings, rep, bs),
                     out_shardings=(self.param_shardings, self.opt_shardings, rep),
                     donate_argnums=(0, 1))
    self._steps[max_predictions] = jitted
    return jitted

  def params_finite(self, params) -> bool:
    """True if no parameter is NaN or inf (checked before every checkpoint)."""
    if "finite" not in self._steps:
      self._steps["finite"] = jax.jit(lambda p: jnp.all(jnp.stack(
          [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(p)])))
    return bool(self._steps["finite"](params))

  def eval_step_fn(self, max_predictions: int) -> Callable:
    key = ("eval", max_predictions)
    if key in self._steps:
      return self._steps[key]
    vocab = self.bert_config.padded_vocab_size

    def step_fn(params, index, batch):
      masked = self._mask(jax.random.fold_in(self.eval_key, index), batch["input_ids"],
                          max_predictions)
      mlm, nsp = self._sums(params, batch, masked, None, deterministic=True)
      # Label histogram: the best constant guess is the chance level to beat.
      hist_V = jnp.zeros(vocab, jnp.float32).at[masked.labels_BxP].add(masked.weights_BxP)
      return {"mlm_loss": mlm.loss, "mlm_correct": mlm.correct, "mlm_count": mlm.count,
              "nsp_loss": nsp.loss, "nsp_correct": nsp.correct, "nsp_count": nsp.count,
              "label_hist": hist_V}

    bs = sharding.batch_sharding(self.mesh)
    rep = sharding.replicated(self.mesh)
    jitted = jax.jit(step_fn, in_shardings=(self.param_shardings, rep, bs), out_shardings=rep)
    self._steps[key] = jitted
    return jitted

  def evaluate(self, params, batches: Iterator[dict], max_predictions: int,
               max_batches: int = 0) -> dict:
    step = self.eval_step_fn(max_predictions)
    total = None
    for i, local in enumerate(batches):
      if max_batches and i >= max_batches:
        break
      out = step(params, jnp.int32(i), sharding.global_batch(local, self.mesh))
      total = out if total is None else jax.tree.map(jnp.add, total, out)
    if total is None:
      raise ConfigError("evaluation split is empty: expected at least one eval batch")
    t = jax.device_get(total)
    return summarize(t) | {"mlm_best_constant_accuracy":
                           float(t["label_hist"].max() / max(t["mlm_count"], 1.0))}


def summarize(sums: dict) -> dict:
  """(sum, count) metrics -> means."""
  mlm_n, nsp_n = max(float(sums["mlm_count"]), 1.0), max(float(sums["nsp_count"]), 1.0)
  out = {"mlm_loss": float(sums["mlm_loss"]) / mlm_n,
         "mlm_accuracy": float(sums["mlm_correct"]) / mlm_n,
         "nsp_loss": float(sums["nsp_loss"]) / nsp_n,
         "nsp_accuracy": float(sums["nsp_correct"]) / nsp_n}
  out["loss"] = out["mlm_loss"] + out["nsp_loss"]
  return out


# ----------------------------------------------------------------------------
# The run


def _log(msg: str) -> None:
  if jax.process_index() == 0:
    print(msg, flush=True)


def _warn(msg: str) -> None:
  if jax.process_index() == 0:
    print(msg, file=sys.stderr, flush=True)


def _one_line(e: BaseException, limit: int = 300) -> str:
  """An exception as one short line (Orbax/TensorStore messages span many)."""
  text = " ".join(str(e).split())
  text = text[:limit] + "..." if len(text) > limit else text
  return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _write_reason(e: BaseException) -> str:
  """The OS error behind a failed write (TensorStore reports it inside a long text)."""
  seen = e
  while seen is not None:
    if isinstance(seen, OSError) and seen.errno:
      return f"OSError: [Errno {seen.errno}] {os.strerror(seen.errno)}"
    code = re.search(r"os_error_code='(\d+)'", str(seen))
    if code:
      return f"OSError: [Errno {code.group(1)}] {os.strerror(int(code.group(1)))}"
    seen = seen.__cause__ or seen.__context__
  return _one_line(e)


# Several processes must stop at the same step, so they agree on the stop flag
# with a collective. That waits for the device, so not every step: every
# STOP_SYNC_EVERY steps (one process checks its own flag every step, for free).
STOP_SYNC_EVERY = 10


class _StopSignals:
  """SIGTERM/SIGINT ask the loop to checkpoint the current step and stop.

  Installed only from the main thread (Python runs handlers there); `uninstall`
  puts the previous handlers back. Further signals while the checkpoint is
  written are noted and ignored, so it is never cut short (SIGKILL cannot cut
  it short either: an unfinished Orbax checkpoint is a temporary folder that
  the next run ignores and removes).
  """

  def __init__(self):
    self.signum: Optional[int] = None
    self._previous: dict = {}

  def install(self) -> "_StopSignals":
    if threading.current_thread() is threading.main_thread():
      for sig in (signal.SIGTERM, signal.SIGINT):
        self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def uninstall(self) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, signal.SIG_DFL if handler is None else handler)
    self._previous = {}

  def _handle(self, signum, frame) -> None:
    name = signal.Signals(signum).name
    if self.signum is None:
      self.signum = signum
      msg = f"{name} received: checkpointing the current step, then stopping\n"
    else:
      msg = f"{name} received: already stopping, waiting for the checkpoint to finish\n"
    # os.write, not print: the handler may have interrupted a print.
    os.write(2, msg.encode())


def _prepare_data(config: ml_collections.ConfigDict, workdir: str, phases: list[Phase]):
  from bert_jax import dataset  # data code imports no JAX; keep it out of module import
  cache_dir = config.data.cache_dir or os.path.join(workdir, "prepared")
  seq_lens = sorted({ph.seq_len for ph in phases})
  prepare = lambda data: dataset.prepare(data, seq_lens, cache_dir, config.seed)
  if jax.process_count() == 1:
    return prepare(config.data)
  return _prepare_data_multiprocess(config.data, cache_dir, prepare)


def _prepare_data_multiprocess(data: ml_collections.ConfigDict, cache_dir: str,
                               prepare: Callable) -> Any:
  """Process 0 prepares; the others then use its vocabulary, whatever their storage.

  WordPiece training is not deterministic across processes
  (huggingface/tokenizers#1794), so no other process may train its own: on
  shared storage they load process 0's files; on a host-local cache they
  build the same (seeded) examples from process 0's vocabulary.
  """
  from bert_jax import dataset
  from bert_jax.tokenizer import VOCAB_FILE, Tokenizer
  prepared, error = None, None
  if jax.process_index() == 0:
    try:
      prepared = prepare(data)
    except Exception as e:  # pylint: disable=broad-except
      error = e
  # Every process waits here for process 0's result, and a failure there
  # stops them all instead of leaving them blocked in the next collective.
  if error is not None:
    mine = {"error": f"{type(error).__name__}: {' '.join(str(error).split())}",
            "user_error": isinstance(error, BertJaxError)}
  elif prepared is not None:
    mine = {"key": os.path.basename(prepared.directory), "vocab": prepared.tokenizer.vocab,
            "lowercase": prepared.tokenizer.lowercase}
  else:
    mine = {}  # not process 0: only its message is read
  msg = json.loads(_broadcast_from_process_0(json.dumps(mine)))
  if error is not None:
    raise error
  if "error" in msg:
    cls = BertJaxError if msg["user_error"] else RuntimeError
    raise cls(f"process 0 could not prepare the data: {msg['error']}")
  if jax.process_index() != 0:
    own = os.path.join(os.path.abspath(cache_dir), msg["key"], dataset.TOKENIZER_DIR, VOCAB_FILE)
    if data.vocab_file or os.path.isfile(own):
      prepared = prepare(data)  # process 0's files on shared storage, or this host's own
    else:
      import tempfile
      with tempfile.TemporaryDirectory() as tmp:
        local = data.copy_and_resolve_references()
        local.vocab_file = Tokenizer(msg["vocab"], msg["lowercase"]).save(tmp)
        local.lowercase = msg["lowercase"]
        prepared = prepare(local)
    if prepared.tokenizer.vocab != msg["vocab"]:
      raise ConfigError(
          f"config.data.cache_dir: process {jax.process_index()}'s prepared data "
          f"{prepared.directory} has another vocabulary than process 0's; share the cache "
          "directory between hosts, delete it on this host, or set config.data.vocab_file")
  return prepared


def _broadcast_from_process_0(text: str) -> str:
  """Process 0's `text` on every process (a collective: all must call it)."""
  from jax.experimental import multihost_utils
  data = np.frombuffer(text.encode(), np.uint8)
  n = int(multihost_utils.broadcast_one_to_all(np.int32(data.size)))
  buf = data if jax.process_index() == 0 else np.zeros(n, np.uint8)
  return bytes(np.asarray(multihost_utils.broadcast_one_to_all(buf))).decode()


def _check_resume_compatible(meta: dict, bert_config: BertConfig, ckpt_dir: str) -> None:
  saved = meta.get("model_config", {})
  for k, v in bert_config.to_dict().items():
    if k in ("dropout_rate", "attention_dropout_rate", "dtype", "remat", "dropout_rng"):
      continue  # may change between runs without changing the parameters
    if k in saved and saved[k] != v:
      raise CheckpointError(
          f"checkpoint {ckpt_dir} has model {k}={saved[k]!r} but the config asks for {v!r}; "
          "use another --workdir or the original config")


def _check_workdir(workdir: str) -> None:
  """A workdir that cannot be a directory fails here, not deep inside data preparation."""
  path = os.path.abspath(workdir)
  while not os.path.isdir(path):
    if os.path.lexists(path):
      raise ConfigError(f"--workdir {workdir}: {path} is not a directory; expected a directory "
                        "(created if missing)")
    path = os.path.dirname(path)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Pre-trains from `config` in `workdir`, resuming from its latest checkpoint.

  Returns the final evaluation metrics.
  """
  from bert_jax.reporting import Reporter

  phases = validate_config(config)  # fail before anything is written
  _check_workdir(workdir)
  mesh = sharding.make_mesh(config.mesh.model_parallel)
  sharding.check_batch(config.train.batch_size, mesh, config.train.grad_accum_steps)

  prepared = _prepare_data(config, workdir, phases)
  tok = prepared.tokenizer
  bert_config = model_config(config, tok.vocab_size)
  trainer = Trainer(config, bert_config, tok.special_ids(), tok.mask_id,
                    tok.is_continuation() if config.masking.whole_word else None, mesh)
  n_params = sum(int(np.prod(a.shape)) for a in jax.tree.leaves(trainer.abstract_params))
  _log(f"model: {bert_config.num_layers} layers, hidden {bert_config.hidden_size}, "
       f"{bert_config.num_heads} heads, vocab {tok.vocab_size} -> {n_params / 1e6:.2f}M params; "
       f"{jax.device_count()} {jax.devices()[0].platform} devices"
       + (f" in {jax.process_count()} processes" if jax.process_count() > 1 else "")
       + f", mesh {dict(mesh.shape)}")

  ckpt_dir = os.path.join(workdir, "checkpoints")
  mngr = checkpointing.manager(ckpt_dir, keep=config.keep_checkpoints)
  reporter = Reporter(workdir)
  signals = _StopSignals().install()
  run = _Run(config, trainer, prepared, phases, mngr, reporter, {
      "model_config": bert_config.to_dict(), "vocab": tok.vocab, "lowercase": tok.lowercase,
      "seed": config.seed, "config": json.loads(config.to_json())}, signals)
  try:
    if not run.restore_latest():
      run.params, run.opt_state = trainer.init_state()
      reporter.truncate(0)  # records of an earlier run killed before its first checkpoint
    run.train()
    run.stop_if_requested(sync=True)  # a signal during the last steps
    ev = run.final_eval()
    run.finish_save()
    mngr.close()
  except BaseException:
    run.abandon()  # an interrupted run still finishes the checkpoint it started
    raise
  finally:
    signals.uninstall()
    reporter.close()
  plot = reporter.plot(run.step)
  _log(f"final eval @ step {run.step}: MLM accuracy {ev['mlm_accuracy']:.4f} "
       f"(best constant guess {ev['mlm_best_constant_accuracy']:.4f}), "
       f"NSP accuracy {ev['nsp_accuracy']:.4f}, MLM loss {ev['mlm_loss']:.4f}, "
       f"NSP loss {ev['nsp_loss']:.4f}")
  _log(f"checkpoints: {ckpt_dir}; TensorBoard: {os.path.join(workdir, 'tensorboard')}; plot: {plot}")
  return ev


class _Run:
  """The mutable state of one training run: step, params, data position."""

  def __init__(self, config, trainer: Trainer, prepared, phases: list[Phase], mngr, reporter,
               meta_base: dict, signals: Optional[_StopSignals] = None):
    self.config, self.trainer, self.prepared, self.phases = config, trainer, prepared, phases
    self.mngr, self.reporter, self.meta_base = mngr, reporter, meta_base
    self.signals = signals or _StopSignals()
    self.ckpt_dir = str(mngr.directory)
    self.step, self.position = 0, 0
    self.params = self.opt_state = None
    self._saving: Optional[int] = None  # step of the checkpoint being written
    # Replicated over the whole mesh: Orbax cannot save a single-device array
    # when there are several processes.
    self.rng_data = sharding.replicate(np.asarray(jax.random.key_data(trainer.train_key)),
                                       trainer.mesh)

  def restore_latest(self) -> bool:
    """Restores the newest readable checkpoint; False if there is none.

    Orbax only lists complete checkpoints (one killed mid-write is a temporary
    folder). A complete one that cannot be read (a truncated or deleted file)
    is renamed to corrupt-<step>, so the step can be written again, and the
    one before it is tried.
    """
    while (step := self.mngr.latest_step()) is not None:
      try:
        self.restore(step, self.ckpt_dir)
        return True
      except CheckpointError:
        raise  # readable but made for another model: for the user to decide
      except Exception as e:  # pylint: disable=broad-except
        if isinstance(e, MemoryError) or "RESOURCE_EXHAUSTED" in str(e):
          raise  # the checkpoint may be fine; the device is too small
        moved = checkpointing.move_aside(self.mngr, step)
        previous = self.mngr.latest_step()
        _warn(f"warning: checkpoint {self.ckpt_dir}/{step} is unreadable ({_one_line(e)}); "
              f"moved it to {moved}; " + (f"falling back to step {previous}" if previous
                                          is not None else "no older one: starting from step 0"))
    return False

  def restore(self, step: int, ckpt_dir: str) -> None:
    # Model shape first: a mismatch should be one clear line, not an Orbax error.
    meta = self.mngr.restore(step, args=checkpointing.ocp.args.Composite(
        meta=checkpointing.ocp.args.JsonRestore()))["meta"]
    _check_resume_compatible(meta, self.trainer.bert_config, ckpt_dir)
    rng = jax.ShapeDtypeStruct(self.rng_data.shape, self.rng_data.dtype,
                               sharding=sharding.replicated(self.trainer.mesh))
    self.params, opt_state, meta = checkpointing.restore_train_state(
        self.mngr, step, self.trainer.abstract_params,
        {"opt_state": self.trainer.abstract_opt_state, "rng": rng})
    self.opt_state = opt_state["opt_state"]
    self.step, self.position = int(meta["step"]), int(meta["data_position"])
    self.reporter.truncate(self.step)
    _log(f"resumed from {ckpt_dir} at step {self.step} (data position {self.position})")

  def save(self, phase: Phase, position: int) -> None:
    """Starts writing a checkpoint of the current step (in the background)."""
    if not self.trainer.params_finite(self.params):
      raise NonFiniteError(
          f"parameters at step {self.step} are NaN/inf: not writing checkpoint "
          f"{self.ckpt_dir}/{self.step}; the newest checkpoint is step {self.mngr.latest_step()}")
    self.finish_save()  # the previous one's error belongs to its own step
    try:
      checkpointing.save(self.mngr, self.step, self.params,
                         {"opt_state": self.opt_state, "rng": self.rng_data},
                         {**self.meta_base, "step": self.step, "phase": phase.index,
                          "data_position": position})
    except Exception as e:  # pylint: disable=broad-except
      raise self._write_error(self.step, e) from e
    self._saving = self.step

  def finish_save(self) -> None:
    """Waits for the checkpoint being written; a failure becomes one clear line."""
    step, self._saving = self._saving, None
    try:
      self.mngr.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except
      raise self._write_error(step, e) from e

  def _write_error(self, step: Optional[int], e: Exception) -> CheckpointError:
    try:
      self.mngr.reload()  # what is on disk, not what was started
      older = [s for s in self.mngr.all_steps() if s != step]
    except Exception:  # pylint: disable=broad-except
      older = []
    return CheckpointError(
        f"could not write checkpoint {self.ckpt_dir}/{step}: {_write_reason(e)}; older "
        f"checkpoints are intact (steps {older})")

  def abandon(self) -> None:
    """After an error: finish the checkpoint in flight, never hiding the error."""
    try:
      if self._saving is not None:
        self.finish_save()
    except BertJaxError as e:
      _warn(f"warning: {e}")
    try:
      self.mngr.close()
    except Exception:  # pylint: disable=broad-except
      pass  # e.g. the error of a save already reported

  def stop_requested(self, sync: bool = False) -> Optional[int]:
    """The signal that asks to stop, agreed by all processes; None to go on."""
    if jax.process_count() == 1:
      return self.signals.signum
    if not sync and self.step % STOP_SYNC_EVERY:
      return None
    from jax.experimental import multihost_utils
    flags = multihost_utils.process_allgather(np.int32(self.signals.signum or 0))
    return int(np.max(flags)) or None

  def stop_if_requested(self, sync: bool = False, phase: Optional[Phase] = None,
                        position: int = 0) -> None:
    """On a stop signal: checkpoint the current step, wait for it, raise Preempted."""
    signum = self.stop_requested(sync)
    if signum is None:
      return
    if phase is not None and self._saving != self.step:
      self.save(phase, position)
    self.finish_save()
    name = signal.Signals(signum).name
    raise Preempted(f"stopped by {name} at step {self.step}; checkpoint "
                    f"{self.ckpt_dir}/{self.mngr.latest_step()} is complete; rerun the same "
                    "command to resume", self.step, signum)

  def eval_batches(self, phase: Phase):
    from bert_jax import input_pipeline
    return input_pipeline.eval_batches(self.prepared.eval[phase.seq_len],
                                       self.config.train.batch_size,
                                       jax.process_index(), jax.process_count())

  def train(self) -> None:
    from tqdm import tqdm
    from bert_jax import input_pipeline
    c, B = self.config, self.config.train.batch_size
    bar = tqdm(total=c.train.num_steps, initial=self.step, unit="step", dynamic_ncols=True,
               disable=not c.progress_bar or jax.process_index() != 0)
    pending, t_last, n_last = [], time.perf_counter(), self.step
    try:
      for phase in self.phases:
        if self.step >= phase.end:
          continue
        start_batch = self.position if self.step > phase.start else 0
        it = input_pipeline.TrainIterator(
            self.prepared.train[phase.seq_len], B, seed=c.seed + phase.index,
            process_index=jax.process_index(), process_count=jax.process_count(),
            start_batch=start_batch)
        step_fn = self.trainer.train_step_fn(phase.max_predictions)
        _log(f"phase {phase.index}: steps {phase.start}..{phase.end} at sequence length "
             f"{phase.seq_len}, {phase.max_predictions} predictions per sequence")
        with it:
          while self.step < phase.end:
            batch = sharding.global_batch(next(it), self.trainer.mesh)
            self.params, self.opt_state, metrics = step_fn(
                self.params, self.opt_state, jnp.int32(self.step), batch)
            self.step += 1
            pending.append(metrics)
            bar.update(1)
            if self.step % c.log_every == 0 or self.step == phase.end:
              m = self._train_metrics(pending, (self.step - n_last) * B / max(
                  time.perf_counter() - t_last, 1e-9))
              pending, t_last, n_last = [], time.perf_counter(), self.step
              self.reporter.write("train", self.step, m)
              bar.set_postfix(loss=f"{m['loss']:.3f}", mlm_acc=f"{m['mlm_accuracy']:.3f}",
                              nsp_acc=f"{m['nsp_accuracy']:.3f}",
                              seq_s=f"{m['sequences_per_sec']:.0f}")
              self._check_nonfinite(m["nonfinite_streak"])
            if self.step % c.checkpoint_every == 0 or self.step == c.train.num_steps:
              self.save(phase, it.position)
            self.stop_if_requested(phase=phase, position=it.position)
            if self.step % c.eval_every == 0 and self.step < c.train.num_steps:
              ev = self.trainer.evaluate(self.params, self.eval_batches(phase),
                                         phase.max_predictions, c.eval_batches)
              self.reporter.write("eval", self.step, ev)
              bar.write(f"eval @ {self.step}: "
                        + ", ".join(f"{k} {v:.4f}" for k, v in ev.items()))
        self.position = 0
    finally:
      bar.close()

  @staticmethod
  def _train_metrics(pending: list, sequences_per_sec: float) -> dict:
    rows = jax.device_get(pending)
    sums = jax.tree.map(lambda *x: float(np.sum(x)), *rows)
    good = len(rows) - sums["skipped"]  # skipped steps report zeros, not NaN
    mean = lambda k: sums[k] / good if good else float("nan")
    return summarize(sums) | {
        "loss": mean("loss"), "grad_norm": mean("grad_norm"),
        "learning_rate": float(rows[-1]["learning_rate"]),
        "sequences_per_sec": sequences_per_sec,
        "skipped_steps": float(rows[-1]["skipped_total"]),
        "nonfinite_streak": float(max(r["nonfinite_streak"] for r in rows))}

  def _check_nonfinite(self, streak: float) -> None:
    limit = self.config.train.max_consecutive_nonfinite
    if streak >= limit:
      raise NonFiniteError(
          f"loss or gradients were NaN/inf for {int(streak)} consecutive steps (up to step "
          f"{self.step}; config.train.max_consecutive_nonfinite={limit}); those steps left the "
          f"parameters unchanged, the newest checkpoint is step {self.mngr.latest_step()}; "
          "try a lower config.train.learning_rate")

  def final_eval(self) -> dict:
    last = self.phases[-1]
    if self.mngr.latest_step() != self.step:  # e.g. num_steps raised after a finished run
      self.save(last, 0)
    ev = self.trainer.evaluate(self.params, self.eval_batches(last), last.max_predictions,
                               self.config.eval_batches)
    self.reporter.write("eval", self.step, ev)
    return ev
