"""One run per `gs://` workdir: a lease object, since no kernel drops a lock on a bucket.

    with bucket_lock.hold("gs://bkt/run", process_index): ...

Built from what GCS guarantees: an object created with `ifGenerationMatch=0` exists
for exactly one writer, and an update with `ifGenerationMatch=<generation>` succeeds
for exactly one writer of that generation. So:

  take      create `<workdir>/.lock-<i>` (the holder record: pid, host, start, lease)
            if absent. If present and renewed within its lease, the run stops with
            one line naming the holder. If its lease expired (the holder was killed,
            or its VM preempted and deleted), replace exactly that generation: of
            several runs racing to take over, one wins; it says so in one line.
  renew     a thread rewrites the record every lease/4 on the generation it holds;
            if another run replaced it meanwhile (this one stalled past its lease:
            a network partition, a frozen VM), the lease is `lost` and the run stops
            at its next step without writing again (`workdir_lock.check_held`).
  release   delete the generation it holds (never another run's).

The lease (BERT_JAX_LOCK_LEASE_S, 60 s) bounds how long a killed run keeps its
workdir: the next run takes over at most that long after the kill, and at once when
the record names this machine's boot and a process that is gone. Each lease carries a
random token: a renewal the server applied after the client gave up on it (a stalled
server) leaves this lease's own token, which is still this lease. Expiry compares
the object's update time (the server's clock) with this host's clock.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Iterator

from bert_jax.errors import ConfigError
from bert_jax.storage import fs

# None: BERT_JAX_LOCK_LEASE_S (default 60 s, at least 1), read and checked when a lease
# is taken; a number set here wins (tests).
LEASE_S: float | None = None
MIN_LEASE_S = 1.0  # renewals come every lease/4: below this they would spin


def lease_s() -> float:
  if LEASE_S is not None:
    return float(LEASE_S)
  return fs.env_number("BERT_JAX_LOCK_LEASE_S", 60.0, float, MIN_LEASE_S)


def boot_id() -> str:
  """This machine's boot (Linux); '' where unknown. A holder record with this boot id and
  a pid that is gone was killed on this machine: its lease need not be waited out. A spot
  VM's replacement boots with another id and waits as any other machine."""
  try:
    return fs.read_text("/proc/sys/kernel/random/boot_id").strip()
  except (OSError, UnicodeDecodeError):
    return ""


def _pid_alive(pid) -> bool:
  try:
    os.kill(int(pid), 0)
  except ProcessLookupError:
    return False
  except (PermissionError, ValueError, TypeError, OverflowError):
    return True  # someone else's, or not a pid we can judge: assume alive
  return True


def _blob(path: str):
  from google.cloud import storage  # with gcsfs; only for bucket workdirs
  bucket, _, name = path[len(fs.GCS):].partition("/")
  return storage.Client().bucket(bucket).blob(name)


def _call(path: str, fn):
  """A lock request with fs's bounded retries, the one retry policy of every bucket
  request (a lease must not hang on a dead server): the client library's own retry is
  off (`fn(None)` passes retry=None), so the two never multiply. A failed precondition
  or a missing object is the caller's to handle."""
  from google.api_core import exceptions
  return fs.retrying(path, "lock", lambda: fn(None),
                     passthrough=(exceptions.PreconditionFailed, exceptions.NotFound))


class Lease:
  """The lock this process holds; `lost` (the new holder's record) once another run
  replaced it."""

  def __init__(self, path: str, record: dict, generation: int, lease_seconds: float):
    self.path, self.record, self.generation = path, record, generation
    self.lease_s = lease_seconds
    self.lost: dict | None = None
    self._lock = threading.Lock()  # a renewal and a verify never interleave
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._renew, name="bert_jax-lease", daemon=True)

  def _renew(self) -> None:
    from google.api_core import exceptions
    while not self._stop.wait(self.lease_s / 4):
      blob = _blob(self.path)
      try:
        with self._lock:
          _call(self.path, lambda r: blob.upload_from_string(
              json.dumps(self.record), if_generation_match=self.generation, retry=r,
              timeout=10))
          self.generation = blob.generation
      except exceptions.PreconditionFailed:
        with self._lock:
          if not self._still_ours():
            return
      except Exception:  # pylint: disable=broad-except
        continue  # the server did not answer: tried again at the next renewal

  def _still_ours(self) -> bool:
    """After a generation that is not the one this lease wrote last: the object as it is
    now. Its record carries this lease's token when a renewal that timed out on this side
    was applied by the server later (a stalled server): still held, at that generation.
    Another token is another run's takeover: `lost`. Unreadable: undecided, held."""
    found = _current(self.path)
    if found is None:
      return True  # the server did not answer: the next renewal or verify decides
    generation, holder = found
    if generation is None:  # the object is gone: create it again, if no one else has
      return True
    if holder.get("token") == self.record["token"]:
      self.generation = generation
      return True
    self.lost = holder
    return False

  def verify(self) -> None:
    """Reads the lease object's generation now (one metadata request): `lost` if another
    run replaced it. Before a checkpoint, so none is written after a takeover was
    visible; a server that does not answer leaves it to the renewals."""
    if self.lost is not None:
      return
    with self._lock:
      try:
        current = _call(self.path, lambda r: _blob(self.path).bucket.get_blob(
            _blob(self.path).name, retry=r, timeout=10))
      except Exception:  # pylint: disable=broad-except
        return
      if current is None or current.generation != self.generation:
        self._still_ours()

  def release(self) -> None:
    self._stop.set()
    if self._thread.is_alive():
      self._thread.join(timeout=15)
    if self.lost is not None:
      return  # not ours to delete
    from google.api_core import exceptions
    for _ in range(2):  # a late renewal may have moved the generation: ours still
      try:
        _call(self.path, lambda r: _blob(self.path).delete(if_generation_match=self.generation,
                                                            retry=r, timeout=10))
        return
      except exceptions.PreconditionFailed:
        with self._lock:
          if not self._still_ours():
            return
      except (exceptions.NotFound, fs.StorageError):
        return


