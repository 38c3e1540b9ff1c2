"""Where results are written, local or `gs://`, checked before any work and made whole
or not at all: the output checks of the commands, the staging folders of every writer
(`<name>.tmp-<host>-<pid>`, and their debris), and an output folder that appears only
once its block succeeds.

Code outside storage/ asks these what it needs of an output (can it be a folder, can a
file be written there, is it the same as another path) and never which storage it is.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator, Sequence

from bert_jax.errors import ConfigError
from bert_jax.storage import fs

# --- checks, before any work ---


def check_directory_target(flag: str, path: str) -> None:
  """`path` can be (or is) a folder: a supported URL, a bucket that exists and answers,
  or a local path with no file in the way of the folders to make. Nothing is written."""
  fs.check_path(flag, path)
  if fs.is_gcs(path):
    fs.check_bucket(path)  # missing, forbidden or unreachable: one line, nothing written
    return
  local = os.path.abspath(path)
  while not os.path.isdir(local):
    if os.path.lexists(local):
      raise ConfigError(f"{flag} {path}: {local} is not a directory; expected a directory "
                        "(created if missing)")
    local = os.path.dirname(local)


def check_writable_dir(flag: str, directory: str) -> None:
  """A file written and removed in `directory` (made for the check and removed again if
  missing), so an output on a read-only or full disk is one line before any work, not a
  traceback after it. A bucket: it exists and answers (a write there costs a request)."""
  fs.check_path(flag, directory)
  if fs.is_gcs(directory):
    fs.check_bucket(directory)
    return
  directory = os.path.abspath(directory)
  made, up = [], directory
  while not os.path.exists(up):
    made.append(up)
    up = os.path.dirname(up)
  probe = os.path.join(directory, f".write-check-{os.getpid()}")
  try:
    os.makedirs(directory, exist_ok=True)
    with fs.open(probe, "wb") as f:
      f.write(b"0" * 4096)  # a block: an inode alone fits on a full disk
      f.flush()
      os.fsync(f.fileno())
  except OSError as e:
    raise ConfigError(f"{flag} {directory}: cannot write there ({e.strerror}); expected a "
                      "writable directory with free space; nothing was written") from None
  finally:
    for path in (probe, *made):
      try:
        (os.remove if path == probe else os.rmdir)(path)
      except OSError:
        pass


def check_file_target(flag: str, path: str) -> None:
  """`path` can be written as one file: not a folder, and on a local disk in a folder
  that exists (a bucket has no folders to make)."""
  fs.check_path(flag, path)
  folder = os.path.dirname(os.path.abspath(path))
  if not fs.is_gcs(path) and not os.path.isdir(folder):
    raise ConfigError(f"{flag} '{path}': directory {folder} does not exist")
  if fs.isdir(path):
    raise ConfigError(f"{flag} '{path}' is a directory; expected a file name")


def same_path(a: object, b: object) -> bool:
  """Two settings name the same place: equal, or local paths to the same file."""
  return a == b or (isinstance(a, str) and isinstance(b, str) and bool(a) and bool(b)
                    and not fs.is_gcs(a) and not fs.is_gcs(b)
                    and os.path.realpath(a) == os.path.realpath(b))


def _components(path: str) -> tuple[str, ...]:
  """`path` as its components: a bucket's with `gs:` first (empty names, as `//` gives,
  dropped: GCS and the fs layer read `a//b` as `a/b`), a local one resolved (symlinks,
  `..`)."""
  if fs.is_gcs(path):
    return ("gs:",) + tuple(p for p in str(path)[len("gs://"):].split("/") if p)
  return tuple(p for p in os.path.realpath(os.path.expanduser(str(path))).split(os.sep) if p)


def check_apart(out_flag: str, out: str, reads: Sequence[tuple[str, str]]) -> None:
  """The output `out` is neither one of the paths a command reads (`reads`: (flag, path)),
  nor inside one, nor holds one: replacing it (`--overwrite`) or writing into it would
  delete or change what the command reads (a run exported onto itself once lost its
  checkpoints). One ConfigError line; nothing is touched."""
  o = _components(out)
  for in_flag, path in reads:
    if not path:
      continue
    i = _components(path)
    if o == i:
      how = "is"
    elif o[:len(i)] == i:
      how = "is inside"
    elif i[:len(o)] == o:
      how = "holds"
    else:
      continue
    raise ConfigError(f"{out_flag} {out} {how} {in_flag} {path}, which this command reads; "
                      "expected an output apart from it (writing there would replace what "
                      "is read); nothing was written")


# --- staging folders ---


def owner() -> str:
  """`<host>-<pid>`: the end of a staging folder's name (`<name>.tmp-<owner>`)."""
  return f"{socket.gethostname()}-{os.getpid()}"


