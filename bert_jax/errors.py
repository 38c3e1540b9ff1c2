"""User-facing errors: one line, naming the input and what was expected; and the stop request a signal leaves for the work to act on.

A signal handler only notes the request (`request_stop`): Python runs handlers between
any two bytecodes, inside a garbage-collection callback too, where an exception it
raises is printed and dropped. The work checks the note at its safe points
(`check_stop`: preparation and its worker pool, between the run's chapters; the
training loop reads `stop_requested` at every step, after an evaluation or a save).
"""

import threading
from collections.abc import Callable
from typing import Optional, TypeVar

T = TypeVar("T")


class BertJaxError(Exception):
  """A problem with the user's input or config (not a bug).

  train.py / the CLIs print `error: <message>` on one line and exit 2.
  Messages name the file/field and what was expected.
  """


class CorpusError(BertJaxError):
  """The corpus (file, TFDS name, built-in) cannot make examples."""


class ConfigError(BertJaxError):
  """A config value that cannot work."""


class CheckpointError(BertJaxError):
  """A checkpoint that is missing, corrupt or does not match the config."""


class TopologyError(BertJaxError):
  """A TPU topology that cannot be compiled for here: unknown name, libtpu missing or mismatched."""


class NonFiniteError(BertJaxError):
  """Training produced non-finite losses/gradients for too long, or NaN/inf parameters."""


class Preempted(BertJaxError):
  """SIGTERM/SIGINT stopped training after a checkpoint of the current step.

  Not a failure of the input: train.py prints one line and exits 128 + signal
  (143 for SIGTERM, 130 for SIGINT); rerunning the same command resumes.
  """

  def __init__(self, message: str, step: int, signum: int):
    super().__init__(message)
    self.step, self.signum = step, signum


class TaskError(BertJaxError):
  """A downstream task (GLUE or plain task directory, TFDS, built-in) that cannot be read."""


class Terminated(KeyboardInterrupt):
  """SIGTERM before training started (preparing data, compiling): nothing to checkpoint.

  A KeyboardInterrupt, so what cleans up after Ctrl-C (workers stopped, finished
  parts kept) does the same; the command prints one line and exits 143.
  """

  def __init__(self, signum: int, during: str = ""):
    super().__init__(signum)
    self.signum, self.during = signum, during  # what it stopped (`stoppable`), if known


_stop_signum: Optional[int] = None  # the first SIGTERM/SIGINT noted, until cleared


def request_stop(signum: int) -> None:
  """Notes a stop request (from a signal handler: no exception, no I/O)."""
  global _stop_signum
  if _stop_signum is None:
    _stop_signum = int(signum)


def stop_requested() -> Optional[int]:
  """The signal that asked this process to stop, or None."""
  return _stop_signum


def check_stop() -> None:
  """At a safe point before training: `Terminated` if a stop was requested."""
  if _stop_signum is not None:
    raise Terminated(_stop_signum)


def stoppable(fn: Callable[[], T], what: str) -> T:
  """`fn()`, run in a thread while this one waits for it or for a stop request: long
  native work (a vocabulary's training in `tokenizers`, which releases the GIL) then
  stops within a fraction of a second of SIGTERM (a preemption notice gives 30 s), as
  `Terminated` naming `what`; the abandoned thread ends with the process."""
  out: dict = {}

  def run() -> None:
    try:
      out["value"] = fn()
    except BaseException as e:  # pylint: disable=broad-except  # re-raised in the caller
      out["error"] = e

  thread = threading.Thread(target=run, name=f"bert_jax-{what.replace(' ', '-')}", daemon=True)
  thread.start()
  while thread.is_alive():
    thread.join(0.1)
    if _stop_signum is not None:
      raise Terminated(_stop_signum, what)
  if "error" in out:
    raise out["error"]
  return out["value"]


def clear_stop() -> None:
  """Forgets the request (a caller in Python that handled it, a test)."""
  global _stop_signum
  _stop_signum = None
