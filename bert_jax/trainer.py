"""A pre-training run, start to end: the story of `train_and_evaluate`.

settings -> data (prepared once) -> steps (model, optimizer, shardings) ->
resume or initialise -> the loop -> final eval, checkpoint and plot. Each
chapter lives in its own module: `settings`, `data_setup`, `steps`,
`resume`, `loop`, `preemption`.
"""

import contextlib
import json
import time
from collections.abc import Collection
from typing import Optional

import jax
import ml_collections
import numpy as np

from bert_jax import console, settings as settings_lib
from bert_jax.data import batch_ramp, bpe
from bert_jax.parallel import sharding
from bert_jax.storage import fs, mirror, outputs, workdir_lock
from bert_jax.storage.workdir import Workdir
from bert_jax.model import precision
from bert_jax.train import compile_cache, data_setup, goodput, init_from, mixture_run
from bert_jax.errors import BertJaxError, ConfigError, check_stop
from bert_jax.eval import training_probes as probes
from bert_jax.train.eval_report import describe_eval
from bert_jax.train.loop import TrainLoop
from bert_jax.train.preemption import StopSignals
from bert_jax.train.reporting import Reporter
from bert_jax.train.resume import RunCheckpoints, RunState, check_same_data, checkpoint_dir
from bert_jax.settings import Settings
from bert_jax.train.steps import TrainSteps, make_steps  # noqa: F401  (tests and tools import it here too)
from bert_jax.train.hooks import (GoodputHook, Hooks, LeaseCheck, NonFiniteCheck, Probes,
                                  ProgressBar, Stragglers)
from bert_jax.train.profiling import StepProfiler
from bert_jax.train.watchdog import Watchdog


def _check_workdir(workdir: str) -> None:
  """A workdir that cannot be a directory fails here, not deep inside data preparation;
  a bucket that is missing or forbidden, or a server that does not answer, too; a
  URL of another scheme, or a malformed gs:// one, too (never a local folder)."""
  outputs.check_directory_target("--workdir", workdir)
  mirror.interval_s()  # a bucket's log upload interval: a bad value is one line before any work


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                       started: Optional[float] = None,
                       explicit: Collection[str] = ()) -> dict:
  """Pre-trains from `config` in `workdir`, resuming from its latest checkpoint.

  Returns the final evaluation metrics. `started`: when this session began, for its
  goodput (train/goodput); the command passes its process's start, a caller in Python
  defaults to now. `explicit`: the fields the command line set (a continued run refuses
  one its source decides, even at the default's value).
  """
  ledger_start = time.time() if started is None else started
  s = settings_lib.from_config(config, explicit)  # fail before anything is written
  if s.model.attention_kernel == "cudnn" and jax.default_backend() != "gpu":
    # The model refuses it when traced, after the data is prepared: say it first.
    raise ConfigError(f"--config.model.attention_kernel='cudnn' needs an NVIDIA GPU, but "
                      f"this run's devices are {jax.default_backend()}; expected 'einsum', "
                      "'jax' or 'auto' there")
  # --config.init_from: the source's shape, vocabulary and lowercasing (checked, nothing written).
  source = init_from.resolve(s) if s.init.path else None
  if source is not None:
    s = init_from.run_settings(s, source)
  probe_tasks = probes.load_tasks(s.probe)  # config.probe.tasks, read before anything is written
  _check_workdir(workdir)
  for where in (s.data.cache_dir, s.run.compile_cache_dir):
    if where:  # every output location, before any work (a bucket's: it answers)
      fs.check_bucket(where)
  _enable_compile_cache(s.run.compile_cache_dir)
  mesh = sharding.make_mesh(s.mesh.model_parallel)
  for batch, field in s.train.batch_fields():  # every phase's global batch
    sharding.check_batch(batch, mesh, s.train.grad_accum_steps, field)
  t = s.train  # a batch-size warm-up's first size must shard as the target does
  batch_ramp.of(t.ramp.start, t.batch_of(t.phases[0]), t.ramp.steps, t.ramp.stages,
                sharding.batch_unit(mesh, t.grad_accum_steps))
  # The run's folder, opened once: every part of the run that writes into it takes it.
  run_dir = Workdir(workdir)
  # One run per workdir: a second one stops here, before writing anything.
  with workdir_lock.hold(run_dir.root, jax.process_index()):
    ledger = goodput.Ledger(run_dir, jax.process_index() == 0, ledger_start)
    return _run(s, run_dir, mesh, source, probe_tasks, ledger)


