"""Preemption: SIGTERM/SIGINT ask the run to checkpoint the current step and stop.

TPU VMs are preempted with SIGTERM; every process of a multi-host run must
stop at the same step, so they agree on the flag with a collective.
"""

import os
import signal
import threading
from typing import Optional

import jax
import numpy as np
from jax.experimental import multihost_utils

from bert_jax import errors

# Several processes must stop at the same step, so they agree on the stop flag
# with a collective. That waits for the device, so not every step: every
# STOP_SYNC_EVERY steps (one process checks its own flag every step, for free).
STOP_SYNC_EVERY = 10


class StopSignals:
  """SIGTERM/SIGINT ask the loop to checkpoint the current step and stop.

  Installed only from the main thread (Python runs handlers there); `uninstall`
  puts the previous handlers back. Further signals while the checkpoint is
  written are noted and ignored, so it is never cut short (SIGKILL cannot cut
  it short either: an unfinished Orbax checkpoint is a temporary folder that
  the next run ignores and removes).
  """

  def __init__(self):
    self._previous: dict = {}
    self.served = False  # a stop it asked for was carried out (the loop raised Preempted)

  @property
  def signum(self) -> Optional[int]:
    """The signal that asked to stop: one noted before training started counts too."""
    return errors.stop_requested()

  def install(self) -> "StopSignals":
    if threading.current_thread() is threading.main_thread():
      for sig in (signal.SIGTERM, signal.SIGINT):
        self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def uninstall(self) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, signal.SIG_DFL if handler is None else handler)
    self._previous = {}
    if self.served:  # carried out: a caller in this process (a test, a notebook) goes on
      errors.clear_stop()

  def _handle(self, signum, frame) -> None:
    name = signal.Signals(signum).name
    if self.signum is None:
      errors.request_stop(signum)
      msg = f"{name} received: checkpointing the current step, then stopping\n"
    else:
      msg = f"{name} received: already stopping, waiting for the checkpoint to finish\n"
    # os.write, not print: the handler may have interrupted a print.
    os.write(2, msg.encode())

  def agreed(self, step: int, sync: bool = False) -> Optional[int]:
    """The signal that asks to stop, agreed by all processes; None to go on.

    With several processes the flags are gathered every STOP_SYNC_EVERY steps
    (or now, with `sync`): every process must call this at the same steps.
    """
    if jax.process_count() == 1:
      return self.signum
    if not sync and step % STOP_SYNC_EVERY:
      return None
    flags = multihost_utils.process_allgather(np.int32(self.signum or 0))
    return int(np.max(flags)) or None
