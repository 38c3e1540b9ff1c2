"""Profiles of a running run's steps (`config.profile`), at chosen steps or on demand.

  config.profile.steps=(1000,1010)   steps 1000..1009 traced, once
  touch <workdir>/PROFILE            the next `profile.on_demand_steps` steps (5), seen at
                                     the next log point; a number in the file asks for that
                                     many. The file is removed when the capture starts.

A capture is a `jax.profiler` trace in `<workdir>/tensorboard/plugins/profile/<time>/`:
TensorBoard's profile plugin (`tensorboard --logdir <workdir>/tensorboard`, the Profile
tab) and Perfetto (`*.trace.json.gz`) read it; each step is a `train` step annotation.
On a bucket workdir the trace is written locally and uploaded when it ends. Off, it
costs one flag test per step and one look for the file per log interval.
"""

from __future__ import annotations

from typing import Any, Optional

import jax

from bert_jax import console
from bert_jax.storage import fs
from bert_jax.storage.workdir import Staged, Workdir, opened


class StepProfiler:

  def __init__(self, steps: tuple, on_demand_steps: int, workdir: Workdir):
    self.planned = tuple(steps)  # (start, end) or ()
    self.on_demand_steps = on_demand_steps
    self.workdir = opened(workdir)
    self.end: Optional[int] = None  # while tracing: the step it stops after
    self._staged: Optional[Staged] = None  # while tracing: where the trace is written
    self.captures: list[str] = []  # where each finished trace went
    self._stuck: Optional[str] = None  # a request file that could not be removed

  @property
  def active(self) -> bool:
    return self.end is not None

  def annotate(self, step: int):
    """The context a step is dispatched in: a step annotation while tracing."""
    if self.active:
      return jax.profiler.StepTraceAnnotation("train", step_num=step)
    return _NULL

  def step_scope(self, step: int, compiling: bool):  # its hook call (train/hooks)
    return self.annotate(step)

  def after_log(self, point: Any, row: dict) -> None:  # its hook call: a log point checks for PROFILE
    self.check_request(point.step)

  def before_step(self, step: int) -> None:
    """Starts the planned capture if `step` (about to run) is its first."""
    if not self.active and self.planned and step == self.planned[0]:
      self._start(step, self.planned[1])

  def after_step(self, step: int, metrics: Any) -> None:
    """Stops a capture whose last step was `step`, once it has run."""
    if self.active and step >= self.end:
      jax.block_until_ready(metrics)
      self._stop()

  def check_request(self, step: int) -> None:
    """At a log point: `<workdir>/PROFILE` asks for the next steps."""
    path = self.workdir.profile_request
    if self.active or not fs.exists(path):
      return
    n = self.on_demand_steps
    try:  # any PROFILE is a request; a count it holds is a bonus
      text = fs.read_text(path).strip()
      if text.isdigit() and int(text) > 0:
        n = int(text)
      elif text:  # said, not silently replaced: '0' or 'abc' asked for something else
        console.warn(f"warning: profile: {path} holds {text[:40]!r}; expected a positive "
                     f"step count (or nothing); tracing the default {n} steps")
    except (OSError, UnicodeDecodeError, ValueError) as e:  # a folder, bytes, unreadable
      console.warn(f"warning: profile: {path} could not be read as a step count ({type(e).__name__}); "
                   f"tracing the default {n} steps")
    try:
      if fs.isdir(path):
        fs.rmtree(path)
      else:
        fs.remove(path)
    except OSError as e:  # left behind, it would ask again at every log point
      if self._stuck != path:
        console.warn(f"warning: profile: cannot remove {path} ({e.strerror or e}); the "
                     "request is ignored until it can be")
      self._stuck = path
      return
    self._start(step, step + n)

  def close(self) -> None:
    if self.active:
      self._stop()

  def _start(self, step: int, end: int) -> None:
    self._staged = self.workdir.staging(self.workdir.tensorboard, folder=True)
    jax.profiler.start_trace(self._staged.local, create_perfetto_trace=False)
    self.end = end
    console.log(f"profile: tracing steps {step}..{end - 1}")

  def _stop(self) -> None:
    jax.profiler.stop_trace()
    self.end = None
    where = self._staged.target
    self._staged.publish()  # a bucket's: uploaded now
    self.captures.append(where)
    console.log(f"profile: trace written to {fs.join(where, 'plugins', 'profile')} "
                "(TensorBoard's Profile tab, or Perfetto: *.trace.json.gz)")


class _Null:
  def __enter__(self):
    return None

  def __exit__(self, *exc):
    return False


_NULL = _Null()
