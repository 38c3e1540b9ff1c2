"""What a run tells the person at the terminal: one process speaks, errors fit one line."""

import contextlib
import os
import re
import sys
from typing import Callable, Optional

# While a progress bar is on screen, lines go through its `write` (set by `through`).
_bar_write: Optional[Callable] = None


def _speaks() -> bool:
  """Process 0 speaks. JAX is asked only where something imported it (the console
  imports no JAX itself: a command that fails before its work prints at once)."""
  jax = sys.modules.get("jax")
  return jax is None or jax.process_index() == 0


def log(msg: str) -> None:
  if _speaks():
    if _bar_write is not None:
      _bar_write(msg, file=sys.stdout)
    else:
      print(msg, flush=True)


def warn(msg: str) -> None:
  if _speaks():
    if _bar_write is not None:
      _bar_write(msg, file=sys.stderr)
    else:
      print(msg, file=sys.stderr, flush=True)


@contextlib.contextmanager
def through(bar):
  """Inside the block, `log` and `warn` print through the (tqdm) bar: no line glued to it."""
  global _bar_write
  before, _bar_write = _bar_write, (None if bar.disable else bar.write)
  try:
    yield
  finally:
    _bar_write = before


def one_line(e: BaseException, limit: int = 300) -> str:
  """An exception as one short line (Orbax/TensorStore messages span many)."""
  text = " ".join(str(e).split())
  text = text[:limit] + "..." if len(text) > limit else text
  return f"{type(e).__name__}: {text}" if text else type(e).__name__


def write_reason(e: BaseException) -> str:
  """The OS error behind a failed write (TensorStore reports it inside a long text)."""
  seen = e
  while seen is not None:
    if isinstance(seen, OSError) and seen.errno:
      return f"OSError: [Errno {seen.errno}] {os.strerror(seen.errno)}"
    code = re.search(r"os_error_code='(\d+)'", str(seen))
    if code:
      return f"OSError: [Errno {code.group(1)}] {os.strerror(int(code.group(1)))}"
    seen = seen.__cause__ or seen.__context__
  return one_line(e)
