"""One file layer for every path a user gives: a local path or a `gs://bucket/path`.

Each path's storage is a backend behind one interface (storage/local.py,
storage/gcs.py), found from its scheme (`backend`): the rest of the package calls
these functions and never asks which storage a path is on. A new scheme is a backend
module and its line in BACKENDS (and its scheme accepted by storage/urls.py).

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

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from bert_jax.default_config import cache_dir
from bert_jax.storage import gcs, local
from bert_jax.storage.local import write_atomic as write_atomic_local  # noqa: F401
from bert_jax.storage.retries import (GCS, StorageError, bucket_url, check_bucket,  # noqa: F401
                                     check_path, configure_clients, env_number, given_up,
                                     giving_up_on, is_gcs, is_transient, retrying,
                                     storage_error, unanswered_bucket)

T = TypeVar("T")


# The backend of each scheme; any other path is on this host's disk.
BACKENDS = {GCS: gcs.BACKEND}


def backend(path: str):
  """The storage `path` is on (is_gcs refuses a URL of a scheme not supported)."""
  return BACKENDS[GCS] if is_gcs(path) else local.BACKEND


def tensorstore_context(path: str) -> dict:
  """The TensorStore context entries arrays under `path` need (io/checkpointing)."""
  return backend(path).tensorstore_context()


def gcsfs():
  """gcsfs's filesystem (storage/mirror.py composes objects with it)."""
  return gcs.filesystem()


def abspath(path: str) -> str:
  """A local path made absolute; a bucket path as it is."""
  return backend(path).abspath(str(path))


def join(path: str, *names: str) -> str:
  return os.path.join(str(path), *names)


def parent(path: str) -> str:
  return os.path.dirname(str(path).rstrip("/"))


def basename(path: str) -> str:
  return os.path.basename(str(path).rstrip("/"))


# --- reading ---


def exists(path: str) -> bool:
  return backend(path).exists(path)


def isdir(path: str) -> bool:
  return backend(path).isdir(path)


def isfile(path: str) -> bool:
  return backend(path).isfile(path)


def listdir(path: str) -> list[str]:
  """Names in a folder (a bucket prefix's next level), sorted."""
  return backend(path).listdir(path)


def listdir_or_empty(path: str) -> list[str]:
  """`listdir`, or [] where nothing is (a bucket prefix without objects, a missing folder)."""
  try:
    return listdir(path) if isdir(path) else []
  except FileNotFoundError:
    return []


def find(path: str) -> list[str]:
  """Every file (object) under a folder (prefix), as full paths, sorted."""
  return backend(path).find(path)


def open(path: str, mode: str = "r", **kwargs) -> Any:  # pylint: disable=redefined-builtin
  """`open` for every module but this one: a local file in any mode, or a bucket object
  to read (written objects go through `write_bytes`/`upload`: whole and atomic)."""
  return backend(path).open(path, mode, **kwargs)


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
  if backend(src).remote or backend(dst).remote:  # a bucket has no rename: copy, delete
    raise ValueError(f"cannot {doing} {src} to {dst}: bucket objects have no atomic rename; "
                     "expected local paths (copy with fs.upload)")


def read_bytes(path: str) -> bytes:
  return backend(path).read_bytes(path)


def read_text(path: str) -> str:
  return read_bytes(path).decode("utf-8")


def glob(pattern: str) -> list[str]:
  """Sorted matches of a glob (`*`, `?`, `[...]`; on a bucket within one level)."""
  return backend(pattern).glob(pattern)


# --- writing ---


def makedirs(path: str) -> None:
  """A local folder and its parents; on a bucket nothing (prefixes need no folder)."""
  backend(path).makedirs(path)


def write_bytes(path: str, data: bytes) -> None:
  """`data` at `path`, atomically: all of it or (on failure) what was there before."""
  backend(path).write_bytes(path, data)


def write_text(path: str, text: str) -> None:
  write_bytes(path, text.encode("utf-8"))


def write_with(path: str, write: Callable[[Any], Any]) -> None:
  """`write(f)` (a binary file) to `path`, a local file or a bucket object, atomically:
  a failure never leaves a partial file (numpy's savez, a JSON dump)."""
  backend(path).write_with(path, write)


def write_json(path: str, obj: Any, indent: int = 2, sort_keys: bool = False) -> None:
  """`obj` as JSON (NaN allowed) and a final newline, atomically."""
  import json  # pylint: disable=import-outside-toplevel
  write_text(path, json.dumps(obj, indent=indent, allow_nan=True, sort_keys=sort_keys) + "\n")


def remove(path: str) -> None:
  """Deletes a file or object; a missing one is no error."""
  backend(path).remove(path)


def rmtree(path: str) -> None:
  backend(path).rmtree(path)


def move_tree(src: str, dst: str) -> None:
  """A folder moved to `dst` (which must not exist): a rename on a local disk; on a
  bucket a copy, then a delete (storage/gcs.py), never between the two."""
  if backend(src) is not backend(dst):
    _local_only(src, dst, "move")
  backend(src).move_tree(src, dst)


def upload(local_file: str, path: str) -> None:
  """A local file to `path` (a bucket object or a local file), atomically."""
  backend(path).upload(local_file, path)


def download(path: str, local_file: str) -> None:
  """`path` to a local file, atomically."""
  data = read_bytes(path)
  write_atomic_local(local_file, lambda f: f.write(data))


def local_copy_dir(directory: str) -> str | None:
  """Where on this host's disk the files of `directory` are kept to be read by random
  access (prepared data), when it is not on this host's disk: a bucket folder's copy,
  ~/.cache/bert_jax/prepared/<bucket>/<path> (BERT_JAX_LOCAL_CACHE moves it). None for
  a local folder, read where it is."""
  if not backend(directory).remote:
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
  if not backend(path).remote:
    return path
  path = path.rstrip("/") if path.count("/") > 2 else path  # a folder given as x/
  if before_copy is not None:
    before_copy()
  root = root or mirror_root()
  local_of = lambda name: os.path.join(root, name[len(GCS):] if name.startswith(GCS) else name)
  found = backend(path).objects(path)
  if not found:
    raise StorageError(f"cannot read {path}: no such object (nor objects under it)")
  for name, info in sorted(found.items()):
    dest = local_of(name)
    mtime = _mtime(info)
    if (os.path.isfile(dest) and os.path.getsize(dest) == int(info["size"])
        and (mtime is None or abs(os.path.getmtime(dest) - mtime) < 1e-3)):
      continue
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    download(name, dest)
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
  if not backend(path).remote:
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
