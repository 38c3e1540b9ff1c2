"""Where a run's hours went (goodput), added up over every session of a workdir.

A session is one process's life on the workdir, from the moment the process started
(read from the kernel, so imports count) to its last record. Its wall time is split:

  productive    training steps whose results were kept
  startup       process start to the first step: imports, data set-up, the model, restore
  compile       the steps that compiled (each phase's first, each batch-ramp size)
  data_wait     the input pipeline not ready when a step wanted its batch
  eval          evaluations and probes
  checkpoint    checkpoint saves (the time the loop waits for them)
  lost_restart  steps computed again after a restart: a session's steps after the
                checkpoint the next session restored (their time, moved out of productive)
  other         the rest: logging, the final report, a rolled-back spike's steps

Process 0 writes `<workdir>/goodput/session-<start ms>-<host>-<pid>.json` at every log
point and when the session ends (atomically; on a bucket too, where a log point's write
goes to a thread of its own, so a stalled bucket holds no step), so a run killed with -9
keeps its account up to its last log point. A session that never reaches its first
step (refused, already complete, stopped while preparing data) writes nothing. The end of a run prints the sum over the
sessions and logs it as a `goodput` row of metrics.jsonl. Time between sessions (a
machine being replaced) belongs to no session and is not counted.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterator

from bert_jax import console
from bert_jax.errors import BertJaxError, ConfigError
from bert_jax.storage import fs
from bert_jax.storage.workdir import Workdir, opened

CATEGORIES = ("productive", "startup", "compile", "data_wait", "eval", "checkpoint",
              "lost_restart", "other")
_LABELS = {"productive": "productive", "startup": "start-up", "compile": "compile",
           "data_wait": "data waits", "eval": "eval and probes", "checkpoint": "checkpoints",
           "lost_restart": "lost to restarts", "other": "other"}


def process_start_time() -> float:
  """When this process started (epoch seconds, to the kernel's 10 ms tick): Linux's
  /proc/self/stat start time against the boot clock; elsewhere, now."""
  try:
    with fs.open("/proc/self/stat", encoding="ascii") as f:
      ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
    since_start = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - since_start
  except (OSError, ValueError, IndexError, AttributeError):
    return time.time()


class Ledger:
  """This session's seconds per category, its steps, and the sessions before it."""

  def __init__(self, workdir: Workdir, writer: bool, started: float | None = None):
    self.started = process_start_time() if started is None else started
    self.directory = opened(workdir).goodput
    self.path = fs.join(self.directory, f"session-{int(self.started * 1000)}-"
                                        f"{socket.gethostname()}-{os.getpid()}.json")
    self.writer = writer
    self.seconds: collections.Counter = collections.Counter()
    self.restored_step = self.last_step = 0
    self.steps = 0  # productive steps of this session
    self.recomputed = 0
    self._loop_started = self._made = False
    self._bucket = opened(workdir).is_bucket
    self._lock = threading.Lock()
    self._writer: threading.Thread | None = None
    self._pending: dict | None = None
    self._failed: BertJaxError | None = None

  def add(self, category: str, seconds: float) -> None:
    self.seconds[category] += max(0.0, seconds)

  @contextlib.contextmanager
  def timed(self, category: str) -> Iterator[None]:
    t0 = time.perf_counter()
    try:
      yield
    finally:
      self.add(category, time.perf_counter() - t0)

  def previous(self) -> list[dict]:
    """The records of the sessions before this one, oldest first."""
    out = []
    for name in sorted(fs.listdir_or_empty(self.directory)):
      path = fs.join(self.directory, name)
      if name.endswith(".json") and path != self.path:
        try:
          out.append(json.loads(fs.read_text(path)))
        except (OSError, ValueError):
          continue  # a record from another version, or unreadable: left out, not fatal
    return sorted(out, key=lambda r: r["started"])

  def restored(self, step: int) -> None:
    """This session goes on from checkpoint `step`: the steps an earlier session ran past
    it are computed again, and their time is lost to the restart."""
    self.restored_step = self.last_step = step
    before = self.previous()
    if before and before[-1]["last_step"] > step and before[-1]["steps"]:
      last = before[-1]
      self.recomputed = last["last_step"] - step
      per_step = last["seconds"]["productive"] / last["steps"]
      self.add("lost_restart", min(self.recomputed, last["steps"]) * per_step)

  def loop_starts(self) -> None:
    """The first step is next: everything so far not counted elsewhere was start-up."""
    if not self._loop_started:
      self._loop_started = True
      self.add("startup", time.time() - self.started - sum(self.seconds.values())
               + self.seconds["lost_restart"])  # lost_restart is earlier sessions' time

  def steps_done(self, last_step: int, steps: int, seconds: float) -> None:
    """`steps` productive steps up to `last_step` took `seconds` (waits left out)."""
    self.last_step, self.steps = last_step, self.steps + steps
    self.add("productive", seconds)

  def record(self) -> dict:
    wall = time.time() - self.started
    counted = sum(v for k, v in self.seconds.items() if k != "lost_restart")
    seconds = {k: float(self.seconds[k]) for k in CATEGORIES if k != "other"}
    seconds["other"] = max(0.0, wall - counted)
    return {"started": self.started, "wall": wall, "seconds": seconds, "steps": self.steps,
            "restored_step": self.restored_step, "last_step": self.last_step,
            "recomputed_steps": self.recomputed, "host": socket.gethostname(),
            "pid": os.getpid()}

  def flush(self, background: bool = False) -> dict:
    """Writes this session's record (process 0; once it has trained: a run refused, or
    finding its work done, writes nothing) and returns it. `background` (a log point's)
    on a bucket: the newest record is written by a thread of its own, so a stalled
    bucket never holds a step; an earlier such write's failure is raised here."""
    r = self.record()
    if not (self.writer and self._loop_started):
      return r
    if background and self._bucket:
      with self._lock:
        failed, self._failed = self._failed, None
        self._pending = r  # the newest wins: an older one still waiting is dropped
        if self._writer is None or not self._writer.is_alive():
          self._writer = threading.Thread(target=self._write_pending, daemon=True,
                                          name="bert_jax-goodput")
          self._writer.start()
      if failed is not None:
        raise failed
      return r
    self.wait()
    self._write(r)
    return r

  def wait(self) -> None:
    """Waits for a background write (`flush(background=True)`); raises its failure."""
    writer = self._writer
    # Not on a bucket the run has stopped waiting on (a run stopping on its outage): the
    # write in flight would hold the exit for its retries.
    if writer is not None and not fs.given_up(self.path):
      writer.join()
    with self._lock:
      failed, self._failed = self._failed, None
    if failed is not None:
      raise failed

  def _write_pending(self) -> None:
    while True:
      with self._lock:
        r, self._pending = self._pending, None
        if r is None:
          return
      try:
        self._write(r)
      except BertJaxError as e:  # a full disk, a bucket that stopped answering: raised
        with self._lock:         # at the next log point, never a thread's traceback
          self._failed = e

  def _write(self, r: dict) -> None:
    try:
      if not self._made:
        fs.makedirs(self.directory)
        self._made = True
      fs.write_json(self.path, r, indent=1)  # atomic: the last record stays whole
    except OSError as e:  # a full or read-only disk: one line, as for the metrics
      raise ConfigError(f"could not write {self.path}: {console.write_reason(e)}; expected "
                        "a workdir with free space that can be written (what was written "
                        "before is intact: rerun the same command once it can be)") from None

  def total(self) -> dict:
    """Every session's seconds summed; lost_restart moved out of productive."""
    sessions = self.previous() + [self.flush()]
    s = collections.Counter()
    for r in sessions:
      s.update(r["seconds"])
    s["productive"] -= s["lost_restart"]  # recomputed steps were counted as productive
    wall = sum(r["wall"] for r in sessions)
    return {"sessions": len(sessions), "wall": wall, "goodput": s["productive"] / wall,
            "recomputed_steps": sum(r["recomputed_steps"] for r in sessions),
            **{k: float(s[k]) for k in CATEGORIES}}


def describe(total: dict) -> str:
  """The end-of-run line."""
  parts = ", ".join(f"{_LABELS[k]} {total[k]:.1f} s" for k in CATEGORIES if k != "productive"
                    and total[k] >= 0.05)
  recomputed = (f" ({total['recomputed_steps']} steps recomputed)"
                if total["recomputed_steps"] else "")
  return (f"goodput: {total['goodput']:.1%} of {total['wall']:.1f} s over "
          f"{total['sessions']} session(s) was productive training ({total['productive']:.1f} "
          f"s); {parts}{recomputed}")
