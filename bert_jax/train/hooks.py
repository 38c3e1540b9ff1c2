"""What watches the step loop: small objects with named calls, registered by the trainer.

The loop (train/loop.py) runs steps, logs, checkpoints, evaluates and stops. Everything
else that happens around a step is a hook, with any of these calls:

  start()                      the loop is about to run its first step
  step_scope(step, compiling)  a context the step is dispatched in (the profiler's trace
                               annotation; the watchdog pauses while the step compiles)
  before_step(step)            the profiler starts a planned capture
  after_step(step, metrics)    the watchdog's heartbeat, a capture's end, the lease check
  on_time(category, seconds)   time that was not a productive step (compile, data_wait,
                               checkpoint, eval): the goodput ledger
  on_log(point) -> dict        a log point (`LogPoint`): a row's extra metrics
                               (stragglers), the goodput record
  after_log(point, row)        once the row is written: the progress bar's figures, the
                               NaN/inf check (it raises), the profiler's on-demand request
                               (a capture started before the first row's imports would
                               lose its step annotations)
  after_eval(step, phase, params)  an evaluation's row is written: the training probes
  progress(step)               steps up to `step` are dispatched (the progress bar)
  timed_from(step)             the rates restart at `step`: a compile or a rollback is
                               left out of them (the progress bar's estimate)
  paused()                     a context around long waits the loop knows of (saves,
                               evaluations, a rollback): the watchdog stops counting
  summary() -> str             a part of the end-of-run throughput line
  close()                      the loop has ended
Hooks are called in the order registered; a call a hook does not have costs nothing.

Beside them, calls at a cadence (Levanter's `add_hook(fn, every=N)`): `Hooks.add(fn,
every=N)` calls `fn(StepInfo)` after every N-th step. The loop registers its own this way,
first and in this order: the spike check (which may answer `Rewind`: the loop goes back
to the checkpoint before the spike), the log row, the checkpoint, the stop-signal check
and the evaluation (with the probes, through `after_eval`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple, Optional

from bert_jax.storage import workdir_lock
from bert_jax.train import goodput, stragglers
from bert_jax import console
from bert_jax.errors import NonFiniteError

CALLS = ("start", "step_scope", "before_step", "after_step", "on_time", "on_log", "after_log",
         "after_eval", "progress", "timed_from", "paused", "summary", "close")


class StepInfo(NamedTuple):
  """What a call at a cadence is given: the steps done, the phase of the last one, and
  the run's live state (`train/resume.RunState`: params, opt_state, step)."""
  step: int
  phase: Any  # settings.Phase
  state: Any


class Rewind(NamedTuple):
  """A cadence call's answer: the run goes back to before a completed loss spike
  (`train/spikes.Spike`); the loop restores the checkpoint and skips the spike's batches."""
  spike: Any


@dataclasses.dataclass(frozen=True)
class Periodic:
  """`fn` after every step that is a multiple of one of `every` (0: none), and at each
  phase's last step where `at_phase_end`. At the run's last step `at_run_end` decides
  when it is given (True: always, False: never), else the same rule."""
  name: str
  fn: Callable[[StepInfo], Optional[Rewind]]
  every: tuple[int, ...]
  at_phase_end: bool = False
  at_run_end: Optional[bool] = None

  def due(self, step: int, phase_end: int, num_steps: int) -> bool:
    if step == num_steps and self.at_run_end is not None:
      return self.at_run_end
    return (any(n > 0 and step % n == 0 for n in self.every)
            or (self.at_phase_end and step == phase_end))


@dataclasses.dataclass(frozen=True)
class LogPoint:
  """The steps since the previous log point, as the loop measured them."""
  step: int
  seconds: float  # wall time of the interval
  steps: int  # steps in it
  waits: float  # of `seconds`, waits that were not steps (data, saves)
  data_wait: float  # of `waits`, the input pipeline's


