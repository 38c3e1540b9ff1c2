"""Loss spikes (`config.train.spike_rollback`): when to roll a run back.

A finite spike (the loss jumping to several times its running average and staying
there) is what long runs die of; `max_consecutive_nonfinite` only catches NaN/inf.
PaLM (Chowdhery et al. 2022, section 5.1) restarts from a checkpoint about 100 steps
before the spike and skips the 200-500 batches around it; large-run users do it by
hand. Here the loop does it:

  running mean   the mean of the train losses seen, over the last `window` steps
                 (an average of all until `window` losses are in, then an exponential
                 average with weight 1/window); spiking steps do not move it
  a spike        a step whose loss > factor x the running mean, judged only once
                 `window` losses are in; `patience` of them in a row trigger a rollback
  rollback       (the loop) the newest checkpoint before the spike's first step, in
                 the current phase, is restored; the batches since it are skipped: the
                 data goes on from where the spike was found; one line says so

Everything it decides is a function of the losses in step order, and its state goes
into every checkpoint, so a run rolls back at the same steps each time, and a resume
after kill -9 (even between a rollback and the next checkpoint) ends with the same
arrays and rows.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Optional

from bert_jax import console
from bert_jax.errors import NonFiniteError

if TYPE_CHECKING:
  from bert_jax.settings import Phase
  from bert_jax.train.reporting import Reporter
  from bert_jax.train.resume import RunCheckpoints, RunState


@dataclasses.dataclass
class Spike:
  first: int  # the first spiking step of the streak
  last: int  # the step at which it was found (the streak's `patience`-th)
  loss: float  # the loss at `last`
  mean: float  # the running mean it was compared with


@dataclasses.dataclass
class SpikeDetector:
  factor: float
  patience: int
  window: int
  mean: float = 0.0
  seen: int = 0
  streak: int = 0
  first: int = -1
  rollbacks: int = 0

  @property
  def on(self) -> bool:
    return self.factor > 0

  def observe(self, step: int, loss: float) -> Optional[Spike]:
    """Takes step `step`'s loss (in step order); a Spike when it completes a streak."""
    if not self.on or not math.isfinite(loss):
      return None  # a skipped NaN/inf step is max_consecutive_nonfinite's to judge
    if self.seen >= self.window and loss > self.factor * self.mean:
      if self.streak == 0:
        self.first = step
      self.streak += 1
      if self.streak >= self.patience:
        found = Spike(self.first, step, loss, self.mean)
        self.streak, self.first = 0, -1
        return found
      return None
    self.streak, self.first = 0, -1
    self.seen += 1
    self.mean += (loss - self.mean) / min(self.seen, self.window)
    return None

  def state(self) -> dict:
    """What a checkpoint keeps (JSON)."""
    return {"mean": self.mean, "seen": self.seen, "streak": self.streak,
            "first": self.first, "rollbacks": self.rollbacks}

  def load(self, state: Optional[dict]) -> None:
    """A checkpoint's state; none (an older checkpoint, or off): a fresh start."""
    for k, v in (state or {}).items():
      setattr(self, k, float(v) if k == "mean" else int(v))


def step_losses(rows: list[dict], last_step: int) -> list[tuple[int, float]]:
  """(step, loss) of each step of a log interval ending at `last_step`, in order; a
  skipped step (NaN/inf) as NaN."""
  first = last_step - len(rows) + 1
  return [(first + i, float(r["loss"]) if not float(r["skipped"]) else float("nan"))
          for i, r in enumerate(rows)]


def roll_back(spike: Spike, detector: SpikeDetector, max_rollbacks: int, phase: Phase,
              state: RunState, ckpts: RunCheckpoints, reporter: Reporter) -> None:
  """Restores into `state` the newest checkpoint of `phase` before the spike, deletes the
  newer ones (written during the spike) and the rows after it; the caller's data goes
  on where it is, so the batches since the checkpoint are skipped. One line; a spike
  beyond `max_rollbacks`, or with no checkpoint to go back to, stops the run."""
  what = (f"loss spike at steps {spike.first}..{spike.last} (loss {spike.loss:.4g} > "
          f"{detector.factor:g} x running mean {spike.mean:.4g})")
  if detector.rollbacks >= max_rollbacks:
    raise NonFiniteError(f"{what} after {detector.rollbacks} rollback(s) "
                         f"(config.train.spike_rollback.max_rollbacks={max_rollbacks}); "
                         f"stopped; the newest checkpoint is step {ckpts.latest_step()}")
  ckpts.finish_save()
  good = [s for s in ckpts.all_steps() if phase.start <= s < spike.first]
  if not good:
    raise NonFiniteError(f"{what}; no checkpoint of this phase before step {spike.first} to "
                         "roll back to; stopped: expected a checkpoint before the spike "
                         "(lower config.checkpoint_every or raise config.keep_checkpoints)")
  back = max(good)
  ckpts.delete_after(back)  # written during the spike: a resume must not start there
  restored = ckpts.restore(back)
  skipped = state.step - back
  state.step, state.params, state.opt_state = back, restored.params, restored.opt_state
  detector.rollbacks += 1
  reporter.truncate(back)
  console.warn(f"warning: {what}: rolled back to step {back}, skipping the {skipped} batches of "
               f"steps {back + 1}..{back + skipped} (rollback {detector.rollbacks} of "
               f"{max_rollbacks})")
