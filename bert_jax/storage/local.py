"""The local-disk backend of storage/fs.py: paths on this host, through `os`.

Every write is atomic: written beside its target and renamed onto it, so a failure (a
full disk, a kill) never leaves a partial file under the name. Errors are the OSErrors
the caller handles; nothing here retries.
"""

from __future__ import annotations

import builtins
import contextlib
import glob as glob_lib
import os
import shutil
import socket
from collections.abc import Callable
from typing import Any


def write_atomic(path: str, write: Callable[[Any], Any]) -> None:
  """`write(f)` into a file beside `path`, renamed onto it: a failure (a full disk, a
  kill) never leaves a partial file under the name (the only local atomic writer)."""
  directory, name = os.path.split(os.path.abspath(path))
  tmp = os.path.join(directory, f".{name}.tmp-{socket.gethostname()}-{os.getpid()}")
  try:
    with builtins.open(tmp, "wb") as f:
      write(f)
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.remove(tmp)
    raise


class Local:
  """storage/fs.py's operations on this host's files."""
  remote = False  # read where it is; no copy on this host needed

  def abspath(self, path: str) -> str:
    return os.path.abspath(os.path.expanduser(path))

  def exists(self, path: str) -> bool:
    return os.path.exists(path)

  def isdir(self, path: str) -> bool:
    return os.path.isdir(path)

  def isfile(self, path: str) -> bool:
    return os.path.isfile(path)

  def listdir(self, path: str) -> list[str]:
    return sorted(os.listdir(path))

  def find(self, path: str) -> list[str]:
    return sorted(os.path.join(d, f) for d, _, files in os.walk(path) for f in files)

  def open(self, path: str, mode: str = "r", **kwargs) -> Any:
    return builtins.open(path, mode, **kwargs)

  def read_bytes(self, path: str) -> bytes:
    with builtins.open(path, "rb") as f:
      return f.read()

  def glob(self, pattern: str) -> list[str]:
    return sorted(glob_lib.glob(pattern))

  def makedirs(self, path: str) -> None:
    os.makedirs(path, exist_ok=True)

  def write_bytes(self, path: str, data: bytes) -> None:
    write_atomic(path, lambda f: f.write(data))

  def write_with(self, path: str, write: Callable[[Any], Any]) -> None:
    write_atomic(path, write)

  def upload(self, local: str, path: str) -> None:
    with builtins.open(local, "rb") as src:
      write_atomic(path, lambda f: shutil.copyfileobj(src, f))

  def remove(self, path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
      os.remove(path)

  def rmtree(self, path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)

  def move_tree(self, src: str, dst: str) -> None:
    os.rename(src, dst)

  def tensorstore_context(self) -> dict:
    """A local file needs no TensorStore context of its own."""
    return {}


BACKEND = Local()
