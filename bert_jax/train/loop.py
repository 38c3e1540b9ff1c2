"""The training loop: phases of steps, and the calls made after them at a cadence
(train/hooks: the spike check, the log row, the checkpoint, the stop check, the
evaluation), each registered with its `every=`.

Rates are measured over synchronised intervals (train/throughput.py): the
first step of a phase (its compilation) and evaluations are timed apart.
Between log points at most
`_MAX_IN_FLIGHT` steps are queued on the device, so the progress bar follows
the steps as they finish instead of stalling at every log point.

Shape legend: B global batch.
"""

# Steps dispatched ahead of the newest finished one: enough to keep the device
# busy, few enough that the bar and its time estimate stay smooth.
_MAX_IN_FLIGHT = 2

import collections
import contextlib
import signal
import time
from typing import Any, Optional

import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils
import numpy as np
from bert_jax import console
from bert_jax.data import batch_ramp, input_pipeline
from bert_jax.parallel import sharding
from bert_jax.data.dataset import Prepared
from bert_jax.errors import Preempted
from bert_jax.train.preemption import StopSignals
from bert_jax.train import mixture_run, spikes
from bert_jax.train.hooks import Hooks, LogPoint, Rewind, StepInfo
from bert_jax.train.reporting import Reporter
from bert_jax.train.resume import RunCheckpoints, RunState
from bert_jax.settings import Phase, Settings
from bert_jax.train.eval_report import describe_eval, with_stderr
from bert_jax.train.steps import TrainSteps, summarize
from bert_jax.train.throughput import Interval, Throughput


