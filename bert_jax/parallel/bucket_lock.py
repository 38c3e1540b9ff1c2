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
workdir: the next run takes over at most that long after the kill. Expiry compares
the object's update time (the server's clock) with this host's clock.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Iterator

from bert_jax.errors import ConfigError
from bert_jax.storage import fs

LEASE_S = float(os.environ.get("BERT_JAX_LOCK_LEASE_S", 60))


def _blob(path: str):
  from google.cloud import storage  # with gcsfs; only for bucket workdirs
  bucket, _, name = path[len(fs.GCS):].partition("/")
  return storage.Client().bucket(bucket).blob(name)


def _call(path: str, fn):
  """A lock request with fs's bounded retries (a lease must not hang on a dead server);
  a failed precondition or a missing object is the caller's to handle."""
  from google.api_core import exceptions, retry as api_retry
  return fs.retrying(path, "lock", lambda: fn(api_retry.Retry(timeout=10)),
                     passthrough=(exceptions.PreconditionFailed, exceptions.NotFound))


class Lease:
  """The lock this process holds; `lost` (the new holder's record) once another run
  replaced it."""

  def __init__(self, path: str, record: dict, generation: int):
    self.path, self.record, self.generation = path, record, generation
    self.lost: dict | None = None
    self._lock = threading.Lock()  # a renewal and a verify never interleave
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._renew, name="bert_jax-lease", daemon=True)

  def _renew(self) -> None:
    from google.api_core import exceptions
    while not self._stop.wait(LEASE_S / 4):
      blob = _blob(self.path)
      try:
        with self._lock:
          _call(self.path, lambda r: blob.upload_from_string(
              json.dumps(self.record), if_generation_match=self.generation, retry=r,
              timeout=10))
          self.generation = blob.generation
      except exceptions.PreconditionFailed:
        self.lost = _holder_now(self.path)
        return
      except Exception:  # pylint: disable=broad-except
        continue  # the server did not answer: tried again at the next renewal

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
        self.lost = _holder_now(self.path)

  def release(self) -> None:
    self._stop.set()
    if self._thread.is_alive():
      self._thread.join(timeout=15)
    if self.lost is not None:
      return  # not ours to delete
    from google.api_core import exceptions
    with contextlib.suppress(exceptions.PreconditionFailed, exceptions.NotFound,
                             fs.StorageError):
      _call(self.path, lambda r: _blob(self.path).delete(if_generation_match=self.generation,
                                                          retry=r, timeout=10))


@contextlib.contextmanager
def hold(path: str, record: dict, in_use, describe) -> Iterator[Lease]:
  """Holds the lease object `path` inside the block. `in_use(holder)` is the exception
  to raise when a live run holds it; a takeover of an expired lease says one line, with
  `describe(holder)`."""
  from google.api_core import exceptions
  record = {**record, "lease_s": LEASE_S}
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
  lease = Lease(path, record, blob.generation)
  lease._thread.start()  # pylint: disable=protected-access
  try:
    yield lease
  finally:
    lease.release()


def _holder_now(path: str) -> dict:
  """The record in the lease object now ({} where it cannot be read)."""
  try:
    return json.loads(_call(path, lambda r: _blob(path).download_as_bytes(retry=r, timeout=10)))
  except Exception:  # pylint: disable=broad-except
    return {}


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
  lease = float(holder.get("lease_s", LEASE_S)) if isinstance(holder, dict) else LEASE_S
  if age < lease:
    raise in_use(holder if isinstance(holder, dict) else {})
  try:
    _call(path, lambda r: blob.upload_from_string(
        json.dumps(record), if_generation_match=current.generation, retry=r, timeout=10))
  except exceptions.PreconditionFailed:  # another run took it over first
    raise in_use({}) from None
  print(f"workdir lock {path}: took over from a run that stopped renewing it "
        f"({describe(holder)}; last renewed {age:.0f} s ago, lease {lease:.0f} s)",
        file=sys.stderr, flush=True)
