"""Local files that only grow, copied to bucket objects by what they grew, off the loop.

A run on a bucket logs into local files (metrics.jsonl's copy, TensorBoard's events
file) and a `Mirror` copies each to its object: a background thread, every
`interval_s` (BERT_JAX_LOG_UPLOAD_S, default 15 s), uploads the bytes a file gained
since its last copy as a small object and appends them to the file's object with GCS
compose (a server-side concatenation: no object is downloaded or uploaded again). So a
log point costs a local write whatever the history's length, and the bucket sees four
requests per file per interval (upload, compose, size check, delete of the part).

The local file is the truth. When the object's size is not what this copy left (a
compose whose answer was lost was applied, or not; a part left by a killed run; a
bucket without compose), the next pass writes the whole file once and appends again
from there.

What a stop can lose: `sync` (before each checkpoint, and in `close`) waits for every
byte, so a SIGTERM's checkpoint-and-exit loses nothing, and a kill -9 loses only rows
after the newest checkpoint, which the resumed run logs again. A bucket that fails in
the background is tried again next interval; `sync` and `close` raise its error line.
"""

from __future__ import annotations

import os
import secrets
import threading
from dataclasses import dataclass

from bert_jax.storage import fs
from bert_jax.storage.retries import env_number, retrying


def interval_s() -> float:
  return env_number("BERT_JAX_LOG_UPLOAD_S", 15.0, minimum=0.0, above=True)


@dataclass
class _Copy:
  local: str
  remote: str
  uploaded: int | None  # bytes of `local` the object holds; None: unknown, write it whole


class Mirror:

  def __init__(self, interval: float | None = None):
    self.interval = interval_s() if interval is None else interval
    self._copies: dict[str, _Copy] = {}
    self._pass_lock = threading.Lock()  # one upload pass at a time (thread or sync)
    self._wake = threading.Event()
    self._closed = False
    self._compose = True  # False once the bucket refused compose (a zonal bucket)
    self._parts: list[str] = []  # part objects whose delete failed: deleted next pass
    self._thread = threading.Thread(target=self._run, name="bert_jax-log-upload", daemon=True)
    self._thread.start()

  def track(self, local: str, remote: str, uploaded: int | None = 0) -> None:
    """Copy `local` to `remote` from now on; the object holds its first `uploaded` bytes."""
    with self._pass_lock:
      self._copies.setdefault(local, _Copy(local, remote, uploaded))

  def tracked(self, local: str) -> bool:
    return local in self._copies

  def replace(self, local: str, data: bytes) -> None:
    """`local` rewritten as `data` and its object written whole, now (a history cut
    back on resume): waits for a pass under way, raises the bucket's error line."""
    with self._pass_lock:
      fs.write_atomic_local(local, lambda f: f.write(data))
      copy = self._copies[local]
      copy.uploaded = None
      self._copy(copy)

  def sync(self) -> None:
    """Every byte written so far is in its object when this returns; else the error."""
    with self._pass_lock:
      for copy in list(self._copies.values()):
        self._copy(copy)
      while self._parts:
        fs.remove(self._parts[0])
        self._parts.pop(0)

  def close(self) -> None:
    self._closed = True
    self._wake.set()
    self._thread.join()
    self.sync()

  def _run(self) -> None:
    while not self._closed:
      self._wake.wait(self.interval)
      if self._closed:
        return
      try:
        self.sync()
      except Exception:  # pylint: disable=broad-except
        pass  # a bucket that fails now is tried again next interval; sync/close report it

  def _copy(self, copy: _Copy) -> None:
    size = os.path.getsize(copy.local)
    if copy.uploaded == size:
      return
    with open(copy.local, "rb") as f:
      if copy.uploaded and self._compose:  # 0: a new object, written whole
        f.seek(copy.uploaded)
        grown = f.read(size - copy.uploaded)
        if self._append(copy, grown):
          return
        f.seek(0)
      data = f.read(size)
    fs.write_bytes(copy.remote, data)
    copy.uploaded = size

  def _append(self, copy: _Copy, data: bytes) -> bool:
    """`data` appended to the object by compose; False when the object must be written
    whole (its size is not what this copy left, or the bucket cannot compose)."""
    fsys = fs.gcsfs()
    # Beside the object, named so no reader takes it for its data (TensorBoard reads
    # every file with "tfevents" in its name).
    part = fs.join(fs.parent(copy.remote), f".log-part-{secrets.token_hex(6)}")
    self._parts.append(part)  # deleted below, or by a later pass if the bucket fails here
    fs.write_bytes(part, data)
    try:
      retrying(copy.remote, "append to", lambda: fsys.merge(copy.remote, [copy.remote, part]),
               passthrough=(NotImplementedError,))
      fsys.invalidate_cache(copy.remote)
      size = retrying(copy.remote, "look at", lambda: fsys.info(copy.remote)["size"])
    except NotImplementedError:
      self._compose = False
      size = None
    fs.remove(part)
    self._parts.remove(part)
    if size != copy.uploaded + len(data):  # applied twice, not at all, or no compose (None)
      copy.uploaded = None
      return False
    copy.uploaded = size
    return True


class LogFiles:
  """The files that only grow under `root` (a workdir: metrics.jsonl, TensorBoard's
  events), for writers that append to local files. Under a local root they are the
  files themselves; under a bucket, local copies in a temporary folder that a Mirror
  appends to their objects (an existing object is downloaded once to continue it)."""

  def __init__(self, root: str):
    self.root = root
    self._bucket = fs.is_gcs(root)
    self._tmp = None  # a TemporaryDirectory of the copies: it goes with this object
    self._mirror: Mirror | None = None

  def file(self, name: str) -> str:
    """The local path to append to for `<root>/<name>`."""
    if not self._bucket:
      return fs.join(self.root, name)
    local = os.path.join(self._copies(), name)
    if not self._mirror.tracked(local):
      remote = fs.join(self.root, name)
      data = fs.read_bytes(remote) if fs.exists(remote) else b""
      os.makedirs(os.path.dirname(local), exist_ok=True)
      fs.write_atomic_local(local, lambda f: f.write(data))
      self._mirror.track(local, remote, uploaded=len(data))
    return local

  def folder(self, name: str) -> str:
    """The local folder whose new files (see `found`) become `<root>/<name>/<file>`."""
    return fs.join(self.root, name) if not self._bucket else os.path.join(self._copies(), name)

  def found(self, name: str) -> None:
    """Files that appeared in `folder(name)` are copied from now on (new ones whole)."""
    if not self._bucket or not os.path.isdir(self.folder(name)):
      return
    for file in os.listdir(self.folder(name)):
      local = os.path.join(self.folder(name), file)
      if not self._mirror.tracked(local):
        self._mirror.track(local, fs.join(self.root, name, file))

  def replace(self, name: str, data: bytes) -> None:
    """`<root>/<name>` rewritten as `data`, atomically (a history cut back on resume)."""
    if not self._bucket:
      fs.write_atomic_local(fs.join(self.root, name), lambda f: f.write(data))
    else:
      self._mirror.replace(self.file(name), data)

  def sync(self) -> None:
    """Everything written so far is under `root` when this returns (or its error)."""
    if self._mirror is not None:
      self._mirror.sync()

  def close(self) -> None:
    """The last upload; the local copies stay readable until this object goes."""
    if self._mirror is not None:
      self._mirror.close()

  def _copies(self) -> str:
    if self._tmp is None:
      import tempfile  # pylint: disable=import-outside-toplevel
      self._tmp = tempfile.TemporaryDirectory(prefix="bert_jax-logs-")
      self._mirror = Mirror()
    return self._tmp.name