class TrainLoop:
  """Runs the steps of every phase from `state` on, in place."""

  def __init__(self, settings: Settings, steps: TrainSteps, ckpts: RunCheckpoints,
               prepared: Prepared, reporter: Reporter, signals: StopSignals, state: RunState,
               hooks: Optional[Hooks] = None):
    self.s, self.steps, self.ckpts, self.prepared = settings, steps, ckpts, prepared
    self.reporter, self.signals, self.state = reporter, signals, state
    # The progress bar, the NaN check, the probes, the watchdog, profiler, goodput ledger,
    # stragglers and lease check (train/hooks), registered by the trainer; the loop's
    # own calls at a cadence go first.
    self.hooks = hooks or Hooks()
    self._waits = 0.0  # data waits and saves inside the timed interval: not productive
    self._data_wait = 0.0  # the data waits alone (config.straggler_factor)
    self._planned: Optional[int] = None  # XLA's bytes per device for the current step
    self._logged = False  # a train row was written in this session
    self.throughput = Throughput(settings, steps.bert_config, jax.devices()[0].device_kind,
                                 jax.device_count())
    self.compile_s: dict[int, float] = {}  # phase index -> time of its first step
    self.eval_s = 0.0
    self._evals: list[tuple[float, float]] = []  # (eval loss, latest train loss)
    self._last_train_loss = float("nan")
    self._warned_overfit = False
    sp = settings.train.spike  # config.train.spike_rollback
    self.spikes = spikes.SpikeDetector(sp.factor, sp.patience, sp.window)
    self.spikes.load(state.spike)
    t = settings.train  # config.train.batch_ramp: each step's global batch (data/batch_ramp)
    # The warm-up grows the first phase's batch; later phases train at their own.
    self.ramp = batch_ramp.of(t.ramp.start, t.batch_of(t.phases[0]), t.ramp.steps,
                              t.ramp.stages, sharding.batch_unit(steps.mesh, t.grad_accum_steps))
    self._pending: list = []  # the metrics of the steps since the last log point
    self._observed = 0  # how many of them the spike detector has seen
    first = prepared.train[settings.train.phases[0].seq_len] if prepared.train else None
    # config.data.sources: the tokens drawn from each source (train/mixture_run)
    self.mixture = (mixture_run.MixtureTokens(first)
                    if getattr(first, "counts", None) is not None else None)
    self._run: Optional[_PhaseRun] = None  # the phase being trained
    self._register(settings.run)

  def _register(self, run: Any) -> None:
    """The loop's own calls at a cadence, in the order they run after a step."""
    add = lambda *a, **k: self.hooks.add(*a, first=True, **k)  # noqa: E731
    if self.spikes.on:  # judged before a row or a checkpoint of the spike's steps
      add(self._judge, every=(run.log_every, run.checkpoint_every), name="spike check",
          at_phase_end=True)
    add(self._log, every=run.log_every, name="log", at_phase_end=True)
    add(self._checkpoint, every=run.checkpoint_every, name="checkpoint", at_run_end=True)
    add(self._stop, every=1, name="stop check")
    # The run's last step is evaluated by final_eval, after its checkpoint is complete.
    add(self._eval, every=run.eval_every, name="eval", at_run_end=False)

  def summary(self) -> Optional[str]:
    """The end-of-run line: average rates of this session's timed steps, compile times."""
    rates = self.throughput.summary()
    if rates is None and not self.compile_s:
      return None
    parts = [rates] if rates else []
    parts.append("compile (first step) " + ", ".join(
        f"phase {i} {sec:.1f} s" for i, sec in sorted(self.compile_s.items())))
    if self.eval_s:
      parts.append(f"evaluation {self.eval_s:.1f} s")
    parts += self.hooks.summary()  # the probes' time
    return "throughput: " + "; ".join(parts)

  def _after_eval(self, ev: dict) -> dict:
    """Adds standard errors; warns once when eval loss rises while train loss falls."""
    ev = with_stderr(ev)
    self._evals.append((ev["loss"], self._last_train_loss))
    if len(self._evals) >= 3 and not self._warned_overfit:
      (e0, t0), (e1, t1), (e2, t2) = self._evals[-3:]
      if e0 < e1 < e2 and t0 > t1 > t2:
        self._warned_overfit = True
        console.warn(f"warning: eval loss rose {e0:.3f} -> {e1:.3f} -> {e2:.3f} over the last "
                     f"three evaluations while train loss fell {t0:.3f} -> {t1:.3f} -> "
                     f"{t2:.3f}: the model is overfitting; use more data or fewer steps")
    return ev

  def eval_batches(self, phase: Phase):
    sizes = self.prepared.eval_sizes  # host-local parts: every host's eval examples
    return input_pipeline.eval_batches(self.prepared.eval[phase.seq_len],
                                       self.s.train.batch_of(phase),
                                       jax.process_index(), jax.process_count(),
                                       sizes[phase.seq_len] if sizes else None)

  def evaluate(self, phase: Phase) -> dict:
    t0 = time.perf_counter()
    ev = self.steps.evaluate(self.state.params, self.eval_batches(phase), phase,
                             self.s.run.eval_batches, self.s.masking.eval_rate(phase))
    self.eval_s += time.perf_counter() - t0
    self.hooks.on_time("eval", time.perf_counter() - t0)
    step = min(max(self.state.step - 1, phase.start), phase.end - 1)  # the last step trained
    return ev | {"train_mask_prob": phase.mask_prob_at(step, self.s.masking.mask_prob)}

  def probe(self, step: int, phase: Phase) -> None:
    """What follows an evaluation of step `step` (the hooks' `after_eval`: the probes of
    config.probe.tasks), timed as evaluation."""
    t0 = time.perf_counter()
    self.hooks.after_eval(step, phase, self.state.params)
    self.hooks.on_time("eval", time.perf_counter() - t0)

  def stop_if_requested(self, sync: bool = False, phase: Optional[Phase] = None,
                        position: int = 0) -> None:
    """On a stop signal: checkpoint the current step, wait for it, raise Preempted."""
    signum = self.signals.agreed(self.state.step, sync)
    if signum is None:
      return
    if phase is not None and self.ckpts.saving != self.state.step and self._spike() is None:
      self._save(phase, position)  # not the state of a spike: its resume finds it again
    self.ckpts.finish_save()
    name = signal.Signals(signum).name
    self.signals.served = True
    raise Preempted(f"stopped by {name} at step {self.state.step}; checkpoint "
                    f"{self.ckpts.ckpt_dir}/{self.ckpts.latest_step()} is complete; rerun the "
                    "same command to resume", self.state.step, signum)

  def train(self) -> None:
    st = self.state
    try:
      self.hooks.start()
      if st.step < self.s.train.num_steps:
        console.log(self.throughput.note())
      self._redo_lost_eval()
      for phase in self.s.train.phases:
        if st.step < phase.end:  # phases the restored step is past keep the position
          self._train_phase(phase)
          st.position = 0  # the next phase starts at its first batch
    finally:
      self.hooks.close()
    if (line := self.summary()) is not None:
      console.log(line)
    if self.mixture is not None and self.mixture.total.any():
      console.log(f"mixture: tokens drawn this session: {self.mixture.describe()}")

  def _train_phase(self, phase: Phase) -> None:
    st, it = self.state, self._iterator(phase)
    step_fn = self.steps.train_step_fn(phase)
    console.log(f"phase {phase.index}: steps {phase.start}..{phase.end} at sequence length "
                f"{phase.seq_len}, {phase.max_predictions} predictions per sequence"
                + ("; Adam's moments start afresh" if phase.reset_optimizer else ""))
    self._pending, self._observed = [], 0
    if phase.reset_optimizer and st.step == phase.start:  # also when resumed right here
      st.opt_state = self.steps.reset_moments(st.params, st.opt_state)
    self._run = run = _PhaseRun(Interval(st.step), it, self.hooks.progress)
    with it:
      while st.step < phase.end:
        batch = self._next_batch(it, run.interval)
        run.first = run.first or self._new_batch_size(st.step, phase)
        run.metrics = self._step(step_fn, batch, phase, run)
        info = StepInfo(st.step, phase, st)
        for call in self.hooks.due(st.step, phase.end, self.s.train.num_steps):
          if (rewind := call.fn(info)) is not None:
            self._rewind(rewind, phase)
            break  # the data goes on where it is: the spike's batches are skipped

  def _judge(self, info: StepInfo) -> Optional[Rewind]:
    """A completed loss spike in the steps since the last judgement: rewind. A save waits
    for no step unless judged; a log point would anyway."""
    self._run.drain()  # the clock is read when the steps are done
    spike = self._spike()
    return None if spike is None else Rewind(spike)

  def _log(self, info: StepInfo) -> None:
    self._run.drain()
    self._log_train(info.phase, self._pending, self._run.interval)
    self._pending, self._observed = [], 0

  def _checkpoint(self, info: StepInfo) -> None:
    self._save(info.phase, self._run.iterator.position)

  def _stop(self, info: StepInfo) -> None:
    self.stop_if_requested(phase=info.phase, position=self._run.iterator.position)

  def _eval(self, info: StepInfo) -> None:
    self._run.drain()  # training time so far; the evaluation is timed apart
    self._run.interval.pause()
    with self.hooks.paused():  # nor does an evaluation or a probe count as time per step
      self._eval_point(info.phase)
    self._run.interval.resume()

  def _step(self, step_fn, batch, phase: Phase, run: "_PhaseRun"):
    """One step dispatched: its metrics. A step that compiles (a phase's first, a new
    batch size) is waited for and timed apart, left out of the rates."""
    st = self.state
    self.hooks.before_step(st.step)
    args = (st.params, st.opt_state, jnp.int32(st.step), batch)
    with self.hooks.step_scope(st.step, run.first):
      if run.first:  # the plan of the memory this step needs, beside what it uses
        self._planned = self.steps.memory_plan(step_fn, *args)
        _all_compiled(f"bert_jax:compiled:{phase.index}:{st.step}")
      st.params, st.opt_state, metrics = step_fn(*args)
    st.step += 1
    self.hooks.after_step(st.step, metrics)
    self._pending.append(metrics)
    if not run.first:
      run.dispatched(metrics, st.step)
      return metrics
    jax.block_until_ready(metrics)
    compile_s = time.perf_counter() - run.interval.start - self._waits
    self.compile_s[phase.index] = self.compile_s.get(phase.index, 0.0) + compile_s
    self.hooks.on_time("compile", compile_s)
    run.interval.restart(st.step)
    self._waits, run.first = 0.0, False
    self.hooks.timed_from(st.step)  # the bar's rate and estimate leave the compile out
    return metrics

  def _next_batch(self, it: input_pipeline.TrainIterator, interval: Interval):
    """The next global batch; the wait for it, its real tokens and sequences counted."""
    t0 = time.perf_counter()
    local = next(it)
    self._wait("data_wait", time.perf_counter() - t0)
    # This host's real tokens times the hosts: an estimate on several hosts, exact on one.
    interval.real_tokens += float(np.sum(local.input_mask_BxL)) * jax.process_count()
    interval.sequences += len(local.input_ids_BxL) * jax.process_count()
    if self.mixture is not None:  # the batch's rows: their sources, from their numbers
      self.mixture.add(it.source, it.batch_indices(it.position - 1), local.input_mask_BxL)
    return sharding.global_batch(local, self.steps.mesh)

  def _new_batch_size(self, step: int, phase: Phase) -> bool:
    """A batch-size warm-up's next size at `step`: the step compiles again, and is timed
    apart as a phase's first step is."""
    return (self.ramp is not None and phase.index == 0 and step > phase.start
            and self.ramp.size(step) != self.ramp.size(step - 1))

  def _iterator(self, phase: Phase) -> input_pipeline.TrainIterator:
    # A run restored inside this phase continues at the data position it saved; one
    # restored exactly at the phase's start (a checkpoint at the previous phase's last
    # step holds that phase's position) starts at batch 0.
    st = self.state
    source = self.prepared.train[phase.seq_len]
    if hasattr(source, "for_phase"):  # a mixture: the phase's weights (data/mixture)
      source = source.for_phase(phase.index)
    return input_pipeline.TrainIterator(
        source, self.s.train.batch_of(phase),
        seed=self.s.run.seed + phase.index, process_index=jax.process_index(),
        process_count=jax.process_count(),
        start_batch=st.position if st.step > phase.start else 0,
        per_host=self.prepared.local is not None and not self.prepared.local.streams,
        streams=self.s.data.streams, ramp=self.ramp if phase.index == 0 else None,
        first_step=phase.start)

  def _spike(self) -> Optional[spikes.Spike]:
    """Feeds the detector the losses of the steps it has not seen; a completed spike."""
    new = self._pending[self._observed:]
    if not self.spikes.on or not new:
      return None
    self._observed = len(self._pending)
    for step, loss in spikes.step_losses(jax.device_get(new), self.state.step):
      if (found := self.spikes.observe(step, loss)) is not None:
        return found
    return None

  def _rewind(self, rewind: Rewind, phase: Phase) -> None:
    """The state rolled back to the checkpoint before a completed loss spike."""
    with self.hooks.paused():
      spikes.roll_back(rewind.spike, self.spikes, self.s.train.spike.max_rollbacks, phase,
                       self.state, self.ckpts, self.reporter)
    self._pending, self._observed = [], 0
    self._run.interval.restart(self.state.step)  # the spike's steps: time to "other"
    self._waits = 0.0
    self.hooks.timed_from(self.state.step)

  def _save(self, phase: Phase, position: int) -> None:
    self.state.spike = self.spikes.state()  # the detector as of this step, for a resume
    t0 = time.perf_counter()
    with self.hooks.paused():  # waits for the previous save
      # The rows up to this step are stored before its checkpoint can be: a resume from
      # it logs only later steps again (on a bucket, the logs upload in the background).
      self.reporter.sync()
      self.ckpts.save(self.state, phase, position)
    self._wait("checkpoint", time.perf_counter() - t0)

  def _wait(self, category: str, seconds: float) -> None:
    self.hooks.on_time(category, seconds)
    self._waits += seconds
    if category == "data_wait":
      self._data_wait += seconds

  def _log_train(self, phase: Phase, pending: list, interval: Interval) -> None:
    """Writes the interval's train metrics and rates; the hooks see the row (the progress
    bar shows it, the NaN check judges it)."""
    step = self.state.step
    seconds, n_steps, real_tokens, sequences = interval.close(step)
    t0 = time.perf_counter()  # from here the log point's own writes: not training time
    m = _train_metrics(pending) | self.throughput.rates(seconds, n_steps, real_tokens,
                                                        sequences, phase)
    if self._planned:  # next to memory_peak_gib where the platform reports it
      m["memory_planned_gib"] = self._planned / 1024**3
    if self.mixture is not None:
      m |= self.mixture.metrics()
    point = LogPoint(step, seconds, n_steps, self._waits, self._data_wait)
    m |= self.hooks.on_log(point)
    self._waits = self._data_wait = 0.0
    self._last_train_loss = m["loss"]
    # The session's first row imports tensorboardX (seconds on a loaded machine): not a hang.
    with self.hooks.paused() if not self._logged else contextlib.nullcontext():
      self.reporter.write("train", step, m)
    self._logged = True
    # In the next interval, but no step's: a storage stall in these writes (a goodput
    # record, a log row) went to "productive" (133.7 of 166.1 s with a 75 s stall).
    self._waits += time.perf_counter() - t0
    self.hooks.after_log(point, m)

  def _redo_lost_eval(self) -> None:
    """The evaluation of the restored step, when it is an evaluation step whose row is
    missing. A step's checkpoint is started before its evaluation (so a stop signal is
    answered at once), and becomes visible while the evaluation runs: a run killed then
    left a checkpoint without its eval row, which the resume would never write."""
    st = self.state
    if not st.step or st.step % self.s.run.eval_every or st.step >= self.s.train.num_steps:
      return
    have = any(isinstance(r, dict) and r.get("split") == "eval" and r["step"] == st.step
               for r in self.reporter.history(st.step))
    if jax.process_count() > 1:  # every process evaluates, or none: process 0 decides
      have = bool(multihost_utils.broadcast_one_to_all(np.int32(have)))
    if have:
      return
    phase = next(p for p in self.s.train.phases if p.start < st.step <= p.end)
    with self.hooks.paused():
      self._eval_point(phase)

  def _eval_point(self, phase: Phase) -> None:
    ev = self._after_eval(self.evaluate(phase))
    self.reporter.write("eval", self.state.step, ev)
    console.log(f"eval @ {self.state.step}: {describe_eval(ev)}")
    self.probe(self.state.step, phase)

  def final_eval(self) -> dict:
    last = self.s.train.phases[-1]
    if self.ckpts.latest_step() != self.state.step:  # e.g. num_steps raised after a finished run
      self._save(last, 0)
    ev = self._after_eval(self.evaluate(last))
    self.reporter.write("eval", self.state.step, ev)
    self.probe(self.state.step, last)
    return ev


