"""Bucket failures: which are worth retrying, and the one line for the rest.

A request to a bucket that fails transiently (the server not answering, a timeout,
HTTP 429 or 5xx) is retried RETRIES rounds with backoff; a bucket that is missing or
forbidden is not retried. What remains is one `StorageError` naming the path and what
to do. Local paths are never retried here: their OSErrors reach the caller as they are.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from bert_jax.errors import BertJaxError, ConfigError
from bert_jax.storage.urls import (GCS, bucket_url, check_path, is_gcs,  # noqa: F401
                                   local_file_problem, url_problem)

# Rounds after the first. Each round is itself retried by the client library: gcsfs
# tries 6 times with exponential backoff (about 30 s against a server that refuses),
# google-cloud-storage (the lock) for up to 10 s, TensorStore (checkpoint arrays) by
# its own policy. None: BERT_JAX_GCS_RETRIES (default 1) and BERT_JAX_GCS_BACKOFF_S
# (2 s, doubled per round), read and checked when used; a number set here wins (tests).
RETRIES: int | None = None
BACKOFF_S: float | None = None
T = TypeVar("T")


def env_number(name: str, default: float, kind: type = float, minimum: float = 0.0,
               above: bool = False) -> float:
  """The environment setting `name` as a `kind` (int or float) >= `minimum` (> with
  `above`), `default` when unset; a ConfigError line naming it otherwise. Read when used,
  never at import, so a bad value is one line from the command that needs it."""
  text = os.environ.get(name)
  if text is None or not text.strip():
    return kind(default)
  try:
    value = kind(text)
  except ValueError:
    value = None
  # inf too: a lease that never expires can never be taken over, and the threads that
  # sleep for these seconds (lease renewal, log upload) die of it.
  if value is None or not math.isfinite(value) or (value <= minimum if above
                                                   else value < minimum):
    bound = f"{'>' if above else '>='} {minimum:g}"
    raise ConfigError(f"environment variable {name}={text!r}: expected "
                      f"{'an integer' if kind is int else 'a finite number'} {bound}")
  return value


def retry_rounds() -> int:
  return RETRIES if RETRIES is not None else int(env_number("BERT_JAX_GCS_RETRIES", 1, int))


def backoff_s() -> float:
  return BACKOFF_S if BACKOFF_S is not None else env_number("BERT_JAX_GCS_BACKOFF_S", 2.0)


def tensorstore_retries() -> dict:
  """The same policy for TensorStore (Orbax's array storage), which retries each request
  itself: 4 tries per round (8 by default), delays from half the backoff doubling up to
  four times it (1 s to 8 s: about 45 s against a server that is gone, where its own
  default, 32 tries up to 32 s apart, is a quarter of an hour)."""
  return {"max_retries": 4 * (retry_rounds() + 1), "initial_delay": f"{backoff_s() / 2:g}s",
          "max_delay": f"{backoff_s() * 4:g}s"}


def configure_clients() -> None:
  """Process-wide client settings, set before the first bucket request (the file layer
  and the checkpoint manager call it; nothing is changed at import). With an emulator
  (`STORAGE_EMULATOR_HOST`, a local GCS server as the tests run one), TensorStore is
  pointed at it too and given a placeholder token, the one TensorStore's own tests use
  against a local server: the emulator checks none, and without one TensorStore logs
  an error line that it found no credentials file. A value the user set is kept.
  gcsfs's log is quieted: it warns on every bucket it opens without default credentials
  (an emulator, a public bucket) and logs each failed attempt, where our one line says
  what matters."""
  logging.getLogger("gcsfs").setLevel(logging.CRITICAL)
  host = os.environ.get("STORAGE_EMULATOR_HOST")
  if host:
    os.environ.setdefault("TENSORSTORE_GCS_HTTP_URL", host)
    os.environ.setdefault("GOOGLE_AUTH_TOKEN_FOR_TESTING", "emulator")


class StorageError(BertJaxError):
  """A path that cannot be read or written: a bucket that is missing or forbidden, a
  server that stopped answering (after retries), a full or read-only disk."""

  unanswered = ""  # "gs://<bucket>" when its server did not answer (after retries)


# Buckets this process has stopped waiting on: a run stops because one did not answer
# through all retries, and each last write it still owes (the log upload, the goodput
# record, a listing for the error line) would wait as long again: gcsfs alone tries 6
# times over about 33 s, whatever bert-jax asks. While the run stops they fail at once;
# what they hold stays in the local copies and the checkpoints written before.
_GIVEN_UP: set[str] = set()


def unanswered_bucket(path: Any, e: BaseException) -> str:
  """"gs://<bucket>" when `path` is on a bucket and `e`, a failure of a request there
  (by a library with its own retries: Orbax's), is its server not answering; else ''.
  For the `unanswered` of an error raised after such a failure."""
  return bucket_url(path) if is_gcs(path) and is_transient(e) else ""


@contextlib.contextmanager
def giving_up_on(e: BaseException | None) -> Iterator[None]:
  """Inside, requests to the bucket that `e` says did not answer (its `unanswered`: a
  StorageError's, or a CheckpointError's) fail at once (`retrying` raises, `given_up` is
  true): a run's last writes as it stops on `e`."""
  bucket = getattr(e, "unanswered", "")
  if bucket:
    _GIVEN_UP.add(bucket)
  try:
    yield
  finally:
    _GIVEN_UP.discard(bucket)


def given_up(path: Any) -> bool:
  """True if `path` is on a bucket this process has stopped waiting on (`giving_up_on`)."""
  return bool(_GIVEN_UP) and is_gcs(path) and bucket_url(path) in _GIVEN_UP


_TRANSIENT = re.compile(r"Cannot connect|Connection refused|Connection reset|Server disconnected|"
                        r"timed out|Timeout|ServerDisconnected|\b(429|500|502|503|504)\b|"
                        r"temporarily unavailable|Too Many Requests|Service Unavailable")
_MISSING_BUCKET = re.compile(r"bucket.*(does not exist|not found)|NoSuchBucket|"
                             r"The specified bucket does not exist", re.I)
_FORBIDDEN = re.compile(r"\b(401|403)\b|Forbidden|Permission|Unauthorized|AccessDenied|"
                        r"does not have storage\.", re.I)


def _chain(e: BaseException) -> str:
  out, seen = [], e
  for _ in range(6):
    if seen is None:
      break
    out.append(f"{type(seen).__name__}: {seen}")
    seen = seen.__cause__ or seen.__context__
  return " <- ".join(out)


def is_transient(e: BaseException) -> bool:
  """A failure that may pass: the server not answering, a timeout, throttling, a 5xx."""
  if isinstance(e, (ConnectionError, TimeoutError, socket.timeout)):
    return True
  return bool(_TRANSIENT.search(_chain(e)))


def storage_error(path: str, e: BaseException, doing: str) -> StorageError:
  """One line for a failed `doing` of `path`: what it means and what to do."""
  text = _chain(e)
  bucket = path[len(GCS):].split("/", 1)[0] if is_gcs(path) else ""
  unanswered = ""
  if is_gcs(path) and _MISSING_BUCKET.search(text):
    why = f"bucket gs://{bucket} does not exist; expected an existing bucket"
  elif is_gcs(path) and _FORBIDDEN.search(text):
    why = (f"no permission on gs://{bucket} for these credentials; expected read and write "
           "access (roles/storage.objectAdmin) for the credentials in the environment")
  elif is_gcs(path) and is_transient(e):
    why = (f"the storage server did not answer in {retry_rounds() + 1} round(s) of retries with "
           f"backoff ({_short(e)}); expected a reachable bucket: rerun the same command "
           "once it is")
    unanswered = bucket_url(path)
  else:
    why = f"{_short(e)}"
  error = StorageError(f"cannot {doing} {path}: {why}")
  error.unanswered = unanswered
  return error


def _short(e: BaseException) -> str:
  text = " ".join(str(e).split()) or type(e).__name__
  if isinstance(e, OSError) and e.strerror:
    text = e.strerror
  return text if len(text) <= 160 else text[:157] + "..."


def retrying(path: str, doing: str, fn: Callable[[], T], passthrough: tuple = ()) -> T:
  """`fn()` with up to RETRIES retries (backoff from BACKOFF_S, doubling) when it fails
  transiently on a bucket; a failure that remains is one StorageError naming `path`.
  Local paths are not retried, and their OSErrors go to the caller as they are, as do
  the `passthrough` exceptions."""
  if not is_gcs(path):
    return fn()
  if given_up(path):
    raise StorageError(f"cannot {doing} {path}: not tried, the storage server stopped "
                       "answering earlier in this run")
  delay, rounds = backoff_s(), retry_rounds()
  for attempt in range(rounds + 1):
    try:
      return fn()
    except FileNotFoundError as e:
      # An upload or a listing is "not found" only when the bucket is.
      if doing in ("write", "list") or _MISSING_BUCKET.search(_chain(e)):
        check_bucket(path)
      raise
    except BertJaxError:
      raise
    except passthrough:  # answers the caller acts on (a precondition that failed)
      raise
    except Exception as e:  # pylint: disable=broad-except
      if attempt < rounds and is_transient(e):
        time.sleep(delay)
        delay *= 2
        continue
      raise storage_error(path, e, doing) from None
  raise StorageError(f"cannot {doing} {path}: no attempt was made")  # rounds >= 0: unreachable


def check_bucket(path: str) -> None:
  """One request: a StorageError line if the bucket of `path` is missing or forbidden,
  or its server does not answer (after retries). A local path: nothing."""
  if not is_gcs(path):
    return
  bucket = path[len(GCS):].split("/", 1)[0]

  def lookup():
    from google.cloud import storage  # pylint: disable=import-outside-toplevel
    from google.api_core import retry as api_retry  # pylint: disable=import-outside-toplevel
    return storage.Client().lookup_bucket(bucket, retry=api_retry.Retry(timeout=10),
                                          timeout=10)
  found = retrying(path, "reach", lookup)
  if found is None:
    raise StorageError(f"cannot use {path}: bucket gs://{bucket} does not exist; expected an "
                       "existing bucket (create it, or check the name)")
