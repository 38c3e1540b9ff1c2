"""A pre-training run, start to end: the story of `train_and_evaluate`.

settings -> data (prepared once) -> steps (model, optimizer, shardings) ->
resume or initialise -> the loop -> final eval, checkpoint and plot. Each
chapter lives in its own module: `settings`, `data_setup`, `steps`,
`resume`, `loop`, `preemption`.
"""

import json
import os

import jax
import ml_collections
import numpy as np

from bert_jax import console, data_setup, settings as settings_lib, sharding, workdir_lock
from bert_jax.errors import ConfigError
from bert_jax.loop import TrainLoop
from bert_jax.preemption import StopSignals
from bert_jax.reporting import Reporter
from bert_jax.resume import RunCheckpoints, RunState, checkpoint_dir
from bert_jax.settings import Settings
from bert_jax.steps import TrainSteps


def _check_workdir(workdir: str) -> None:
  """A workdir that cannot be a directory fails here, not deep inside data preparation."""
  path = os.path.abspath(workdir)
  while not os.path.isdir(path):
    if os.path.lexists(path):
      raise ConfigError(f"--workdir {workdir}: {path} is not a directory; expected a directory "
                        "(created if missing)")
    path = os.path.dirname(path)


def make_steps(s: Settings, vocab_size: int, special_ids: list[int], mask_id: int,
               is_continuation_V=None, mesh=None) -> TrainSteps:
  """The compiled-step owner of a run with these settings and vocabulary."""
  if mesh is None:  # a caller that passes a mesh has checked the batch against it
    mesh = sharding.make_mesh(s.mesh.model_parallel)
    sharding.check_batch(s.train.batch_size, mesh, s.train.grad_accum_steps)
  return TrainSteps(s.model_config(vocab_size), s.optimizer, s.masking, special_ids, mask_id,
                    mesh, s.mesh.param_sharding, s.train.grad_accum_steps, s.run.seed,
                    is_continuation_V, objective=s.objective)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Pre-trains from `config` in `workdir`, resuming from its latest checkpoint.

  Returns the final evaluation metrics.
  """
  s = settings_lib.from_config(config)  # fail before anything is written
  _check_workdir(workdir)
  mesh = sharding.make_mesh(s.mesh.model_parallel)
  sharding.check_batch(s.train.batch_size, mesh, s.train.grad_accum_steps)
  # One run per workdir: a second one stops here, before writing anything.
  with workdir_lock.hold(workdir, jax.process_index()):
    return _run(s, workdir, mesh)


def _run(s: Settings, workdir: str, mesh) -> dict:
  prepared = data_setup.prepare_data(s.data, s.train.seq_lens, s.run.seed, workdir)
  tok = prepared.tokenizer
  steps = make_steps(s, tok.vocab_size, tok.special_ids(), tok.mask_id,
                     tok.is_continuation() if s.masking.whole_word else None, mesh)
  _log_model(steps, tok.vocab_size)

  ckpts = RunCheckpoints(checkpoint_dir(workdir), s.run.keep_checkpoints, steps, {
      "model_config": steps.bert_config.to_dict(), "vocab": tok.vocab,
      "lowercase": tok.lowercase, "seed": s.run.seed, "config": json.loads(s.config_json)})
  reporter = Reporter(workdir)
  signals = StopSignals().install()
  loop = None
  try:
    state = ckpts.restore_latest()
    if state is None:
      state = RunState(0, 0, *steps.init_state())
    else:
      console.log(f"resumed from {ckpts.ckpt_dir} at step {state.step} "
                  f"(data position {state.position})")
    reporter.truncate(state.step)  # records of steps this run will redo
    if (note := reporter.skipped_warning()) is not None:
      console.warn(note)
    loop = TrainLoop(s, steps, ckpts, prepared, reporter, signals, state)
    loop.train()
    loop.stop_if_requested(sync=True)  # a signal during the last steps
    ev = loop.final_eval()
    ckpts.finish_save()
    ckpts.close()
  except BaseException:
    ckpts.abandon()  # an interrupted run still finishes the checkpoint it started
    raise
  finally:
    signals.uninstall()
    reporter.close()
  plot = reporter.plot(state.step)
  heads = [t for t in ("nsp", "sop") if t + "_loss" in ev]  # none for config.objective 'mlm'
  console.log(f"final eval @ step {state.step}: MLM accuracy {ev['mlm_accuracy']:.4f} "
              f"(best constant guess {ev['mlm_best_constant_accuracy']:.4f}), "
              + "".join(f"{t.upper()} accuracy {ev[t + '_accuracy']:.4f}, " for t in heads)
              + f"MLM loss {ev['mlm_loss']:.4f}"
              + "".join(f", {t.upper()} loss {ev[t + '_loss']:.4f}" for t in heads))
  console.log(f"checkpoints: {ckpts.ckpt_dir}; TensorBoard: "
              f"{os.path.join(workdir, 'tensorboard')}; plot: {plot}")
  return ev


def _log_model(steps: TrainSteps, vocab_size: int) -> None:
  c, mesh = steps.bert_config, steps.mesh
  n_params = sum(int(np.prod(a.shape)) for a in jax.tree.leaves(steps.abstract_params))
  console.log(
      f"model: {c.num_layers} layers, hidden {c.hidden_size}, {c.num_heads} heads, vocab "
      f"{vocab_size} -> {n_params / 1e6:.2f}M params; {jax.device_count()} "
      f"{jax.devices()[0].platform} devices"
      + (f" in {jax.process_count()} processes" if jax.process_count() > 1 else "")
      + f", mesh {dict(mesh.shape)}")