class Hooks:
  """The registered hooks, called by name."""

  def __init__(self, hooks: Sequence[Any] = ()):
    self.hooks = list(hooks)
    self._by_call = {c: [getattr(h, c) for h in self.hooks if hasattr(h, c)] for c in CALLS}
    self.periodic: list[Periodic] = []
    self._firsts = 0  # how many of them were added with first=True (they lead, in order)

  def add(self, fn: Callable[[StepInfo], Optional[Rewind]], every: int | Sequence[int],
          name: str = "", at_phase_end: bool = False, at_run_end: Optional[bool] = None,
          first: bool = False) -> None:
    """Calls `fn(StepInfo)` after every `every`-th step (one cadence or several). Calls
    added with `first` come before all others, in the order they were added (the loop's
    own go first)."""
    every = (every,) if isinstance(every, int) else tuple(every)
    if not every or any(n < 0 for n in every):
      raise ValueError(f"hook {name or fn!r}: every={every!r}; expected steps >= 0")
    p = Periodic(name or getattr(fn, "__name__", "hook"), fn, every, at_phase_end, at_run_end)
    if first:
      self.periodic.insert(self._firsts, p)
      self._firsts += 1
    else:
      self.periodic.append(p)

  def due(self, step: int, phase_end: int, num_steps: int) -> list[Periodic]:
    """The cadence calls due after `step`, in their order."""
    return [p for p in self.periodic if p.due(step, phase_end, num_steps)]

  @contextlib.contextmanager
  def step_scope(self, step: int, compiling: bool) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
      for scope in self._by_call["step_scope"]:
        stack.enter_context(scope(step, compiling))
      yield

  @contextlib.contextmanager
  def paused(self) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
      for pause in self._by_call["paused"]:
        stack.enter_context(pause())
      yield

  def start(self) -> None:
    for call in self._by_call["start"]:
      call()

  def before_step(self, step: int) -> None:
    for call in self._by_call["before_step"]:
      call(step)

  def after_step(self, step: int, metrics: Any) -> None:
    for call in self._by_call["after_step"]:
      call(step, metrics)

  def on_time(self, category: str, seconds: float) -> None:
    for call in self._by_call["on_time"]:
      call(category, seconds)

  def on_log(self, point: LogPoint) -> dict:
    row: dict = {}
    for call in self._by_call["on_log"]:
      row |= call(point) or {}
    return row

  def after_log(self, point: LogPoint, row: dict) -> None:
    for call in self._by_call["after_log"]:
      call(point, row)

  def after_eval(self, step: int, phase: Any, params: Any) -> None:
    for call in self._by_call["after_eval"]:
      call(step, phase, params)

  def progress(self, step: int) -> None:
    for call in self._by_call["progress"]:
      call(step)

  def timed_from(self, step: int) -> None:
    for call in self._by_call["timed_from"]:
      call(step)

  def summary(self) -> list[str]:
    return [part for call in self._by_call["summary"] if (part := call())]

  def close(self) -> None:
    for call in self._by_call["close"]:
      call()


class LeaseCheck:
  """A bucket lease another run took over: the run writes nothing more (a flag read)."""

  def after_step(self, step: int, metrics: Any) -> None:
    workdir_lock.check_held()


class GoodputHook:
  """The goodput ledger's side of the loop: where the time went, recorded per log."""

  def __init__(self, ledger: goodput.Ledger):
    self.ledger = ledger

  def start(self) -> None:
    self.ledger.loop_starts()

  def on_time(self, category: str, seconds: float) -> None:
    self.ledger.add(category, seconds)

  def on_log(self, point: LogPoint) -> dict:
    self.ledger.steps_done(point.step, point.steps, point.seconds - point.waits)
    self.ledger.flush(background=True)
    return {}


class Stragglers:
  """Every process's step time and input wait at each log point (a collective: every
  process logs at the same steps); process 0 names a straggler, once per 10 log points
  each (`config.straggler_factor`)."""

  def __init__(self, factor: float, log_every: int):
    self.factor, self.log_every = factor, log_every
    self._named: dict[int, int] = {}  # process -> step it was last named at

  def on_log(self, point: LogPoint) -> dict:
    if point.steps <= 0:
      return {}
    times = stragglers.gather(point.seconds / point.steps, point.data_wait / point.steps)
    found = stragglers.slowest(times, self.factor)
    if found is not None and point.step - self._named.get(found[0], -10**9) >= (
        10 * self.log_every):
      self._named[found[0]] = point.step
      console.warn(found[1] + f" (step {point.step})")
    return stragglers.row(times)


