"""One run per workdir: the lock excludes a second holder, names it, dies with its process."""

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from bert_jax.storage import workdir_lock
from bert_jax.errors import BertJaxError, ConfigError
from bert_jax.storage.workdir_lock import WorkdirInUse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _holder_process(workdir: str, process_index: int = 0) -> subprocess.Popen:
  """A second process that takes the lock, says so, and sleeps until killed."""
  code = ("import sys, time; sys.path.insert(0, %r)\n"
          "from bert_jax.storage import workdir_lock\n"
          "with workdir_lock.hold(%r, %d):\n"
          "  print('held', flush=True)\n"
          "  time.sleep(120)\n" % (ROOT, workdir, process_index))
  proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
  assert proc.stdout.readline().strip() == "held"
  return proc


def test_hold_writes_the_holder_and_releases_on_exit(tmp_path):
  wd = str(tmp_path / "run")
  with workdir_lock.hold(wd, 0) as holder:
    path = workdir_lock.lock_path(wd, 0)
    with open(path, encoding="utf-8") as f:
      assert json.loads(f.read()) == holder
    assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
    assert holder["started"].endswith("UTC")
  assert not os.path.exists(path)
  assert not os.path.exists(wd)  # made by hold, left empty: removed again
  os.makedirs(wd)
  with workdir_lock.hold(wd):
    open(os.path.join(wd, "out.txt"), "w").close()
  assert os.listdir(wd) == ["out.txt"]  # a workdir with content stays, without the lock


def test_a_second_holder_in_the_same_process_is_refused(tmp_path):
  wd = str(tmp_path)
  with workdir_lock.hold(wd, 0):
    with pytest.raises(WorkdirInUse) as e:
      with workdir_lock.hold(wd, 0):
        pass  # pragma: no cover
    with workdir_lock.hold(wd, 1):  # another process index of the same run: its own lock
      pass
  assert isinstance(e.value, BertJaxError)
  msg = str(e.value)
  assert "\n" not in msg and wd in msg and f"pid {os.getpid()}" in msg
  assert socket.gethostname() in msg and "started" in msg and "another --workdir" in msg
  with workdir_lock.hold(wd, 0):  # free again
    pass


def test_a_lock_held_by_another_process_names_it_and_dies_with_it(tmp_path):
  wd = str(tmp_path / "run")
  proc = _holder_process(wd)
  try:
    with pytest.raises(WorkdirInUse, match=f"pid {proc.pid} on host") as e:
      with workdir_lock.hold(wd, 0):
        pass  # pragma: no cover
    assert e.value.holder["pid"] == proc.pid
    assert os.path.exists(workdir_lock.lock_path(wd, 0))
  finally:
    proc.send_signal(signal.SIGKILL)  # no cleanup runs in the holder
    proc.wait(timeout=30)
  assert os.path.exists(workdir_lock.lock_path(wd, 0))  # the file stays behind ...
  with workdir_lock.hold(wd, 0) as holder:  # ... but the lock died with its process
    assert holder["pid"] == os.getpid()


def test_each_process_index_has_its_own_lock(tmp_path):
  wd = str(tmp_path)
  proc = _holder_process(wd, process_index=1)
  try:
    with workdir_lock.hold(wd, 0):
      with pytest.raises(WorkdirInUse, match=f"pid {proc.pid}"):
        with workdir_lock.hold(wd, 1):
          pass  # pragma: no cover
  finally:
    proc.kill()
    proc.wait(timeout=30)


def test_a_holder_that_has_not_written_yet_is_reported_as_starting(tmp_path):
  import fcntl
  path = workdir_lock.lock_path(str(tmp_path), 0)
  fd = os.open(path, os.O_RDWR | os.O_CREAT)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX)
    with pytest.raises(WorkdirInUse, match="starting"):
      with workdir_lock.hold(str(tmp_path), 0):
        pass  # pragma: no cover
  finally:
    os.close(fd)


def test_a_lock_file_that_cannot_be_made_is_one_config_error(tmp_path, monkeypatch):
  real = os.open

  def read_only(path, flags, *args):
    if str(path).endswith(".lock-0"):
      raise OSError(errno.EROFS, "Read-only file system")
    return real(path, flags, *args)

  monkeypatch.setattr(os, "open", read_only)
  with pytest.raises(ConfigError, match="Read-only file system") as e:
    with workdir_lock.hold(str(tmp_path), 0):
      pass  # pragma: no cover
  assert str(tmp_path) in str(e.value) and "\n" not in str(e.value)


def test_a_lock_released_while_another_opened_it_is_not_shared(tmp_path, monkeypatch):
  """The holder unlinks the file before it lets go: a process that opened the old
  file and locks it after the release must not run beside a third on a new file."""
  wd = str(tmp_path)
  path = workdir_lock.lock_path(wd, 0)
  real_flock = workdir_lock.fcntl.flock
  calls = []

  def flock_after_a_swap(fd, op):
    if not calls:  # between our open and our flock, the file is replaced by another
      calls.append(fd)
      os.unlink(path)
      open(path, "w").close()
    return real_flock(fd, op)

  monkeypatch.setattr(workdir_lock.fcntl, "flock", flock_after_a_swap)
  with workdir_lock.hold(wd, 0):
    assert os.path.samestat(os.stat(path), os.fstat(_open_fds_for(path)))


def _open_fds_for(path: str) -> int:
  for name in os.listdir("/proc/self/fd"):
    try:
      if os.path.samefile(os.path.join("/proc/self/fd", name), path):
        return int(name)
    except OSError:
      continue
  raise AssertionError(f"no open descriptor for {path}")


def test_a_workdir_that_is_a_file_is_one_config_error(tmp_path):
  path = tmp_path / "workdir.txt"
  path.write_text("notes\n")
  with pytest.raises(ConfigError, match="not a directory"):
    with workdir_lock.hold(str(path), 0):
      pass  # pragma: no cover
  assert path.read_text() == "notes\n"
