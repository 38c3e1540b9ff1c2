"""A run's folder and what lives where in it, local or `gs://`: the one place its layout
is spelled (every owner asks a `Workdir`).

  <workdir>/
    checkpoints/<step>/          Orbax: params, opt_state, meta (io/checkpointing)
    prepared/<key>/              prepared data, without data.cache_dir (data/dataset)
    tensorboard/                 TensorBoard events (train/reporting)
      plugins/profile/<time>/    the profiler's captures (train/profiling)
    metrics.jsonl                one JSON object per train, eval, probe, goodput row
    training_curves.png          the plot
    goodput/session-*.json       where each session's time went (train/goodput)
    hang-<host>-<pid>-step<N>.txt  a watchdog's stacks (train/watchdog)
    PROFILE                      a request to profile the next steps (train/profiling)
    .lock-<i>                    process i's lock (storage/workdir_lock)
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from typing import Union

from bert_jax.storage import fs

METRICS = "metrics.jsonl"
TENSORBOARD = "tensorboard"


@dataclasses.dataclass(frozen=True)
class Staged:
  """Where to write one output of a workdir now (`local`), and `publish()` to put it at
  its `target`: the same path on a local disk; on a bucket a temporary local file or
  folder that publish() uploads and removes (for libraries that write only local files:
  the profiler, a watchdog's stacks)."""
  local: str
  target: str

  @property
  def copied(self) -> bool:
    """Whether publish() copies (the target is in a bucket)."""
    return self.local != self.target

  def publish(self) -> None:
    if not self.copied:
      return
    if os.path.isdir(self.local):
      for path in fs.find(self.local):
        fs.upload(path, fs.join(self.target, os.path.relpath(path, self.local)))
      shutil.rmtree(self.local, ignore_errors=True)
    else:
      fs.upload(self.local, self.target)
      os.remove(self.local)


@dataclasses.dataclass(frozen=True)
class Workdir:
  """A run's folder: opened once by the trainer and given to every part of the run that
  writes into it (the lock, the goodput ledger, data preparation, checkpoints, the
  reporter, the profiler, the watchdog)."""
  root: str

  def __str__(self) -> str:  # as the user gave it, in every message
    return self.root

  def staging(self, target: str, folder: bool = False) -> Staged:
    """A local place to write `target`, a file (or with `folder` a folder) of this
    workdir, which Staged.publish() puts in place; see Staged."""
    if not self.is_bucket:
      return Staged(target, target)
    if folder:
      return Staged(tempfile.mkdtemp(prefix="bert_jax-staged-"), target)
    fd, local = tempfile.mkstemp(prefix="bert_jax-staged-", suffix=os.path.splitext(target)[1])
    os.close(fd)
    return Staged(local, target)

  @property
  def is_bucket(self) -> bool:
    return fs.is_gcs(self.root)

  @property
  def checkpoints(self) -> str:
    return fs.join(self.root, "checkpoints")

  @property
  def prepared(self) -> str:
    return fs.join(self.root, "prepared")

  @property
  def tensorboard(self) -> str:
    return fs.join(self.root, TENSORBOARD)

  @property
  def profiles(self) -> str:
    return fs.join(self.tensorboard, "plugins", "profile")

  @property
  def metrics(self) -> str:
    return fs.join(self.root, METRICS)

  @property
  def plot(self) -> str:
    return fs.join(self.root, "training_curves.png")

  @property
  def goodput(self) -> str:
    return fs.join(self.root, "goodput")

  @property
  def profile_request(self) -> str:
    return fs.join(self.root, "PROFILE")

  def hang_file(self, host: str, pid: int, step: int) -> str:
    return fs.join(self.root, f"hang-{host}-{pid}-step{step}.txt")

  def lock(self, process_index: int = 0, name: str | None = None) -> str:
    """Process `process_index`'s lock file (`name`: another file of the folder as the lock,
    for an output folder that is replaced whole)."""
    return fs.join(self.root, name or f".lock-{int(process_index)}")


def opened(workdir: Union[Workdir, str]) -> Workdir:
  """The run's Workdir as given; a path (a user's, a test's, a tool's) as its Workdir: the
  one way in from a string outside storage/ and the trainer (an architecture test)."""
  return workdir if isinstance(workdir, Workdir) else Workdir(workdir)
