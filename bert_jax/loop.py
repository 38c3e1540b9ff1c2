"""The training loop: phases of steps, logging, periodic eval and checkpoints, stops.

Shape legend: B global batch.
"""

import signal
import time
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from bert_jax import input_pipeline, sharding
from bert_jax.dataset import Prepared
from bert_jax.errors import NonFiniteError, Preempted
from bert_jax.preemption import StopSignals
from bert_jax.reporting import Reporter
from bert_jax.resume import RunCheckpoints, RunState
from bert_jax.settings import Phase, Settings
from bert_jax.steps import TrainSteps, summarize


class TrainLoop:
  """Runs the steps of every phase from `state` on, in place."""

  def __init__(self, settings: Settings, steps: TrainSteps, ckpts: RunCheckpoints,
               prepared: Prepared, reporter: Reporter, signals: StopSignals, state: RunState):
    self.s, self.steps, self.ckpts, self.prepared = settings, steps, ckpts, prepared
    self.reporter, self.signals, self.state = reporter, signals, state

  def eval_batches(self, phase: Phase):
    return input_pipeline.eval_batches(self.prepared.eval[phase.seq_len],
                                       self.s.train.batch_size,
                                       jax.process_index(), jax.process_count())

  def evaluate(self, phase: Phase) -> dict:
    return self.steps.evaluate(self.state.params, self.eval_batches(phase),
                               phase.max_predictions, self.s.run.eval_batches)

  def stop_if_requested(self, sync: bool = False, phase: Optional[Phase] = None,
                        position: int = 0) -> None:
    """On a stop signal: checkpoint the current step, wait for it, raise Preempted."""
    signum = self.signals.agreed(self.state.step, sync)
    if signum is None:
      return
    if phase is not None and self.ckpts.saving != self.state.step:
      self.ckpts.save(self.state, phase, position)
    self.ckpts.finish_save()
    name = signal.Signals(signum).name
    raise Preempted(f"stopped by {name} at step {self.state.step}; checkpoint "
                    f"{self.ckpts.ckpt_dir}/{self.ckpts.latest_step()} is complete; rerun the "
                    "same command to resume", self.state.step, signum)

  def train(self) -> None:
    run, st = self.s.run, self.state
    bar = tqdm(total=self.s.train.num_steps, initial=st.step, unit="step", dynamic_ncols=True,
               disable=not run.progress_bar or jax.process_index() != 0)
    try:
      for phase in self.s.train.phases:
        if st.step < phase.end:
          self._train_phase(phase, bar)
        st.position = 0
    finally:
      bar.close()

  def _train_phase(self, phase: Phase, bar: tqdm) -> None:
    run, st, B = self.s.run, self.state, self.s.train.batch_size
    num_steps = self.s.train.num_steps
    start_batch = st.position if st.step > phase.start else 0
    it = input_pipeline.TrainIterator(
        self.prepared.train[phase.seq_len], B, seed=run.seed + phase.index,
        process_index=jax.process_index(), process_count=jax.process_count(),
        start_batch=start_batch)
    step_fn = self.steps.train_step_fn(phase.max_predictions)
    print_line = bar.write if not bar.disable else print
    if jax.process_index() == 0:
      print_line(f"phase {phase.index}: steps {phase.start}..{phase.end} at sequence length "
                 f"{phase.seq_len}, {phase.max_predictions} predictions per sequence")
    pending, t_last, n_last = [], time.perf_counter(), st.step
    with it:
      while st.step < phase.end:
        batch = sharding.global_batch(next(it), self.steps.mesh)
        st.params, st.opt_state, metrics = step_fn(
            st.params, st.opt_state, jnp.int32(st.step), batch)
        st.step += 1
        pending.append(metrics)
        bar.update(1)
        if st.step % run.log_every == 0 or st.step == phase.end:
          m = _train_metrics(pending, (st.step - n_last) * B / max(
              time.perf_counter() - t_last, 1e-9))
          pending, t_last, n_last = [], time.perf_counter(), st.step
          self.reporter.write("train", st.step, m)
          bar.set_postfix(loss=f"{m['loss']:.3f}", mlm_acc=f"{m['mlm_accuracy']:.3f}",
                          **{f"{t}_acc": f"{m[t + '_accuracy']:.3f}" for t in ("nsp", "sop")
                             if t + "_accuracy" in m},  # none for config.objective 'mlm'
                          seq_s=f"{m['sequences_per_sec']:.0f}")
          self._check_nonfinite(m["nonfinite_streak"])
        if st.step % run.checkpoint_every == 0 or st.step == num_steps:
          self.ckpts.save(st, phase, it.position)
        self.stop_if_requested(phase=phase, position=it.position)
        if st.step % run.eval_every == 0 and st.step < num_steps:
          ev = self.evaluate(phase)
          self.reporter.write("eval", st.step, ev)
          bar.write(f"eval @ {st.step}: " + ", ".join(f"{k} {v:.4f}" for k, v in ev.items()))

  def _check_nonfinite(self, streak: float) -> None:
    limit = self.s.train.max_consecutive_nonfinite
    if streak >= limit:
      raise NonFiniteError(
          f"loss or gradients were NaN/inf for {int(streak)} consecutive steps (up to step "
          f"{self.state.step}; config.train.max_consecutive_nonfinite={limit}); those steps "
          f"left the parameters unchanged, the newest checkpoint is step "
          f"{self.ckpts.latest_step()}; try a lower config.train.learning_rate")

  def final_eval(self) -> dict:
    last = self.s.train.phases[-1]
    if self.ckpts.latest_step() != self.state.step:  # e.g. num_steps raised after a finished run
      self.ckpts.save(self.state, last, 0)
    ev = self.evaluate(last)
    self.reporter.write("eval", self.state.step, ev)
    return ev


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
