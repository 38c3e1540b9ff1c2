"""A hung run says where it hangs (`config.watchdog_s`).

A collective that never completes (a host that died without its process exiting, a
network partition) or an input pipeline stuck on storage blocks the loop forever,
and a run on rented hardware pays for every hour of it. The loop beats at every step
it dispatches, and it dispatches at most a few ahead of the device, so a step that
never completes stops the beats. When none comes for `watchdog_s` seconds, this thread
writes the Python stack of every thread of the process (its name, then its stack, innermost call last) to
`<workdir>/hang-<host>-<pid>-step<N>.txt` (through a local file on a bucket workdir)
and says one line on stderr; with `watchdog_exit` it then ends the process with exit
status 3, so a scheduler restarts the run, which resumes exactly from its newest
checkpoint.

Compiling (each phase's first step), evaluations, probes and checkpoint waits are
not steps: the loop pauses the watchdog around them. Off (0) by default; a timeout
far above the normal step time (minutes) is what it is for.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator
from typing import Optional

from bert_jax.storage import fs

EXIT_STATUS = 3  # ended by the watchdog: a scheduler may restart the run


class Watchdog:

  def __init__(self, timeout_s: float, workdir: str, exit_on_hang: bool = False):
    self.timeout_s, self.workdir, self.exit_on_hang = float(timeout_s), workdir, exit_on_hang
    self.step = 0
    self.fired: Optional[str] = None  # the stack file, once written
    self._last = time.monotonic()
    self._paused = 0
    self._lock = threading.Lock()
    self._stop = threading.Event()
    self._thread: Optional[threading.Thread] = None

  def __enter__(self) -> Watchdog:
    if self.timeout_s > 0:
      self._thread = threading.Thread(target=self._watch, name="bert_jax-watchdog", daemon=True)
      self._thread.start()
    return self

  def __exit__(self, *exc) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join(timeout=5)

  def beat(self, step: int) -> None:
    """Step `step` was dispatched (the one before it has nearly finished)."""
    self.step, self._last = step, time.monotonic()

  @contextlib.contextmanager
  def paused(self) -> Iterator[None]:
    """`with watchdog.paused():` around what is not a step (compile, eval, a save)."""
    with self._lock:
      self._paused += 1
    try:
      yield
    finally:
      with self._lock:
        self._paused -= 1
        self._last = time.monotonic()

  def _watch(self) -> None:
    while not self._stop.wait(min(1.0, self.timeout_s / 4)):
      with self._lock:
        idle = 0.0 if self._paused else time.monotonic() - self._last
      if idle >= self.timeout_s and self.fired is None:
        self._fire(idle)

  def _fire(self, idle: float) -> None:
    name = f"hang-{socket.gethostname()}-{os.getpid()}-step{self.step}.txt"
    fd, local = tempfile.mkstemp(prefix="bert_jax-hang-", suffix=".txt")
    with os.fdopen(fd, "w") as f:
      f.write(f"no training step completed for {idle:.0f} s after step {self.step} "
              f"(config.watchdog_s={self.timeout_s:g}); every thread's Python stack:\n\n")
      f.write(stacks())
    path = fs.join(self.workdir, name)
    try:
      fs.upload(local, path)
      os.remove(local)
    except Exception:  # pylint: disable=broad-except
      path = local  # the workdir cannot take it (the storage may be what hangs)
    self.fired = path
    end = (f"; exiting with status {EXIT_STATUS} (config.watchdog_exit) so a scheduler "
           "restarts the run; it resumes from its newest checkpoint" if self.exit_on_hang
           else "; still waiting")
    sys.stderr.write(f"error: no training step completed for {idle:.0f} s after step "
                     f"{self.step} (config.watchdog_s={self.timeout_s:g}); the stacks of "
                     f"every thread are in {path}{end}\n")
    sys.stderr.flush()
    if self.exit_on_hang:
      os._exit(EXIT_STATUS)  # pylint: disable=protected-access  (the main thread is stuck)


def stacks() -> str:
  """Every thread's name and Python stack, innermost call last (the hung one names the
  frame it waits in: a collective, a read, a lock)."""
  frames = sys._current_frames()  # pylint: disable=protected-access
  out = []
  for t in sorted(threading.enumerate(), key=lambda t: t is not threading.main_thread()):
    frame = frames.get(t.ident)
    if frame is None:
      continue
    out.append(f"Thread {t.name!r} (ident {t.ident}{', daemon' if t.daemon else ''}):\n"
               + "".join(traceback.format_stack(frame)))
  return "\n".join(out)