def _run(s: Settings, workdir: Workdir, mesh, source=None, probe_tasks=(),
         ledger: Optional[goodput.Ledger] = None) -> dict:
  """The run's story in order: data, steps, restore or start, loop, final eval, report."""
  check_same_data(s, workdir)  # before preparing anything: a refused run writes nothing
  prepared, ext = _prepare(s, workdir, source)
  check_stop()  # a SIGTERM noted while preparing: stop before building the model
  tok = prepared.tokenizer
  steps = make_steps(s, tok.vocab_size, tok.special_ids(),
                     tok.is_continuation() if s.masking.whole_word else None, mesh)
  check_stop()
  _log_model(steps, tok.vocab_size, s.requested_dtype, s.requested_attention_kernel)
  ckpts = RunCheckpoints(checkpoint_dir(workdir), s.run.keep_checkpoints, steps, {
      "model_config": steps.bert_config.to_dict(), **bpe.to_meta(tok),
      "seed": s.run.seed, "config": json.loads(s.config_json)})
  reporter = Reporter(workdir)
  signals = StopSignals().install()
  ledger = ledger or goodput.Ledger(workdir, jax.process_index() == 0, time.time())
  stopped_on: Optional[BaseException] = None
  try:
    state, fresh_source = _restore_or_start(s, ckpts, steps, source, ext)
    if (done := _stored_final_eval(s, state.step, reporter)) is not None:
      console.log(f"run already complete at step {state.step}: "
                  f"{describe_eval(done) if done else 'see process 0'} "
                  f"(stored in {reporter.history_path}; {_train_on(s)}); nothing written")
      ckpts.close()
      return done
    reporter.truncate(-1 if fresh_source else state.step)  # records of steps this run will redo
    if (note := reporter.skipped_warning()) is not None:
      console.warn(note)
    ledger.restored(state.step)
    loop = TrainLoop(s, steps, ckpts, prepared, reporter, signals, state,
                     _hooks(s, workdir, ledger, state.step, ckpts, reporter, probe_tasks, tok))
    ev = _train(s, loop, ckpts, reporter, fresh_source, source.fresh_heads if source else ())
    with ledger.timed("checkpoint"):
      ckpts.finish_save()
    ckpts.close()
    total = ledger.total()  # every session of this workdir
    reporter.write("goodput", state.step, total)
    console.log(goodput.describe(total))
  except BaseException as e:
    stopped_on = e
    with fs.giving_up_on(e):  # a bucket that stopped answering is not waited on again
      ckpts.abandon(e)  # an interrupted run still finishes the checkpoint it started
    raise
  finally:
    signals.uninstall()
    with fs.giving_up_on(stopped_on):
      _close(reporter, stopped_on is not None)
      # Also when stopped: the time up to here is this session's. A record that cannot
      # be written then must not hide the error the run is stopping with.
      with contextlib.suppress(BertJaxError):
        ledger.flush()
  plot = _plot(reporter, s, state.step)
  console.log(f"final eval @ step {state.step}: {describe_eval(ev)}")
  # The workdir as the user gave it, like the other two (Orbax's own path is absolute).
  console.log(f"checkpoints: {checkpoint_dir(workdir)}; TensorBoard: "
              f"{workdir.tensorboard}; plot: {plot}")
  return ev


def _train_on(s: Settings) -> str:
  """How to go on from a finished run: its finished phases keep their steps on resume."""
  if len(s.train.phases) == 1:
    return "raise --config.train.num_steps to train on"
  kept = ", ".join(str(p.end - p.start) for p in s.train.phases)
  return (f"to train on, keep the finished phases' steps: --config.train.phase_steps="
          f"'({kept})' with its last entry raised, or one more phase appended")


def _plot(reporter, s: Settings, step: int) -> str:
  """training_curves.png (its path), unless --config.plot=False."""
  if not s.run.plot:
    return "none (--config.plot=False)"
  return reporter.plot(step, [ph.start for ph in s.train.phases[1:]])


def _hooks(s: Settings, workdir: Workdir, ledger: goodput.Ledger, step: int,
           ckpts: RunCheckpoints, reporter: Reporter, probe_tasks=(), tok=None) -> Hooks:
  """What watches the loop (train/hooks), for a run restored at `step`; a concern that is
  off is not registered."""
  hooks = [StepProfiler(s.profile.steps, s.profile.on_demand_steps, workdir),
           GoodputHook(ledger), LeaseCheck(),
           NonFiniteCheck(s.train.max_consecutive_nonfinite, ckpts.latest_step)]
  if s.run.progress_bar and jax.process_index() == 0:
    hooks.insert(0, ProgressBar(s.train.num_steps, step))  # lines print through it
  if probe_tasks:  # config.probe.tasks, after every evaluation
    run_probes = probes.RunProbes(s.probe, list(probe_tasks), ckpts.steps.bert_config, tok,
                                  s.run.seed)
    hooks.append(Probes(run_probes, ckpts.steps.config_at, reporter.write))
  if s.run.watchdog_s > 0:
    hooks.append(Watchdog(s.run.watchdog_s, workdir, s.run.watchdog_exit))
  if jax.process_count() > 1 and s.run.straggler_factor:
    hooks.append(Stragglers(s.run.straggler_factor, s.run.log_every))
  return Hooks(hooks)


