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

from bert_jax.storage import fs

METRICS = "metrics.jsonl"
TENSORBOARD = "tensorboard"


@dataclasses.dataclass(frozen=True)
class Workdir:
  root: str

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