def remove_stale(directory: str, prefix: str) -> None:
  """Removes `<prefix>*.tmp-<host>-<pid>` debris of dead processes on this host."""
  if not os.path.isdir(directory):
    return
  host = socket.gethostname()
  for name in os.listdir(directory):
    if not name.startswith(prefix) or ".tmp-" not in name:
      continue
    owner_host, _, pid = name.rpartition(".tmp-")[2].rpartition("-")
    if owner_host == host and pid.isdigit() and not _alive(int(pid)):
      shutil.rmtree(os.path.join(directory, name), ignore_errors=True)


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


@contextlib.contextmanager
def atomic_output_dir(out_dir: str, overwrite: bool,
                      reads: Sequence[tuple[str, str]] = ()) -> Iterator[str]:
  """Yields a temp dir beside `out_dir` that becomes `out_dir` only if the block succeeds.

  `reads`: (flag, path) of what the caller read to make the output; an `out_dir` that is
  one of them, inside one or holds one is refused (`check_apart`) before anything is
  touched. A `gs://` out_dir: the temp dir is local and is uploaded when the block
  succeeds (`_upload_tree`)."""
  check_apart("output", out_dir, reads)
  if fs.is_gcs(out_dir):
    with _bucket_output_dir(out_dir.rstrip("/"), overwrite) as tmp:
      yield tmp
    return
  out_dir = os.path.abspath(out_dir)
  if os.path.exists(out_dir) and not os.path.isdir(out_dir):
    raise ConfigError(f"output {out_dir} exists and is not a directory; expected a directory "
                      "(created if missing)")
  if os.path.isdir(out_dir) and os.listdir(out_dir) and not overwrite:
    raise ConfigError(f"output {out_dir} exists and is not empty; pass --overwrite to replace it")
  parent, base = os.path.split(out_dir)
  os.makedirs(parent, exist_ok=True)
  # A killed writer's temporary (`.<base>.tmp-<host>-<pid>` of a dead pid) is debris.
  remove_stale(parent, f".{base}.")
  tmp = os.path.join(parent, f".{base}.tmp-{owner()}")
  shutil.rmtree(tmp, ignore_errors=True)
  os.makedirs(tmp)
  try:
    yield tmp
  except BaseException:
    remove_settled(tmp)
    raise
  old = os.path.join(parent, f".{base}.old-{owner()}")
  if os.path.isdir(out_dir):
    fs.replace(out_dir, old)
  fs.replace(tmp, out_dir)
  shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def _bucket_output_dir(out_dir: str, overwrite: bool) -> Iterator[str]:
  if fs.listdir_or_empty(out_dir) and not overwrite:
    raise ConfigError(f"output {out_dir} exists and is not empty; pass --overwrite to replace it")
  fs.check_bucket(out_dir)
  tmp = tempfile.mkdtemp(prefix="bert_jax-output-")
  try:
    yield tmp
    if overwrite:
      fs.rmtree(out_dir)
    _upload_tree(tmp, out_dir)
  finally:
    remove_settled(tmp)


def _upload_tree(local: str, out_dir: str) -> None:
  """Every file under `local` to `out_dir`. Orbax reads a step on GCS only once its
  commit file exists (`commit_success.txt` in the step and item folders, what Orbax
  writes last when it saves to GCS itself): they are uploaded after everything else,
  so a reader never takes a half-uploaded step for complete."""
  commits = []
  for d, _, files in sorted(os.walk(local)):
    rel = os.path.relpath(d, local)
    parts = [] if rel == "." else rel.split(os.sep)
    for f in sorted(files):
      fs.upload(os.path.join(d, f), fs.join(out_dir, *parts, f))
    if len(parts) in (2, 3) and parts[0] == "checkpoints" and parts[1].isdigit():
      commits.append(fs.join(out_dir, *parts, "commit_success.txt"))
  for path in sorted(commits, key=len, reverse=True):  # the step folder's own last
    fs.write_text(path, "")


def remove_settled(path: str, tries: int = 20) -> None:
  """Removes `path` until it stays removed: after a failed Orbax save (a full disk),
  TensorStore's writes still in flight can make its folders again for a moment."""
  for _ in range(tries):
    shutil.rmtree(path, ignore_errors=True)
    time.sleep(0.1)
    if not os.path.exists(path):
      return
