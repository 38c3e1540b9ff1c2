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
  after_log(point)             once the row is written: the profiler's on-demand request
                               (a capture started before the first row's imports would
                               lose its step annotations)
  paused()                     a context around long waits the loop knows of (saves,
                               evaluations, a rollback): the watchdog stops counting
  close()                      the loop has ended
Hooks are called in the order registered; a call a hook does not have costs nothing.
Spike rollback is not a hook: it rewinds the loop's own state and data position.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

from bert_jax.storage import workdir_lock
from bert_jax.train import goodput, stragglers
from bert_jax import console

CALLS = ("start", "step_scope", "before_step", "after_step", "on_time", "on_log", "after_log",
         "paused", "close")


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

  def after_log(self, point: LogPoint) -> None:
    for call in self._by_call["after_log"]:
      call(point)

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
