"""A hung run says where it hangs (`config.watchdog_s`).

A collective that never completes (a host that died without its process exiting, a
network partition) or an input pipeline stuck on storage blocks the loop forever,
and a run on rented hardware pays for every hour of it. The loop beats at every step
it dispatches, and it dispatches at most a few ahead of the device, so a step that
never completes stops the beats. When none comes for `watchdog_s` seconds, this thread
writes the Python stack of every thread of the process (its name, then its stack,
innermost call last) to `<workdir>/hang-<host>-<pid>-step<N>.txt` and says one line on
stderr. On a bucket workdir the file is written locally and the line said first; the
copy to the bucket follows in the background (the stalled storage may be the hang); with `watchdog_exit` it then ends the process with exit
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
import threading
import time
import traceback
from collections.abc import Iterator
from typing import Any, Optional

from bert_jax.storage import fs
from bert_jax.storage.workdir import Staged, Workdir, opened

EXIT_STATUS = 3  # ended by the watchdog: a scheduler may restart the run
COPY_WAIT_S = 10.0  # at most this long for the hang file's copy to a bucket, before exiting
MIN_TIMEOUT_S = 1.0  # settings refuses less: a step's own dispatch can take that long


class Watchdog:

  def __init__(self, timeout_s: float, workdir: Workdir, exit_on_hang: bool = False):
    self.timeout_s, self.exit_on_hang = float(timeout_s), exit_on_hang
    self.workdir = opened(workdir)
    self.step = 0
    self.fired: Optional[str] = None  # the newest stall's stack file, once written
    self.stalls = 0  # stalls reported: each stall once, however many (a false alarm
    # under load must not silence the real stall later in the run)
    self._last = time.monotonic()
    self._reported: Optional[float] = None  # the `_last` of the stall reported last
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

  # Its hook calls (train/hooks): a thread from the loop's start to its end, a beat per
  # step, and no count while a step compiles.
  def start(self) -> None:
    self.__enter__()

  def close(self) -> None:
    self.__exit__()

  def step_scope(self, step: int, compiling: bool):
    return self.paused() if compiling else contextlib.nullcontext()

  def after_step(self, step: int, metrics: Any) -> None:
    self.beat(step)

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
        last = self._last
        idle = 0.0 if self._paused else time.monotonic() - last
      if idle >= self.timeout_s and self._reported != last:
        self._reported = last
        self.stalls += 1
        self._fire(idle)
      elif self._reported is not None and self._reported != last and not self.exit_on_hang:
        self._reported = None  # the stall ended: said once, and watched again
        os.write(2, (f"note: training went on at step {self.step} after the stall reported "
                     "above; the watchdog watches again\n").encode())

  def _fire(self, idle: float) -> None:
    """Writes the stacks to a local file and says so first, then copies the file to a
    bucket workdir best-effort in a thread of its own: the storage may be what hangs,
    and a watchdog never waits on it longer than COPY_WAIT_S (before exiting)."""
    text = (f"no training step completed for {idle:.0f} s after step {self.step} "
            f"(config.watchdog_s={self.timeout_s:g}); every thread's Python stack:\n\n"
            + stacks())
    staged = local = None
    try:
      staged = self.workdir.staging(
          self.workdir.hang_file(socket.gethostname(), os.getpid(), self.step))
      local = staged.local
      fs.write_text(local, text)
    except OSError:  # a full or read-only local disk: the line still goes out
      local = None
    self.fired = local or "(not written: the local disk refused it)"
    copy = None
    where = self.fired
    if staged is not None and staged.copied and local is not None:
      copy = threading.Thread(target=self._copy, args=(staged,), daemon=True,
                              name="bert_jax-watchdog-copy")
      where = f"{local} (being copied to {staged.target})"
    end = (f"; exiting with status {EXIT_STATUS} (config.watchdog_exit) so a scheduler "
           "restarts the run; it resumes from its newest checkpoint" if self.exit_on_hang
           else "; still waiting")
    # One write to the descriptor: never behind a lock another (hung) thread may hold.
    os.write(2, (f"error: no training step completed for {idle:.0f} s after step {self.step} "
                 f"(config.watchdog_s={self.timeout_s:g}); the stacks of every thread are in "
                 f"{where}{end}\n").encode())
    if copy is not None:
      copy.start()
    if self.exit_on_hang:
      if copy is not None:
        copy.join(COPY_WAIT_S)  # bounded: a stalled bucket does not delay the exit more
      os._exit(EXIT_STATUS)  # pylint: disable=protected-access  (the main thread is stuck)

  def _copy(self, staged: Staged) -> None:
    try:
      staged.publish()
      self.fired = staged.target
    except Exception:  # pylint: disable=broad-except
      pass  # the local file stays, named in the line already said


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
