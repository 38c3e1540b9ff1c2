"""Storage URLs: which paths are buckets, and the one line for a URL bert-jax cannot use.

`gs://bucket/path` is a bucket path; anything else that looks like a URL (`s3://`,
`GS://`, `gs:/b`, `gs://` without a bucket, an empty `//` segment) is one ConfigError
line naming what gave it, so no such path ever becomes a local folder named like a
bucket. Plain Python: the settings check their paths with it before anything is read.
"""

from __future__ import annotations

import os
import re
from typing import Any

from bert_jax.errors import ConfigError

GCS = "gs://"


def bucket_url(path: Any) -> str:
  """"gs://<bucket>" of a bucket path."""
  return f"{GCS}{_bucket_of(str(path))}"


def is_gcs(path: Any) -> bool:
  """True for `gs://bucket/...`, False for a local path; anything else that looks like a
  URL (`GS://`, `gs:/b`, `s3://`, `gs://` without a bucket) is a ConfigError line, so no
  such path ever becomes a local folder named like a bucket."""
  text = str(path)
  if text.startswith(GCS) and _bucket_of(text):
    return True
  if _URL_LIKE.match(text):
    raise ConfigError(url_problem(text))
  return False


# A scheme and a colon then a slash (`s3://x`, `GS://x`, `gs:/x`, `file:///x`): a URL,
# never a local path a user means (a local name with a colon has no slash after it).
_URL_LIKE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:/")


def _bucket_of(url: str) -> str:
  return url[len(GCS):].split("/", 1)[0]


def url_problem(path: str, what: str = "") -> str:
  """Why `path`, which looks like a URL, is not one bert-jax can use (one line)."""
  head = f"{what} {path!r}" if what else repr(path)
  scheme, _, rest = path.partition(":")
  rest = rest.lstrip("/")
  expected = "expected a local path or gs://bucket/path"
  if scheme.lower() == "gs" and not path.startswith(GCS) or (
      scheme.lower() == "gs" and path.startswith(GCS) and path[len(GCS):].startswith("/")):
    if rest:
      return f"{head} is not a valid bucket URL; {expected} (did you mean gs://{rest}?)"
  if scheme.lower() == "gs":
    return f"{head} names no bucket; {expected}"
  return (f"{head}: the {scheme}:// scheme is not supported (only gs:// buckets and local "
          f"paths are); {expected}")


def check_path(what: str, path: Any) -> None:
  """A ConfigError naming `what` (a flag, a config field) if `path` looks like a URL of a
  scheme bert-jax does not support, or a malformed gs:// one; else nothing."""
  text = str(path)
  if _URL_LIKE.match(text) and not (text.startswith(GCS) and _bucket_of(text)):
    raise ConfigError(url_problem(text, what))
  if text.startswith(GCS) and "//" in text[len(GCS):]:
    # gs://bkt//x: one object with two names (GCS keeps the empty segment, path joins
    # drop it), so a run's log and its checkpoints once went to different places.
    tidy = GCS + "/".join(p for p in text[len(GCS):].split("/") if p)
    raise ConfigError(f"{what} {text!r} has an empty path segment ('//'); expected "
                      f"{tidy!r}, one name for each object")


def local_file_problem(path: str) -> str:
  """What is wrong with `path` as an input file, in a few words, or '' when nothing is:
  a local file that exists, or a bucket URL (read, and checked, when it is copied)."""
  if is_gcs(path) or os.path.isfile(path):
    return ""
  return "is a directory" if os.path.isdir(path) else "does not exist or is not a file"