def _close(reporter: Reporter, failed: bool) -> None:
  """Closes the reporter; after a failure, an error of its own never replaces the error
  the run stops with."""
  if not failed:
    reporter.close()
    return
  with contextlib.suppress(BertJaxError, OSError):
    reporter.close()


def _prepare(s: Settings, workdir: Workdir, source) -> tuple:
  """(prepared data, the continuation's vocabulary extension or None)."""
  ext = None
  if source is not None:
    console.log(f"init_from: {source.describe()}")
  with (init_from.data_settings(s, source) if source is not None
        else contextlib.nullcontext((s.data, None))) as (data, ext):
    if data.mixture:
      prepared = mixture_run.prepare(data, s.train.seq_lens, s.run.seed, workdir,
                                     s.train.phases)
    else:
      prepared = data_setup.prepare_data(data, s.train.seq_lens, s.run.seed, workdir)
  return prepared, ext


def _restore_or_start(s: Settings, ckpts: RunCheckpoints, steps: TrainSteps, source,
                      ext) -> tuple[RunState, bool]:
  """The newest readable checkpoint, else a fresh (or continued) state; and whether it is
  a continuation's start (its step 0 is checkpointed, evaluated and probed)."""
  state = ckpts.restore_latest()
  if state is None:
    return RunState(0, 0, *(init_from.initial_state(source, steps, ext, s.run.seed)
                            if source is not None else steps.init_state())), source is not None
  console.log(f"resumed from {ckpts.ckpt_dir} at step {state.step} "
              f"(data position {state.position})" + (
                  f"; --config.init_from={source.path} was not used again (the workdir's "
                  "checkpoints win)" if source is not None else ""))
  return state, False


def _train(s: Settings, loop: TrainLoop, ckpts: RunCheckpoints, reporter: Reporter,
           fresh_source: bool, fresh_heads: tuple = ()) -> dict:
  """Trains to num_steps and returns the final evaluation."""
  ev = None
  if fresh_source:  # where the continuation starts: checkpoint, eval and probes of step 0
    # Waited for before anything is logged: a step 0 that cannot be written (a full
    # disk) stops the run here on one line, leaving no record of a start.
    ckpts.save(loop.state, s.train.phases[0], 0)
    ckpts.finish_save()
    ev = init_from.log_start(loop, reporter, fresh_heads)
  if s.train.num_steps > 0 or ev is None:  # num_steps=0: the source's evaluation is the result
    loop.train()
    loop.stop_if_requested(sync=True)  # a signal during the last steps
    ev = loop.final_eval()
  return ev


def _stored_final_eval(s: Settings, step: int, reporter: Reporter):
  """The final eval of a finished run (checkpoint and eval row at num_steps), else None."""
  if step != s.train.num_steps:
    return None
  rows = [r for r in reporter.history(step) if r["split"] == "eval" and r["step"] == step]
  if jax.process_count() > 1:  # process 0 writes metrics.jsonl: all follow what it read
    from jax.experimental import multihost_utils
    if not multihost_utils.broadcast_one_to_all(np.int32(bool(rows))):
      return None
    return {k: v for k, v in rows[-1].items() if k not in ("split", "step")} if rows else {}
  return {k: v for k, v in rows[-1].items() if k not in ("split", "step")} if rows else None


def _enable_compile_cache(cache_dir: str) -> None:
  """Compiled steps are reused by the next run on this machine; a cache that cannot be
  made costs only the speed-up, never the run."""
  try:
    compile_cache.enable(cache_dir)
  except OSError as e:
    console.warn(f"warning: --config.compile_cache_dir={cache_dir!r}: {e.strerror}; "
                 "compiling without the persistent cache")


def _log_model(steps: TrainSteps, vocab_size: int, requested_dtype: str,
               requested_kernel: str) -> None:
  c, mesh = steps.bert_config, steps.mesh
  mode = "float32" if c.dtype == "float32" else f"{c.dtype} operands, float32 accumulation"
  console.log(f"compute dtype: {mode}" + (
      f" (auto on {jax.devices()[0].platform}: {precision.auto_reason()})"
      if requested_dtype == "auto" else ""))
  if requested_kernel == "auto":
    console.log(f"attention kernel: {c.attention_kernel} (auto: splash on TPU with no "
                "attention dropout, lengths in multiples of 128 and a longest phase of "
                f"{precision.SPLASH_MIN_LEN}+ tokens, else einsum)")
  n_params = sum(int(np.prod(a.shape)) for a in jax.tree.leaves(steps.abstract_params))
  console.log(
      f"model: {c.num_layers} layers, hidden {c.hidden_size}, {c.num_heads} heads, vocab "
      f"{vocab_size} -> {n_params / 1e6:.2f}M params; {jax.device_count()} "
      f"{jax.devices()[0].platform} devices"
      + (f" in {jax.process_count()} processes" if jax.process_count() > 1 else "")
      + f", mesh {dict(mesh.shape)}")