@contextlib.contextmanager
def hold(path: str, record: dict, in_use, describe) -> Iterator[Lease]:
  """Holds the lease object `path` inside the block. `in_use(holder)` is the exception
  to raise when a live run holds it; a takeover of an expired lease says one line, with
  `describe(holder)`."""
  from google.api_core import exceptions
  lease_s_now = lease_s()  # checked before anything is written
  record = {**record, "lease_s": lease_s_now, "boot_id": boot_id(), "token": uuid.uuid4().hex}
  blob = _blob(path)
  try:
    _call(path, lambda r: blob.upload_from_string(json.dumps(record), if_generation_match=0,
                                                   retry=r, timeout=10))
  except exceptions.PreconditionFailed:
    _take_over(path, record, blob, in_use, describe)
  except exceptions.NotFound as e:
    raise fs.storage_error(path, e, "lock") from None
  except exceptions.Forbidden as e:
    raise fs.storage_error(path, e, "lock") from None
  except exceptions.GoogleAPIError as e:
    raise ConfigError(f"cannot lock {path}: {e}") from None
  lease = Lease(path, record, blob.generation, lease_s_now)
  lease._thread.start()  # pylint: disable=protected-access
  try:
    yield lease
  finally:
    lease.release()


def _current(path: str) -> tuple[int | None, dict] | None:
  """(generation, record) of the lease object now; (None, {}) where it is gone; None
  where the server does not answer. The record is read at that generation."""
  from google.api_core import exceptions
  try:
    current = _call(path, lambda r: _blob(path).bucket.get_blob(_blob(path).name, retry=r,
                                                                timeout=10))
    if current is None:
      return None, {}
    data = _call(path, lambda r: _blob(path).bucket.blob(
        _blob(path).name, generation=current.generation).download_as_bytes(retry=r, timeout=10))
  except exceptions.NotFound:
    return None, {}
  except Exception:  # pylint: disable=broad-except
    return None
  try:
    holder = json.loads(data)
  except ValueError:
    holder = {}
  return current.generation, holder if isinstance(holder, dict) else {}


def _take_over(path: str, record: dict, blob, in_use, describe) -> None:
  from google.api_core import exceptions
  current = _call(path, lambda r: blob.bucket.get_blob(blob.name, retry=r, timeout=10))
  if current is None:  # released meanwhile: take it as new
    _call(path, lambda r: blob.upload_from_string(json.dumps(record), if_generation_match=0,
                                                   retry=r, timeout=10))
    return
  try:
    holder = json.loads(current.download_as_bytes())
  except (ValueError, exceptions.GoogleAPIError):
    holder = {}
  age = time.time() - current.updated.timestamp()
  holder = holder if isinstance(holder, dict) else {}
  try:
    lease = float(holder.get("lease_s", lease_s()))
  except (TypeError, ValueError):
    lease = lease_s()
  # Killed on this very machine (same boot, pid gone: a kill -9 and a rerun): no wait.
  here = bool(holder.get("boot_id")) and holder.get("boot_id") == record.get("boot_id")
  dead_here = here and "pid" in holder and not _pid_alive(holder["pid"])
  if age < lease and not dead_here:
    raise in_use(holder)
  try:
    _call(path, lambda r: blob.upload_from_string(
        json.dumps(record), if_generation_match=current.generation, retry=r, timeout=10))
  except exceptions.PreconditionFailed:  # another run took it over first
    raise in_use({}) from None
  why = ("a run on this machine whose process is gone" if dead_here
         else "a run that stopped renewing it")
  print(f"workdir lock {path}: took over from {why} "
        f"({describe(holder)}; last renewed {age:.0f} s ago, lease {lease:.0f} s)",
        file=sys.stderr, flush=True)
