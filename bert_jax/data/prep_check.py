"""Prepared data is checked before it is trusted: sizes recorded at preparation
are verified on every start (cheap: stats only), and storage that cannot be
written is one clear line.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from bert_jax.data import corpus
from bert_jax.errors import BertJaxError, ConfigError, CorpusError
from bert_jax.data.prep_store import (INFO_FILE, MANIFEST_FILE, SETTINGS_FILE, STATS_FILE,
                                    TOKENIZER_DIR, shard_path, write_json)
from bert_jax.storage import fs


def is_complete(directory: str, repair: bool = True) -> bool:
  """Whether `directory` holds a complete preparation whose files are as recorded.

  Checks presence and byte size of every file MANIFEST_FILE lists (settings,
  tokenizer), and of every `seq<L>/` folder's info.json and shards (see
  `check_seq_dir`): stats only, cheap enough for every start. With `repair`,
  what fails is removed with one `warning:` line naming the file, to be
  prepared again: the whole preparation when its top-level files fail (a
  folder of an older version, without a manifest, included), else only the
  failing `seq<L>/` folder. A folder that cannot be removed (read-only) is
  one ConfigError line.
  """
  if not os.path.isdir(directory):
    return False
  problem = _check_manifest(directory)
  if problem is not None:
    if repair:
      _warn(f"prepared data {problem}; preparing it again")
      _remove(directory, problem)
    return False
  if repair:
    for name in sorted(os.listdir(directory)):
      if name.startswith("seq") and name[3:].isdigit():
        problem = check_seq_dir(os.path.join(directory, name))
        if problem is not None:
          _warn(f"prepared data {problem}; preparing seq_len {name[3:]} again")
          _remove(os.path.join(directory, name), problem)
  return True


class PreparedDataError(BertJaxError):
  """A prepared-data folder whose files are not what its preparation recorded."""


def _manifest(directory: str, names: Sequence[str]) -> dict[str, int]:
  return {name: os.path.getsize(os.path.join(directory, name)) for name in names}


def write_manifest(directory: str) -> None:
  """MANIFEST_FILE: the byte size of each top-level file a reader trusts."""
  names = [SETTINGS_FILE, STATS_FILE] + sorted(
      f"{TOKENIZER_DIR}/{n}" for n in os.listdir(os.path.join(directory, TOKENIZER_DIR)))
  write_json(os.path.join(directory, MANIFEST_FILE),
              {"files": _manifest(directory, names)})


def _check_files(directory: str, recorded: Any) -> str | None:
  """The first recorded file that is missing or of another size, as '<path>: what'."""
  if not isinstance(recorded, dict) or not recorded:
    return "its file list is empty or not a JSON object"
  for name, size in sorted(recorded.items()):
    path = os.path.join(directory, name)
    try:
      found = os.stat(path).st_size
    except FileNotFoundError:
      return f"{path}: missing (recorded {size} bytes)"
    except OSError as e:
      return f"{path}: unreadable ({e.strerror})"
    if found != size:
      return f"{path}: {found} bytes, but its preparation recorded {size}"
  return None


def _read_json_object(path: str) -> tuple[dict | None, str | None]:
  try:
    with fs.open(path, encoding="utf-8") as f:
      obj = json.load(f)
  except FileNotFoundError:
    return None, f"{path}: missing"
  except (OSError, ValueError) as e:
    return None, f"{path}: unreadable ({type(e).__name__})"
  if not isinstance(obj, dict):
    return None, f"{path}: not a JSON object"
  return obj, None


def _check_manifest(directory: str) -> str | None:
  path = os.path.join(directory, MANIFEST_FILE)
  if not os.path.exists(path):
    return f"{path}: missing (a folder of an older bert-jax or an unfinished one)"
  manifest, problem = _read_json_object(path)
  if problem is not None:
    return problem
  problem = _check_files(directory, manifest.get("files"))
  return problem and (problem if problem.startswith(directory) else f"{path}: {problem}")


def check_seq_dir(seq_dir: str) -> str | None:
  """None if `seq<L>/`'s info.json and every shard it lists are there with their
  recorded sizes; else the first problem, '<path>: what'."""
  path = os.path.join(seq_dir, INFO_FILE)
  info, problem = _read_json_object(path)
  if problem is not None:
    return problem
  if "files" not in info:
    return f"{path}: lists no file sizes (made by an older bert-jax)"
  try:
    shards = {s: len(info["shards"][s]) for s in ("train", "eval")}
  except (KeyError, TypeError):
    return f"{path}: no shard counts for train and eval"
  expected = {os.path.basename(shard_path(os.path.join(seq_dir, s), i))
              for s, n in shards.items() for i in range(n)}
  if not isinstance(info["files"], dict) or set(info["files"]) != expected:
    return f"{path}: its file list does not match its shard counts"
  problem = _check_files(seq_dir, info["files"])
  return problem and (problem if problem.startswith(seq_dir) else f"{path}: {problem}")


def _warn(message: str) -> None:
  print(f"warning: {message}", file=sys.stderr, flush=True)


def _remove(path: str, problem: str) -> None:
  with writable(os.path.dirname(path), f"to prepare again what failed its check: {problem}"):
    shutil.rmtree(path)


_CANNOT_WRITE = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT,
                 errno.EFBIG)
# The same as array_record's writer reports them: a RuntimeError with the OS's words.
_CANNOT_WRITE_TEXT = re.compile(r"No space left on device|Read-only file system|"
                                r"Permission denied|Disk quota exceeded|File too large|"
                                r"Operation not permitted")


class CacheDirError(ConfigError):
  """The storage of config.data.cache_dir cannot take the prepared data (full, read-only,
  forbidden): finished parts are kept, so a rerun with space goes on from them."""


@contextlib.contextmanager
def writable(where: str, purpose: str = "") -> Iterator[None]:
  """An OSError of the storage under `where` (read-only, permission, full), or a record
  writer's error saying so -> one CacheDirError line naming config.data.cache_dir."""
  try:
    yield
  except (OSError, RuntimeError) as e:
    where_abs = os.path.abspath(where)
    if isinstance(e, OSError):
      inside = e.filename is None or os.path.abspath(str(e.filename)).startswith(where_abs)
      if e.errno not in _CANNOT_WRITE or not inside:
        raise
      why = f"{e.strerror}{': ' + str(e.filename) if e.filename else ''}"
    else:
      found = _CANNOT_WRITE_TEXT.search(str(e))
      path = re.search(r"writing (\S+?);", str(e))
      if found is None or (path and not os.path.abspath(path.group(1)).startswith(where_abs)):
        raise
      why = f"{found.group(0)}{': ' + path.group(1) if path else ''}"
    raise CacheDirError(
        f"config.data.cache_dir: cannot write prepared data in {where} ({why})"
        f"{' ' + purpose if purpose else ''}; expected a writable folder with free space: "
        "pass another --config.data.cache_dir (default <workdir>/prepared) or make room "
        "(finished parts are kept for the rerun)") from None


def check_corpus_unchanged(c, started_from: Any) -> None:
  """A corpus file that changed while it was read must not be cached as complete."""
  now = corpus.fingerprint(c.corpus)
  if now == started_from:
    return
  before = {f["file"]: f for f in _fingerprint_files(started_from)}
  after = {f["file"]: f for f in _fingerprint_files(now)}
  for path in sorted(set(before) | set(after)):
    a, b = before.get(path), after.get(path)
    if a == b:
      continue
    what = ("appeared" if a is None else "disappeared" if b is None else
            f"size {a['size']} -> {b['size']} bytes" if a["size"] != b["size"] else
            "modification time changed")
    raise CorpusError(f"corpus file '{path}' changed while it was being prepared ({what}); "
                      "expected it unchanged until preparation ends: nothing was cached, "
                      "rerun once it is complete")
  raise CorpusError(f"corpus '{c.corpus}' changed while it was being prepared; expected it "
                    "unchanged until preparation ends: nothing was cached, rerun")


def _fingerprint_files(fp: Any) -> list[dict]:
  if isinstance(fp, dict) and "file" in fp:
    return [fp]
  if isinstance(fp, dict) and isinstance(fp.get("files"), list):
    return fp["files"]
  return []
