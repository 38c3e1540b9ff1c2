"""One run per workdir: an exclusive OS-level lock held for the whole run.

    with workdir_lock.hold(workdir, jax.process_index()):
      ...  # the run: the only one writing this workdir (for this process index)

The lock is `flock(LOCK_EX | LOCK_NB)` on `<workdir>/.lock-<process_index>`.
The kernel drops it when its process dies, however it dies (kill -9
included), so a lock is never stale: the file of a dead holder may remain,
but the next run takes it over. Each process of a multi-host run locks its
own index, so processes sharing a workdir on shared storage do not exclude
each other, while a second run's process i stops at once. The file holds
one JSON line naming the holder (pid, host, start time), which a second
acquirer puts into its one-line error.

Readers (feature extraction, export) take no lock: they may read a workdir
while a run holds it (Orbax shows them complete checkpoints only).

Caveats: on NFS, flock is emulated with POSIX byte-range locks (Linux >=
2.6.12) and needs a working lock service; a child forked (not exec'd) by the
run shares the lock and keeps it while it lives.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import socket
from collections.abc import Iterator

from bert_jax.errors import BertJaxError, ConfigError
from bert_jax.storage import fs
from bert_jax.storage.workdir import Workdir


class WorkdirInUse(BertJaxError):
  """Another live process holds the workdir's lock."""

  def __init__(self, message: str, holder: dict):
    super().__init__(message)
    self.holder = holder


class WorkdirLost(BertJaxError):
  """Another run took over this run's lease on a bucket workdir."""


_leases: list = []  # the bucket leases this process holds (check_held looks at them)


def check_held(verify: bool = False) -> None:
  """Raises WorkdirLost (one line) if another run took over a lease this process holds:
  the run must not write again. A flag read (the renewals set it), so the loop calls it
  every step; `verify` asks the bucket now (before a checkpoint save)."""
  for lease in _leases:
    if verify:
      lease.verify()
    if lease.lost is not None:
      from bert_jax.storage import bucket_lock  # pylint: disable=import-outside-toplevel
      raise WorkdirLost(
          f"lost the lock {lease.path}: another run took this workdir over "
          f"({describe(lease.lost)}) after this one did not renew its lease within "
          f"{bucket_lock.lease_s():.0f} s; stopped without writing more; expected one run "
          "per workdir (the other run goes on)")


def lock_path(workdir: str, process_index: int = 0) -> str:
  return Workdir(os.path.abspath(workdir)).lock(process_index)


@contextlib.contextmanager
def hold(workdir: str, process_index: int = 0, lock_file: str | None = None) -> Iterator[dict]:
  """Holds the workdir's lock for `process_index` inside the `with` block.

  Creates the workdir if needed (and removes it again on exit if this call
  made it and it is still empty, so a run that fails before writing leaves
  nothing). Yields the holder record written into the lock file. Raises
  WorkdirInUse (one line naming the workdir and the holder) if a live
  process holds it, ConfigError if the lock file cannot be made or written (a
  full or read-only disk), with nothing of the run touched. `lock_file`: another
  name than `.lock-<process_index>` in `workdir` (an output that is replaced whole
  at its end locks a file beside it).
  """
  if fs.is_gcs(workdir):  # no flock on a bucket: a lease object (bucket_lock)
    yield from _hold_bucket(workdir, process_index, lock_file)
    return
  workdir = os.path.abspath(workdir)
  made = not os.path.exists(workdir)
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise ConfigError(f"--workdir {workdir} is not a directory; expected a directory (or a "
                      "path where one can be made)")
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as e:
    raise ConfigError(f"workdir {workdir}: cannot create it ({e.strerror}); expected a "
                      "writable --workdir") from None
  path = lock_path(workdir, process_index) if lock_file is None else os.path.join(
      workdir, lock_file)
  fd = None
  try:
    fd = _acquire(workdir, path)
    holder = holder_record(process_index=int(process_index))
    _write_holder(fd, workdir, path, holder)
    yield holder
  finally:
    if fd is not None:
      # Unlinked while still held: a process that opened the old file before
      # this finds it gone after its flock and retries on a fresh file.
      with contextlib.suppress(OSError):
        os.unlink(path)
      os.close(fd)
    if made:
      with contextlib.suppress(OSError):
        os.rmdir(workdir)  # only if empty