class _PhaseRun:
  """A phase's timing: its interval, its data iterator, the steps still in flight, the
  newest step's metrics, and whether the next step compiles."""

  def __init__(self, interval: Interval, iterator: input_pipeline.TrainIterator,
               progress: Any):
    self.interval, self.iterator, self.progress = interval, iterator, progress
    self.in_flight: collections.deque = collections.deque()
    self.first, self.metrics = True, None

  def dispatched(self, metrics, step: int) -> None:
    """At most _MAX_IN_FLIGHT steps queued: the bar follows the steps as they finish."""
    self.in_flight.append(metrics)
    if len(self.in_flight) > _MAX_IN_FLIGHT:
      jax.block_until_ready(self.in_flight.popleft())
    self.progress(step)

  def drain(self) -> None:
    jax.block_until_ready(self.metrics)
    self.in_flight.clear()


def _train_metrics(pending: list) -> dict:
  rows = jax.device_get(pending)
  sums = jax.tree.map(lambda *x: float(np.sum(x)), *rows)
  good = len(rows) - sums["skipped"]  # skipped steps report zeros, not NaN
  mean = lambda k: sums[k] / good if good else float("nan")
  return summarize(sums) | {
      "loss": mean("loss"), "grad_norm": mean("grad_norm"),
      "learning_rate": float(rows[-1]["learning_rate"]),
      "mask_prob": float(rows[-1]["mask_prob"]),
      "skipped_steps": float(rows[-1]["skipped_total"]),
      "nonfinite_streak": float(max(r["nonfinite_streak"] for r in rows))}


def _all_compiled(key: str) -> None:
  """Waits until every process has compiled the step (a coordination-service barrier,
  not a collective). Without it a process that compiled first waits inside the step's
  first all-reduce, where the CPU collectives (Gloo) give up after 30 s: a gap that one
  compile on a loaded host can exceed (CI saw it). One process: nothing."""
  if jax.process_count() > 1:
    from orbax.checkpoint import multihost  # pylint: disable=import-outside-toplevel
    multihost.get_barrier_sync_fn()(key=key, timeout_ms=900_000)
