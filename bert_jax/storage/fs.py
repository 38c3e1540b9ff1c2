"""One file layer for every path a user gives: a local path or a `gs://bucket/path`.

Local paths go through `os`; `gs://` paths through etils `epath` (the layer Orbax
itself uses for checkpoints, with gcsfs underneath), so checkpoints, metrics and
outputs find a bucket with the same credentials: Google's default credentials from the
environment (`GOOGLE_APPLICATION_CREDENTIALS`, gcloud's, or a TPU VM's service
account); none is ever printed. `STORAGE_EMULATOR_HOST` (a local GCS server, as the
tests run one) also points TensorStore, Orbax's array storage, at that server
(`retries.configure_clients`, at the first bucket request).

Writes are whole-object and atomic on both: a local file is written beside its
target and renamed; a GCS object is visible only once its upload completes, so a
reader never sees a half-written file. GCS has no append and no rename of folders:
files that grow (metrics.jsonl, TensorBoard events) are appended to their objects by
compose (storage/mirror.py), and folders that must appear complete (checkpoints) rely on
Orbax's commit file on GCS.

A bucket that is missing, forbidden, or a server that stops answering is one
`StorageError` line naming the path, after bounded retries with backoff for the
errors that may pass (a connection refused or reset, a timeout, HTTP 429/5xx).
"""

from __future__ import annotations

import builtins
import contextlib
import os
import shutil
import socket
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from bert_jax.default_config import cache_dir
from bert_jax.storage.retries import (GCS, StorageError, bucket_url, check_bucket,  # noqa: F401
                                     check_path, configure_clients, env_number, given_up,
                                     giving_up_on, is_gcs, is_transient, retrying,
                                     storage_error, unanswered_bucket)

T = TypeVar("T")


def abspath(path: str) -> str:
  """A local path made absolute; a bucket path as it is."""
  return str(path) if is_gcs(path) else os.path.abspath(os.path.expanduser(str(path)))


def join(path: str, *names: str) -> str:
  return os.path.join(str(path), *names)


def parent(path: str) -> str:
  return os.path.dirname(str(path).rstrip("/"))


def basename(path: str) -> str:
  return os.path.basename(str(path).rstrip("/"))


def _epath(path: str):
  from etils import epath  # heavy (and gcsfs under it): only for bucket paths
  import fsspec  # pylint: disable=import-outside-toplevel
  configure_clients()
  # A request to a server that accepts and never answers times out (gcsfs: no limit).
  fsspec.config.conf.setdefault("gcs", {}).update(requests_timeout=60)
  return epath.Path(path)


# --- reading ---


def exists(path: str) -> bool:
  if not is_gcs(path):
    return os.path.exists(path)
  return retrying(path, "look at", lambda: _epath(path).exists())


def isdir(path: str) -> bool:
  if not is_gcs(path):
    return os.path.isdir(path)
  return retrying(path, "look at", lambda: _epath(path).is_dir())


def isfile(path: str) -> bool:
  if not is_gcs(path):
    return os.path.isfile(path)
  return retrying(path, "look at", lambda: _epath(path).is_file())


def listdir(path: str) -> list[str]:
  """Names in a folder (a bucket prefix's next level), sorted."""
  if not is_gcs(path):
    return sorted(os.listdir(path))
  return retrying(path, "list", lambda: sorted(p.name for p in _epath(path).iterdir()))


def listdir_or_empty(path: str) -> list[str]:
  """`listdir`, or [] where nothing is (a bucket prefix without objects, a missing folder)."""
  try:
    return listdir(path) if isdir(path) else []
  except FileNotFoundError:
    return []


def find(path: str) -> list[str]:
  """Every file (object) under a folder (prefix), as full paths, sorted."""
  if not is_gcs(path):
    return sorted(os.path.join(d, f) for d, _, files in os.walk(path) for f in files)
  found = retrying(path, "list", lambda: gcsfs().find(path))
  return sorted(n if n.startswith(GCS) else GCS + n for n in found)


def open(path: str, mode: str = "r", **kwargs) -> Any:  # pylint: disable=redefined-builtin
  """`open` for every module but this one: a local file in any mode, or a bucket object
  to read (written objects go through `write_bytes`/`upload`: whole and atomic)."""
  if not is_gcs(path):
    return builtins.open(path, mode, **kwargs)
  if any(c in mode for c in "wax+"):
    raise ValueError(f"{path}: bucket objects are written whole (fs.write_bytes), not opened "
                     f"with mode {mode!r}")
  return retrying(path, "read", lambda: _epath(path).open(mode, **kwargs))