def _hold_bucket(workdir: str, process_index: int, lock_file: str | None) -> Iterator[dict]:
  from bert_jax.storage import bucket_lock  # pylint: disable=import-outside-toplevel
  path = Workdir(workdir).lock(process_index, lock_file)

  def in_use(holder: dict) -> WorkdirInUse:
    return WorkdirInUse(f"workdir {workdir} is in use by another run ({describe(holder)}; "
                        f"lock {path}, renewed every {bucket_lock.lease_s() / 4:.0f} s); wait for "
                        f"it to end (a killed run's lease expires {bucket_lock.lease_s():.0f} s "
                        "after its last renewal) or use another --workdir", holder)
  with bucket_lock.hold(path, holder_record(process_index=int(process_index)), in_use,
                        describe) as lease:
    _leases.append(lease)
    try:
      yield lease.record
    finally:
      _leases.remove(lease)


def _write_holder(fd: int, workdir: str, path: str, holder: dict) -> None:
  """The holder record into the locked file; a full or read-only disk is one ConfigError
  line (hold's finally then removes the file, and the workdir if it made it)."""
  data = (json.dumps(holder) + "\n").encode()
  try:
    os.ftruncate(fd, 0)
    if os.pwrite(fd, data, 0) != len(data):  # a short write: the disk filled up meanwhile
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
  except OSError as e:
    raise ConfigError(f"workdir {workdir}: cannot write the lock file {path} ({e.strerror}); "
                      "expected a writable --workdir with free space; nothing of the run was "
                      "touched") from None


def _acquire(workdir: str, path: str) -> int:
  while True:
    try:
      fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
      raise ConfigError(f"workdir {workdir}: cannot create the lock file {path} "
                        f"({e.strerror}); expected a writable --workdir") from None
    try:
      flock_exclusive(fd)
    except Held as e:
      raise WorkdirInUse(f"workdir {workdir} is in use by another run ({describe(e.holder)}; "
                         f"lock {path}); wait for it to end or use another --workdir",
                         e.holder) from None
    except OSError as e:
      raise ConfigError(f"workdir {workdir}: cannot lock {path} ({e.strerror}); expected "
                        "a --workdir on a file system with working locks") from None
    try:  # the file we locked must still be the one under `path` (see hold's finally)
      same = os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
      same = False
    if same:
      return fd
    os.close(fd)


class Held(Exception):
  """Another live process holds the lock; `holder` is its record ({} if none yet)."""

  def __init__(self, holder: dict):
    super().__init__(holder)
    self.holder = holder


def flock_exclusive(fd: int) -> None:
  """flock(LOCK_EX | LOCK_NB) on `fd`. On failure `fd` is closed and raised is Held (another
  process holds it: the record it wrote) or the OSError (a file system without locks)."""
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError as e:
    holder = read_holder(fd)
    os.close(fd)
    if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
      raise Held(holder) from None
    raise


def holder_record(**extra) -> dict:
  """This process as a lock holder: pid, host, start time (UTC), and `extra`."""
  return {"pid": os.getpid(), "host": socket.gethostname(),
          "started": datetime.datetime.now(datetime.timezone.utc)
                     .strftime("%Y-%m-%d %H:%M:%S UTC"), **extra}


def read_holder(fd: int) -> dict:
  """The holder record in a lock file ({} if none yet, or unreadable)."""
  try:
    text = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
    holder = json.loads(text) if text else {}
  except (OSError, ValueError):
    holder = {}
  return holder if isinstance(holder, dict) else {}


def describe(holder: dict) -> str:
  """'pid 123 on host h, started 2026-01-01 00:00:00 UTC' (what is known of it)."""
  if not holder:
    return "holder not yet recorded: it is starting"
  parts = [f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}"]
  if holder.get("started"):
    parts.append(f"started {holder['started']}")
  return ", ".join(parts)
