"""The Google Cloud Storage backend of storage/fs.py: `gs://bucket/path` objects.

Through etils `epath` (the layer Orbax itself uses for checkpoints, with gcsfs
underneath), so checkpoints, metrics and outputs find a bucket with the same
credentials: Google's default credentials from the environment
(`GOOGLE_APPLICATION_CREDENTIALS`, gcloud's, or a TPU VM's service account); none is
ever printed. `STORAGE_EMULATOR_HOST` (a local GCS server, as the tests run one) also
points TensorStore, Orbax's array storage, at that server (`retries.configure_clients`,
at the first bucket request). Every request goes through `retries.retrying`: bounded
retries of what may pass, one `StorageError` line for the rest.

An object is written whole and is visible only once its upload completes, so a reader
never sees a half-written file; there is no append and no rename of folders (a move is
a copy, then a delete).
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import Any

from bert_jax.storage.retries import configure_clients, retrying, tensorstore_retries
from bert_jax.storage.urls import GCS


def _epath(path: str):
  from etils import epath  # heavy (and gcsfs under it): only for bucket paths
  import fsspec  # pylint: disable=import-outside-toplevel
  configure_clients()
  # A request to a server that accepts and never answers times out (gcsfs: no limit).
  fsspec.config.conf.setdefault("gcs", {}).update(requests_timeout=60)
  return epath.Path(path)


def filesystem():
  """gcsfs's filesystem, with the settings of every other request."""
  import fsspec  # pylint: disable=import-outside-toplevel
  _epath(GCS)
  return fsspec.filesystem("gcs")


def _full(name: str) -> str:
  return name if name.startswith(GCS) else GCS + name


class Gcs:
  """storage/fs.py's operations on bucket objects."""
  remote = True  # random-access readers read a copy on this host (fs.local_copy_dir)
  scheme = GCS

  def abspath(self, path: str) -> str:
    return path

  def exists(self, path: str) -> bool:
    return retrying(path, "look at", lambda: _epath(path).exists())

  def isdir(self, path: str) -> bool:
    return retrying(path, "look at", lambda: _epath(path).is_dir())

  def isfile(self, path: str) -> bool:
    return retrying(path, "look at", lambda: _epath(path).is_file())

  def listdir(self, path: str) -> list[str]:
    return retrying(path, "list", lambda: sorted(p.name for p in _epath(path).iterdir()))

  def find(self, path: str) -> list[str]:
    return sorted(_full(n) for n in retrying(path, "list", lambda: filesystem().find(path)))

  def objects(self, path: str) -> dict[str, dict]:
    """{full path: gcsfs info (size, updated)} of the objects a file, glob or folder
    names (for copies kept by size and time, fs.local_mirror)."""
    fsys = filesystem()
    if any(c in path for c in "*?["):
      found = retrying(path, "list", lambda: fsys.glob(path, detail=True))
    else:
      found = retrying(path, "list", lambda: fsys.find(path, detail=True, withdirs=False))
    return {_full(k): v for k, v in found.items() if v.get("type") != "directory"}

  def open(self, path: str, mode: str = "r", **kwargs) -> Any:
    if any(c in mode for c in "wax+"):
      raise ValueError(f"{path}: bucket objects are written whole (fs.write_bytes), not "
                       f"opened with mode {mode!r}")
    return retrying(path, "read", lambda: _epath(path).open(mode, **kwargs))

  def read_bytes(self, path: str) -> bytes:
    return retrying(path, "read", lambda: _epath(path).read_bytes())

  def glob(self, pattern: str) -> list[str]:
    """Matches within one level of a prefix (`*`, `?`, `[...]`)."""
    head, _, _ = pattern.partition("*")
    root = head.rstrip("/") if head.endswith("/") else head.rsplit("/", 1)[0]
    rest = pattern[len(root) + 1:]
    return retrying(pattern, "list", lambda: sorted(str(p) for p in _epath(root).glob(rest)))

  def makedirs(self, path: str) -> None:
    del path  # prefixes need no folder

  def write_bytes(self, path: str, data: bytes) -> None:
    retrying(path, "write", lambda: _epath(path).write_bytes(data))

  def write_with(self, path: str, write: Callable[[Any], Any]) -> None:
    import io  # pylint: disable=import-outside-toplevel
    buf = io.BytesIO()
    write(buf)
    self.write_bytes(path, buf.getvalue())

  def upload(self, local: str, path: str) -> None:
    with builtins.open(local, "rb") as src:
      data = src.read()
    self.write_bytes(path, data)

  def remove(self, path: str) -> None:
    def rm():
      try:
        _epath(path).unlink()
      except FileNotFoundError:
        pass
    retrying(path, "delete", rm)

  def rmtree(self, path: str) -> None:
    p = _epath(path)
    retrying(path, "delete", lambda: p.rmtree() if p.exists() else None)

  def move_tree(self, src: str, dst: str) -> None:
    """Every object copied, then the source deleted, its commit files (Orbax's
    `commit_success.txt`) first, so a move cut short never leaves a folder that looks
    complete under the old name."""
    fsys, src, dst = filesystem(), src.rstrip("/"), dst.rstrip("/")
    names = self.find(src)
    for name in names:
      target = dst + name[len(src):]
      retrying(target, "write", lambda n=name, t=target: fsys.copy(n, t))
    for name in sorted(names, key=lambda n: n.rsplit("/", 1)[-1] != "commit_success.txt"):
      self.remove(name)

  def tensorstore_context(self) -> dict:
    """The TensorStore context entries for arrays in a bucket (Orbax's checkpoints):
    GCS requests retried as the file layer's policy says, where TensorStore's default
    (32 tries up to 32 s apart) waits a quarter of an hour on a server that is gone."""
    configure_clients()  # an emulator's address for TensorStore too
    return {"gcs_request_retries": tensorstore_retries()}


BACKEND = Gcs()
