"""Parts of a corpus prepared by a pool of worker processes, with one progress line.

Workers are fresh interpreters (`python -c ...worker_main()`), not forks: the
parent may have JAX and its threads loaded (a fork of that can deadlock), and
a spawned `multiprocessing` child would import the parent's `__main__` (train.py,
JAX) again. Each worker reads jobs (`prep_write.PartJob`) from its stdin and
answers on a dup of its stdout ("progress", "done" or "error"); what it prints
goes to stderr. Its tokenizer runs single-threaded (TOKENIZERS_PARALLELISM,
RAYON_NUM_THREADS): the workers are the parallelism, and threads on top would
only compete for the same cores.

A worker that dies (killed, out of memory) stops the preparation with one
PreparationError line naming its part's input; parts already complete stay in
the hidden parts folder for a rerun.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait

from bert_jax.data import prep_write
from bert_jax.data.prep_check import CacheDirError
from bert_jax.errors import BertJaxError, ConfigError, CorpusError, check_stop
from bert_jax.storage import fs

PROGRESS_SECONDS = 30.0
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_ERRORS = {cls.__name__: cls for cls in (CorpusError, ConfigError, BertJaxError,
                                         CacheDirError)}


class PreparationError(BertJaxError):
  """A worker of the preparation died, or failed on a part."""


def usable_cores() -> int:
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not Linux
    return os.cpu_count() or 1


def worker_count(asked: int, parts: int) -> int:
  """`data.num_workers` (0: all), at most this host's usable cores: each worker is a
  process of ~100 MB that only slows the others beyond one per core (1000 asked on 2
  cores started one per part). Said once, when more were asked than can be used."""
  cores = usable_cores()
  if asked > cores and parts > cores:
    print(f"warning: --config.data.num_workers={asked}: this host has {cores} usable "
          f"core(s); preparing with {cores} worker(s)", file=sys.stderr, flush=True)
  return min(asked or cores, cores)


def run(jobs: Sequence[prep_write.PartJob], workers: int, label: str = "",
        others: Sequence[prep_write.PartJob] = ()) -> None:
  """Prepares every job's part: in this process when `workers` <= 1 or there is one
  job, else in min(workers, jobs) worker processes. `others` are the parts other
  processes prepare into the same folder (counted in the progress once done)."""
  progress = Progress(jobs, label, others)
  if workers <= 1 or len(jobs) <= 1:
    try:
      for i, job in enumerate(jobs):
        prep_write.prepare_part(job, lambda t, f, e, i=i: progress.update(i, t, f, e),
                                 keep_tokenizer=True)
    finally:
      prep_write.release_tokenizer()
    return
  _Pool(min(workers, len(jobs)), progress).run(list(jobs))


class Progress:
  """Tokens/s over all parts (other processes' once done), and the time left from the
  share of the corpus done (bytes of text, or TFDS examples)."""

  def __init__(self, jobs: Sequence[prep_write.PartJob], label: str = "",
               others: Sequence[prep_write.PartJob] = ()):
    self.start = time.monotonic()
    self.next = self.start + PROGRESS_SECONDS
    self.sizes = [j.part.bytes for j in jobs]
    self.others, self.label = list(others), label
    self.total = sum(self.sizes) + sum(j.part.bytes for j in self.others)
    self.unit = "examples" if jobs and jobs[0].part.examples else "MiB"
    self.done: dict[int, tuple[int, float]] = {}  # job -> (tokens, share of its size)
    self.examples: dict[int, int] = {}  # job -> examples written so far
    self.others_done: dict[int, int] = {}  # other job -> tokens

  def update(self, job: int, tokens: int, share: float, examples: int | None = None) -> None:
    self.done[job] = (tokens, min(share, 1.0))
    if examples is not None:
      self.examples[job] = examples
    now = time.monotonic()
    if now >= self.next:
      self.next = now + PROGRESS_SECONDS
      print(self.line(now), flush=True)

  def _look_at_others(self) -> None:
    for i, job in enumerate(self.others):
      path = os.path.join(job.directory, prep_write.PART_FILE)
      if i not in self.others_done and os.path.exists(path):
        with fs.open(path, encoding="utf-8") as f:
          self.others_done[i] = json.load(f)["counts"]["tokens"]

  def line(self, now: float) -> str:
    self._look_at_others()
    tokens = sum(t for t, _ in self.done.values()) + sum(self.others_done.values())
    rate = tokens / max(now - self.start, 1e-9)
    # Examples too: pairs of huge documents are made for a while with no new tokens.
    out = f"  ... {tokens} tokens, {rate:.0f} tokens/s, {sum(self.examples.values())} examples"
    out += self.label
    done = (sum(s * self.sizes[j] for j, (_, s) in self.done.items()) +
            sum(self.others[i].part.bytes for i in self.others_done)) / max(self.total, 1)
    if self.total and done > 0:
      left = (now - self.start) * (1 - done) / done
      size = self.total / 2**20 if self.unit == "MiB" else self.total
      out += f", {100 * done:.0f}% of {size:.0f} {self.unit}, about {_duration(left)} left"
    return out


def _duration(seconds: float) -> str:
  if seconds < 90:
    return f"{seconds:.0f} s"
  if seconds < 5400:
    return f"{seconds / 60:.0f} min"
  return f"{seconds / 3600:.1f} h"


class _Worker:
  def __init__(self):
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (_PACKAGE_ROOT, os.environ.get("PYTHONPATH"))
                                         if p)}
    self.proc = subprocess.Popen(
        [sys.executable, "-c", "from bert_jax.data.prep_workers import worker_main; worker_main()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    self.send = Connection(os.dup(self.proc.stdin.fileno()), readable=False)
    self.recv = Connection(os.dup(self.proc.stdout.fileno()), writable=False)
    self.proc.stdin.close()
    self.proc.stdout.close()
    self.job: int | None = None

  def stop(self) -> None:
    if self.proc.poll() is None:
      self.proc.kill()
    self.proc.wait()
    self.send.close()
    self.recv.close()


class _Pool:
  def __init__(self, n: int, progress: Progress):
    self.n, self.progress = n, progress

  def run(self, jobs: list[prep_write.PartJob]) -> None:
    todo = list(range(len(jobs)))
    workers = [_Worker() for _ in range(self.n)]
    try:
      while todo or any(w.job is not None for w in workers):
        for w in workers:
          if w.job is None and todo:
            w.job = todo.pop(0)
            w.send.send(jobs[w.job])
        busy = {w.recv: w for w in workers if w.job is not None}
        for conn in wait(list(busy), timeout=0.2):  # bounded: a stop request is seen
          self._answer(busy[conn], jobs)
        check_stop()  # the workers are stopped below, finished parts kept
      for w in workers:
        w.send.send(None)
    finally:
      for w in workers:
        w.stop()

  def _answer(self, w: _Worker, jobs: list[prep_write.PartJob]) -> None:
    job = jobs[w.job]
    try:
      msg = w.recv.recv()
    except (EOFError, OSError):
      code = w.proc.wait()
      how = (f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}")
      raise PreparationError(
          f"corpus '{job.data.corpus}': the worker preparing {job.part.describe()} died "
          f"({how}{', out of memory?' if code == -signal.SIGKILL else ''}); nothing was "
          "cached: rerun to prepare what is missing (finished parts are kept)") from None
    if msg[0] == "progress":
      self.progress.update(w.job, msg[1], msg[2], msg[3])
    elif msg[0] == "done":
      self.progress.update(w.job, self.progress.done.get(w.job, (0, 0))[0], 1.0)
      w.job = None
    else:
      _, kind, message = msg
      raise _ERRORS.get(kind, PreparationError)(message)


def worker_main() -> None:
  """A worker's loop: jobs from stdin until None, answers on the original stdout."""
  answers = Connection(os.dup(1), readable=False)
  os.dup2(2, 1)  # anything printed goes to stderr, never into the answers
  # Ctrl-C and SIGTERM reach the whole process group: the parent decides (it stops its
  # workers as it stops); a worker whose parent is gone ends at its next answer.
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  jobs = Connection(os.dup(0), writable=False)
  try:
    _serve(jobs, answers)
  except (BrokenPipeError, ConnectionResetError, EOFError):
    # The parent is gone (killed, or stopped by SIGTERM): nobody to answer. The part
    # in hand removed its staging folder on the way out; leave without a traceback.
    os._exit(0)  # pylint: disable=protected-access


def _serve(jobs: Connection, answers: Connection) -> None:
  while (job := jobs.recv()) is not None:
    report = lambda tokens, share, examples: answers.send(("progress", tokens, share, examples))
    try:
      prep_write.prepare_part(job, report, keep_tokenizer=True)
    except (BrokenPipeError, ConnectionResetError):
      raise
    except BertJaxError as e:
      answers.send(("error", type(e).__name__, str(e)))
      continue
    except Exception as e:  # pylint: disable=broad-except
      answers.send(("error", "PreparationError", f"corpus '{job.data.corpus}': preparing "
                    f"{job.part.describe()} failed: {type(e).__name__}: {e}"))
      continue
    answers.send(("done",))