class ProgressBar:
  """The tqdm bar of process 0 (`config.progress_bar`): the steps as they are dispatched,
  a log row's figures beside it, and rates and estimate without compiles, rollbacks or
  pauses. Lines printed while it runs go through it (console.through)."""

  def __init__(self, total: int, initial: int):
    self.total, self.initial = total, initial
    self.bar: Optional[Any] = None
    self._through = contextlib.ExitStack()

  def start(self) -> None:
    from tqdm import tqdm  # pylint: disable=import-outside-toplevel
    self.bar = tqdm(total=self.total, initial=self.initial, unit="step", dynamic_ncols=True,
                    smoothing=0.05)
    self._through.enter_context(console.through(self.bar))

  def progress(self, step: int) -> None:
    if step > self.bar.n:
      self.bar.update(step - self.bar.n)

  def timed_from(self, step: int) -> None:
    """Restarts the bar's clock and rate at `step` (tqdm has no call for just that)."""
    self.bar.reset()
    self.bar.initial = self.bar.n = self.bar.last_print_n = step
    self.bar.refresh()

  @contextlib.contextmanager
  def paused(self) -> Iterator[None]:
    yield
    self.bar.unpause()  # the pause (a save, an evaluation) is no time per step

  def after_log(self, point: LogPoint, m: dict) -> None:
    post = {"loss": f"{m['loss']:.3f}", "mlm_acc": f"{m['mlm_accuracy']:.3f}"}
    post |= {f"{t}_acc": f"{m[t + '_accuracy']:.3f}" for t in ("nsp", "sop")
             if t + "_accuracy" in m}  # none for config.objective 'mlm'
    if "sequences_per_sec" in m:
      post["seq_s"] = f"{m['sequences_per_sec']:.0f}"
    if "mfu" in m:
      post["mfu"] = f"{m['mfu']:.1%}"
    if "memory_peak_gib" in m:  # TPU, GPU: the largest peak over this process's devices
      post["mem"] = f"{m['memory_peak_gib']:.1f}G"
    self.bar.set_postfix(post)

  def close(self) -> None:
    self._through.close()
    if self.bar is not None:
      self.bar.close()


class NonFiniteCheck:
  """Stops the run when the loss or gradients were NaN/inf for `limit` consecutive steps
  (`config.train.max_consecutive_nonfinite`), as a log row shows them."""

  def __init__(self, limit: int, latest_checkpoint: Callable[[], Optional[int]]):
    self.limit, self.latest_checkpoint = limit, latest_checkpoint

  def after_log(self, point: LogPoint, row: dict) -> None:
    if (streak := row["nonfinite_streak"]) >= self.limit:
      raise NonFiniteError(
          f"loss or gradients were NaN/inf for {int(streak)} consecutive steps (up to step "
          f"{point.step}; config.train.max_consecutive_nonfinite={self.limit}); those steps "
          f"left the parameters unchanged, the newest checkpoint is step "
          f"{self.latest_checkpoint()}; try a lower config.train.learning_rate")


class Probes:
  """The linear probes of the current parameters after every evaluation
  (`config.probe.tasks`, eval/training_probes.RunProbes), as the evaluated phase applies
  them (`config_at(phase index)`), logged as the evaluated step."""

  def __init__(self, probes: Any, config_at: Callable[[int], Any], write: Callable):
    self.probes, self.config_at, self.write = probes, config_at, write

  def after_eval(self, step: int, phase: Any, params: Any) -> None:
    m = self.probes.run(params, self.config_at(phase.index))
    self.write("probe", step, m)
    console.log(f"probe @ {step}: {self.probes.describe(m)}")

  def summary(self) -> str:
    return f"probes {self.probes.seconds:.1f} s" if self.probes.seconds else ""