def replace(src: str, dst: str) -> None:
  """Renames a local file or folder onto `dst` (atomic on one file system)."""
  _local_only(src, dst, "rename")
  os.replace(src, dst)


def rename(src: str, dst: str) -> None:
  """Renames a local file or folder to `dst`, failing if `dst` is a non-empty folder
  (so a finished folder is never replaced, only published once)."""
  _local_only(src, dst, "rename")
  os.rename(src, dst)


def _local_only(src: str, dst: str, doing: str) -> None:
  if is_gcs(src) or is_gcs(dst):  # GCS has no rename: a copy, then a delete
    raise ValueError(f"cannot {doing} {src} to {dst}: bucket objects have no atomic rename; "
                     "expected local paths (copy with fs.upload)")


def read_bytes(path: str) -> bytes:
  if not is_gcs(path):
    with builtins.open(path, "rb") as f:
      return f.read()
  return retrying(path, "read", lambda: _epath(path).read_bytes())


def read_text(path: str) -> str:
  return read_bytes(path).decode("utf-8")


def glob(pattern: str) -> list[str]:
  """Sorted matches of a glob (`*`, `?`, `[...]`; on a bucket within one level)."""
  if not is_gcs(pattern):
    import glob as glob_lib
    return sorted(glob_lib.glob(pattern))
  head, _, _ = pattern.partition("*")
  root = parent(head) if not head.endswith("/") else head.rstrip("/")
  rest = pattern[len(root) + 1:]
  return retrying(pattern, "list", lambda: sorted(str(p) for p in _epath(root).glob(rest)))


# --- writing ---


def makedirs(path: str) -> None:
  """A local folder and its parents; on a bucket nothing (prefixes need no folder)."""
  if not is_gcs(path):
    os.makedirs(path, exist_ok=True)


def write_bytes(path: str, data: bytes) -> None:
  """`data` at `path`, atomically: all of it or (on failure) what was there before."""
  if is_gcs(path):
    retrying(path, "write", lambda: _epath(path).write_bytes(data))
    return
  write_atomic_local(path, lambda f: f.write(data))


def write_text(path: str, text: str) -> None:
  write_bytes(path, text.encode("utf-8"))


def write_with(path: str, write: Callable[[Any], Any]) -> None:
  """`write(f)` (a binary file) to `path`, a local file or a bucket object, atomically:
  a failure never leaves a partial file (numpy's savez, a JSON dump)."""
  if not is_gcs(path):
    write_atomic_local(path, write)
    return
  import io  # pylint: disable=import-outside-toplevel
  buf = io.BytesIO()
  write(buf)
  write_bytes(path, buf.getvalue())


def write_json(path: str, obj: Any, indent: int = 2, sort_keys: bool = False) -> None:
  """`obj` as JSON (NaN allowed) and a final newline, atomically."""
  import json  # pylint: disable=import-outside-toplevel
  write_text(path, json.dumps(obj, indent=indent, allow_nan=True, sort_keys=sort_keys) + "\n")


def write_atomic_local(path: str, write: Callable[[Any], Any]) -> None:
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


def remove(path: str) -> None:
  """Deletes a file or object; a missing one is no error."""
  if not is_gcs(path):
    with contextlib.suppress(FileNotFoundError):
      os.remove(path)
    return

  def rm():
    with contextlib.suppress(FileNotFoundError):
      _epath(path).unlink()
  retrying(path, "delete", rm)


def rmtree(path: str) -> None:
  if not is_gcs(path):
    shutil.rmtree(path, ignore_errors=True)
    return
  p = _epath(path)
  retrying(path, "delete", lambda: p.rmtree() if p.exists() else None)


def move_tree(src: str, dst: str) -> None:
  """A folder moved to `dst` (which must not exist): a rename on a local disk. A bucket
  has no rename: every object is copied, then the source deleted, its commit files
  (Orbax's `commit_success.txt`) first, so a move cut short never leaves a folder that
  looks complete under the old name."""
  if not (is_gcs(src) or is_gcs(dst)):
    os.rename(src, dst)
    return
  if not (is_gcs(src) and is_gcs(dst)):
    _local_only(src, dst, "move")
  fsys, src, dst = gcsfs(), src.rstrip("/"), dst.rstrip("/")
  names = find(src)
  for name in names:
    target = dst + name[len(src):]
    retrying(target, "write", lambda n=name, t=target: fsys.copy(n, t))
  for name in sorted(names, key=lambda n: basename(n) != "commit_success.txt"):
    remove(name)


def upload(local: str, path: str) -> None:
  """A local file to `path` (a bucket object or a local file), atomically."""
  if is_gcs(path):
    with builtins.open(local, "rb") as src:
      data = src.read()
    retrying(path, "write", lambda: _epath(path).write_bytes(data))
  else:
    with builtins.open(local, "rb") as src:
      write_atomic_local(path, lambda f: shutil.copyfileobj(src, f))


def download(path: str, local: str) -> None:
  """`path` to a local file, atomically."""
  data = read_bytes(path)
  write_atomic_local(local, lambda f: f.write(data))


def gcsfs():
  import fsspec  # pylint: disable=import-outside-toplevel
  _epath(GCS)  # the same settings as every other request
  return fsspec.filesystem("gcs")


def local_copy_dir(directory: str) -> str | None:
  """Where on this host's disk the files of `directory` are kept to be read by random
  access (prepared data), when it is not on this host's disk: a bucket folder's copy,
  ~/.cache/bert_jax/prepared/<bucket>/<path> (BERT_JAX_LOCAL_CACHE moves it). None for
  a local folder, read where it is."""
  if not is_gcs(directory):
    return None
  root = os.path.expanduser(os.environ.get("BERT_JAX_LOCAL_CACHE", cache_dir("prepared")))
  return os.path.join(root, directory[len(GCS):].strip("/"))


def mirror_root() -> str:
  """Where bucket inputs are copied to (`local_mirror`): BERT_JAX_GCS_MIRROR, default
  ~/.cache/bert_jax/gcs."""
  return os.path.expanduser(os.environ.get("BERT_JAX_GCS_MIRROR", cache_dir("gcs")))


def local_mirror(path: str, root: str | None = None,
                 before_copy: Callable[[], None] | None = None) -> str:
  """A local copy of a gs:// file, glob or folder (every object under it), for readers
  that want local files (the corpus, a vocabulary, a HuggingFace model); a local path
  is returned as it is. Copies live in `root` (default `mirror_root()`) at the object's path, with its size and modification time, and
  are downloaded again only when those differ (a host that lost its disk: all of it).
  `before_copy` is called first for a bucket path (a log line: a corpus takes a while).
  Returns the local path, or the local glob for a glob."""
  if not is_gcs(path):
    return path
  path = path.rstrip("/") if path.count("/") > 2 else path  # a folder given as x/
  if before_copy is not None:
    before_copy()
  root = root or mirror_root()
  local_of = lambda name: os.path.join(root, name[len(GCS):] if name.startswith(GCS) else name)
  fsys = gcsfs()
  pattern = any(c in path for c in "*?[")
  if pattern:
    found = retrying(path, "list", lambda: fsys.glob(path, detail=True))
  else:
    found = retrying(path, "list", lambda: fsys.find(path, detail=True, withdirs=False))
  found = {k: v for k, v in found.items() if v.get("type") != "directory"}
  if not found:
    raise StorageError(f"cannot read {path}: no such object (nor objects under it)")
  for name, info in sorted(found.items()):
    dest = local_of(name)
    mtime = _mtime(info)
    if (os.path.isfile(dest) and os.path.getsize(dest) == int(info["size"])
        and (mtime is None or abs(os.path.getmtime(dest) - mtime) < 1e-3)):
      continue
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    download(GCS + name if not name.startswith(GCS) else name, dest)
    if mtime is not None:
      os.utime(dest, (mtime, mtime))  # the same fingerprint on every host
  return local_of(path[len(GCS):])


def _mtime(info: dict) -> float | None:
  value = info.get("updated") or info.get("mtime")
  if value is None:
    return None
  if isinstance(value, (int, float)):
    return float(value)
  import datetime  # pylint: disable=import-outside-toplevel
  if isinstance(value, datetime.datetime):
    return value.timestamp()
  return datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


@contextlib.contextmanager
def local_copy_for_writing(path: str, suffix: str = "") -> Iterator[str]:
  """A local file name to write, copied to `path` when the block ends without error
  (a plot, an events file: libraries that write local files only)."""
  if not is_gcs(path):
    yield path
    return
  import tempfile
  fd, tmp = tempfile.mkstemp(suffix=suffix or os.path.splitext(path)[1])
  os.close(fd)
  try:
    yield tmp
    upload(tmp, path)
  finally:
    with contextlib.suppress(OSError):
      os.remove(tmp)
