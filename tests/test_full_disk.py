"""Full disk and read-only storage at the writers of the last round: the workdir lock,
the coordinator port lock, a continued run's vocabulary and its step-0 checkpoint.

Each fault is one `error:` line (exit 2 through train.py) with nothing of the run
changed, compared as a listing of the workdir with every file's hash. Faults are made
three ways:
  - a patched call of the module that owns the write raises ENOSPC or EROFS (tests
    run as root, which chmod does not stop, so read-only is simulated this way);
  - RLIMIT_FSIZE in a train.py subprocess: every write past the limit fails with
    EFBIG, as on a full disk (tests/test_faults.py's DISK_FULL_DRIVER does the same);
  - a real full tmpfs and a real read-only bind mount, in a private mount namespace
    (`unshare -rm`; skipped where the system does not allow one).
"""

import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from bert_jax.data import tokenizer
from bert_jax.parallel import startup_roster
from bert_jax.storage import workdir_lock
from bert_jax.io import checkpointing
from bert_jax.train import init_from
from bert_jax.errors import CheckpointError, ConfigError
from bert_jax.trainer import train_and_evaluate
from test_source_check import RUN_FIELDS, run_config, write_source
from test_workdir_reuse import snapshot
import soak_kill

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, "train.py")

# Runs train.py with every file write past `limit` bytes failing with EFBIG (a full
# disk); with `at_save`, only from the run's first checkpoint save on.
FSIZE_DRIVER = """
import resource, runpy, signal, sys
sys.path.insert(0, {root!r})
def fill():
  signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # fail the write instead of killing
  resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, resource.RLIM_INFINITY))
if {at_save}:
  from bert_jax.io import checkpointing
  real = checkpointing.save
  def save(*args, **kwargs):
    fill()
    return real(*args, **kwargs)
  checkpointing.save = save
else:
  fill()
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path({train!r}, run_name="__main__")
"""

# Runs in a private mount namespace: mounts `mount` (a full tmpfs, or a read-only bind
# of `source`), copies the workdir there if asked, runs train.py on it, and prints the
# workdir's listing and hashes before and after with train.py's exit code and stderr.
NAMESPACE_DRIVER = r"""
import errno, json, os, shutil, subprocess, sys
sys.path.insert(0, {tests!r})
from test_workdir_reuse import snapshot
args = json.loads(sys.argv[1])
mnt = args["mnt"]
if args["mode"] == "full":
  subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%dk" % args["size_kib"], "tmpfs", mnt],
                 check=True)
  shutil.copytree(args["workdir"], os.path.join(mnt, "run"), symlinks=True)
  fd = os.open(os.path.join(mnt, "filler"), os.O_WRONLY | os.O_CREAT)  # fill what is left
  try:
    while True:
      os.write(fd, b"\0" * 4096)
  except OSError as e:
    assert e.errno == errno.ENOSPC, e
  os.close(fd)
  workdir = os.path.join(mnt, "run")
else:
  subprocess.run(["mount", "--bind", args["workdir"], mnt], check=True)
  subprocess.run(["mount", "-o", "remount,bind,ro", mnt], check=True)
  workdir = mnt
before = snapshot(workdir)
argv = [a.replace("@WORKDIR@", workdir) for a in args["argv"]]
proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
print(json.dumps({{"rc": proc.returncode, "stderr": proc.stderr, "before": before,
                  "after": snapshot(workdir)}}))
"""


def _errors(stderr: str) -> list:
  return [l for l in stderr.splitlines() if l.startswith("error:")]


def _dead_pid() -> int:
  proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True)
  return int(proc.stdout)


def _leave_stale_lock(workdir: str) -> None:
  """The lock file of a run killed with -9: its holder record stays, nobody holds it."""
  with open(workdir_lock.lock_path(workdir), "w", encoding="utf-8") as f:
    f.write(json.dumps(workdir_lock.holder_record(process_index=0) | {"pid": _dead_pid()})
            + "\n")


def _tiny_args(workdir: str, steps: int = 4) -> list:
  return soak_kill.tiny_args(workdir, os.path.join(workdir, "prepared"), steps) + [
      "--config.compile_cache_dir="]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
  """A finished tiny run, its prepared data inside the workdir (the whole run on one disk)."""
  workdir = str(tmp_path_factory.mktemp("full_disk") / "finished")
  c = soak_kill.tiny_config(os.path.join(workdir, "prepared"), 4)
  c.compile_cache_dir = ""
  train_and_evaluate(c, workdir)
  assert not os.path.exists(workdir_lock.lock_path(workdir))  # a finished run leaves none
  return workdir


# ----------------------------------------------------------------------------
# The workdir lock


def _raise(code):
  def fail(*args, **kwargs):
    raise OSError(code, os.strerror(code))
  return fail


@pytest.mark.parametrize("call, fault, reason", [
    ("pwrite", _raise(errno.ENOSPC), "No space left on device"),
    ("pwrite", lambda fd, data, offset: 0, "No space left on device"),  # a short write
    ("ftruncate", _raise(errno.EROFS), "Read-only file system"),
    ("pwrite", _raise(errno.EDQUOT), "Disk quota exceeded"),
], ids=["ENOSPC", "short-write", "EROFS", "EDQUOT"])
@pytest.mark.parametrize("stale", [False, True], ids=["finished", "killed"])
def test_a_lock_record_that_cannot_be_written_is_one_line_and_touches_nothing(
    tmp_path, monkeypatch, call, fault, reason, stale):
  workdir = str(tmp_path / "run")
  os.makedirs(os.path.join(workdir, "checkpoints", "4"))
  for name in ("metrics.jsonl", os.path.join("checkpoints", "4", "data")):
    with open(os.path.join(workdir, name), "w", encoding="utf-8") as f:
      f.write(f"{name}\n")
  if stale:
    _leave_stale_lock(workdir)
  before = snapshot(workdir)
  monkeypatch.setattr(workdir_lock.os, call, fault)
  with pytest.raises(ConfigError) as e:
    with workdir_lock.hold(workdir, 0):
      pytest.fail("the run must not start")  # pragma: no cover
  message = str(e.value)
  assert "\n" not in message and f"workdir {workdir}" in message and reason in message, message
  after = snapshot(workdir)
  # A dead holder's lock file is removed, as at the end of every run; nothing else changes.
  assert after == {k: v for k, v in before.items() if k != ".lock-0"}


def test_a_lock_that_cannot_be_written_leaves_no_new_workdir(tmp_path, monkeypatch):
  monkeypatch.setattr(workdir_lock.os, "pwrite", _raise(errno.ENOSPC))
  with pytest.raises(ConfigError, match="No space left on device"):
    with workdir_lock.hold(str(tmp_path / "new" / "run"), 0):
      pytest.fail("the run must not start")  # pragma: no cover
  assert os.listdir(tmp_path / "new") == []  # the workdir it made is gone again


@pytest.mark.slow
@pytest.mark.parametrize("stale", [False, True], ids=["finished", "killed"])
def test_train_py_on_a_full_disk_stops_at_the_lock_with_one_line(finished, tmp_path, stale):
  workdir = str(tmp_path / "run")
  shutil.copytree(finished, workdir)
  if stale:
    _leave_stale_lock(workdir)
  before = snapshot(workdir)
  driver = FSIZE_DRIVER.format(root=ROOT, train=TRAIN, limit=0, at_save=False)
  proc = subprocess.run([sys.executable, "-c", driver, *_tiny_args(workdir)],
                        capture_output=True, text=True, timeout=300,
                        env=soak_kill.subprocess_env())
  errors = _errors(proc.stderr)
  assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-3000:]
  assert f"workdir {os.path.abspath(workdir)}: cannot write the lock file" in errors[0]
  assert "File too large" in errors[0] and "Traceback" not in proc.stderr
  assert snapshot(workdir) == {k: v for k, v in before.items() if k != ".lock-0"}


def _in_namespace(tmp_path, mode: str, workdir: str, argv: list, size_kib: int = 0) -> dict:
  if shutil.which("unshare") is None:
    pytest.skip("no unshare(1) here")
  mnt = tmp_path / "mnt"
  mnt.mkdir()
  args = {"mode": mode, "mnt": str(mnt), "workdir": workdir, "argv": argv,
          "size_kib": size_kib}
  probe = subprocess.run(["unshare", "-rm", "mount", "-t", "tmpfs", "tmpfs", str(mnt)],
                         capture_output=True, text=True)
  if probe.returncode != 0:
    pytest.skip(f"no private mount namespace here: {probe.stderr.strip()}")
  driver = NAMESPACE_DRIVER.format(tests=os.path.dirname(os.path.abspath(__file__)))
  proc = subprocess.run(["unshare", "-rm", sys.executable, "-c", driver, json.dumps(args)],
                        capture_output=True, text=True, timeout=400,
                        env=soak_kill.subprocess_env())
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def _du_kib(path: str) -> int:
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs) // 1024


@pytest.mark.slow
def test_train_py_on_a_really_full_disk_is_one_line_and_changes_nothing(finished, tmp_path):
  """A tmpfs filled to its last byte (ENOSPC), not a simulated one: the lock file of a
  finished run is made (an inode), its holder record finds no block."""
  out = _in_namespace(tmp_path, "full", finished,
                      [sys.executable, TRAIN, *_tiny_args("@WORKDIR@")],
                      size_kib=2 * _du_kib(finished) + 4096)
  errors = _errors(out["stderr"])
  assert out["rc"] == 2 and len(errors) == 1, out["stderr"][-3000:]
  assert "cannot write the lock file" in errors[0] and "No space left on device" in errors[0]
  assert out["after"] == out["before"]


@pytest.mark.slow
def test_a_resume_that_gets_the_lock_on_a_really_full_disk_stops_at_its_first_write(
    finished, tmp_path):
  """A dead holder's lock file frees its block when truncated, so on a really full disk
  the record fits and the run resumes; its first write (a metrics row) is one line, and
  the checkpoints and metrics.jsonl are unchanged."""
  workdir = str(tmp_path / "run")
  shutil.copytree(finished, workdir)
  _leave_stale_lock(workdir)
  out = _in_namespace(tmp_path, "full", workdir,
                      [sys.executable, TRAIN, *_tiny_args("@WORKDIR@", steps=12)],
                      size_kib=2 * _du_kib(finished) + 4096)
  errors = _errors(out["stderr"])
  assert out["rc"] == 2 and len(errors) == 1, out["stderr"][-3000:]
  assert "No space left on device" in errors[0] and "Traceback" not in out["stderr"]
  changed = {k for k in set(out["before"]) | set(out["after"])
             if out["before"].get(k) != out["after"].get(k)}
  # The dead holder's lock file is gone, as after any run; TensorBoard may have begun a file.
  assert changed - {".lock-0"} <= {k for k in out["after"] if k.startswith("tensorboard/")}


@pytest.mark.slow
def test_train_py_on_a_read_only_workdir_is_one_line_and_changes_nothing(finished, tmp_path):
  """A real read-only bind mount (EROFS even for root)."""
  out = _in_namespace(tmp_path, "read-only", finished,
                      [sys.executable, TRAIN, *_tiny_args("@WORKDIR@")])
  errors = _errors(out["stderr"])
  assert out["rc"] == 2 and len(errors) == 1, out["stderr"][-3000:]
  assert "cannot create the lock file" in errors[0] and "Read-only file system" in errors[0]
  assert out["after"] == out["before"]


# ----------------------------------------------------------------------------
# The coordinator port lock (in the temporary folder, not in any workdir)


def test_a_port_lock_record_that_cannot_be_written_still_locks(tmp_path, monkeypatch):
  """A guard must not itself stop a run: a full temporary folder costs only the
  holder's name in a second process 0's error; the lock holds."""
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
  monkeypatch.setattr(startup_roster.os, "pwrite", _raise(errno.ENOSPC))
  fd = startup_roster.lock_coordinator_port(45678, "127.0.0.1:45678")
  try:
    assert fd is not None
    with pytest.raises(ConfigError, match="port 45678 is already in use by another bert-jax "
                       "process 0 on this host") as e:
      startup_roster.lock_coordinator_port(45678, "127.0.0.1:45678")
    assert "\n" not in str(e.value)
  finally:
    os.close(fd)


def test_a_port_lock_that_cannot_be_made_lets_the_port_check_decide(tmp_path, monkeypatch):
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
  real = os.open

  def read_only(path, flags, *args):
    if str(path).endswith(".lock"):
      raise OSError(errno.EROFS, "Read-only file system")
    return real(path, flags, *args)

  monkeypatch.setattr(startup_roster.os, "open", read_only)
  assert startup_roster.lock_coordinator_port(45679, "127.0.0.1:45679") is None
  assert os.listdir(tmp_path) == []


# ----------------------------------------------------------------------------
# A continued run: its vocabulary (extended or not) and its step-0 checkpoint


@pytest.fixture(scope="module")
def source(tmp_path_factory):
  return write_source(str(tmp_path_factory.mktemp("full_disk_source") / "hf"))


@pytest.mark.parametrize("fault, reason", [
    ("full", "No space left on device"), ("read-only", "Read-only file system")])
def test_a_continued_runs_vocabulary_that_cannot_be_written_is_one_line(
    source, tmp_path, monkeypatch, fault, reason):
  tmp = tmp_path / "tmp"
  tmp.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(tmp))
  if fault == "read-only":
    monkeypatch.setattr(init_from.tempfile, "mkdtemp", _raise(errno.EROFS))
  else:
    real = tokenizer._write_atomic  # pylint: disable=protected-access

    def full(path, text):
      if str(path).startswith(str(tmp)):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
      return real(path, text)

    monkeypatch.setattr(tokenizer, "_write_atomic", full)
  c = run_config(source, str(tmp_path / "cache"))
  c.data.extend_vocab = 5
  workdir = tmp_path / "run"
  with pytest.raises(ConfigError) as e:
    train_and_evaluate(c, str(workdir))
  message = str(e.value)
  assert "\n" not in message and "cannot write the run's vocabulary" in message, message
  assert str(tmp) in message and reason in message, message
  assert not workdir.exists() and not (tmp_path / "cache").exists()
  assert os.listdir(tmp) == []  # its temporary folder is removed


def test_a_step0_checkpoint_that_cannot_be_written_is_one_line_before_anything_is_logged(
    source, tmp_path, monkeypatch):
  """Read-only checkpoints folder (EROFS from the save call)."""
  monkeypatch.setattr(checkpointing, "save", _raise(errno.EROFS))
  workdir = tmp_path / "run"
  with pytest.raises(CheckpointError) as e:
    train_and_evaluate(run_config(source, str(tmp_path / "cache")), str(workdir))
  message = str(e.value)
  assert "\n" not in message and "could not write checkpoint" in message, message
  assert "checkpoints/0: OSError: [Errno 30] Read-only file system" in message, message
  assert "there is no older checkpoint" in message, message
  assert soak_kill.complete_steps(str(workdir)) == []
  assert not (workdir / "metrics.jsonl").exists() and not (workdir / "tensorboard").exists()


@pytest.mark.slow
def test_train_py_with_a_full_disk_at_the_step0_checkpoint_exits_2_and_a_rerun_starts_clean(
    source, tmp_path):
  workdir, cache = tmp_path / "run", tmp_path / "cache"
  args = ["--config", os.path.join(ROOT, "bert_jax", "default_config.py"), "--workdir",
          str(workdir), f"--config.init_from={source}", f"--config.data.cache_dir={cache}",
          *(f"--config.{k}={v}" for k, v in RUN_FIELDS.items())]
  env = soak_kill.subprocess_env()
  driver = FSIZE_DRIVER.format(root=ROOT, train=TRAIN, limit=0, at_save=True)
  proc = subprocess.run([sys.executable, "-c", driver, *args], capture_output=True, text=True,
                        timeout=300, env=env)
  errors = _errors(proc.stderr)
  assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-3000:]
  assert "could not write checkpoint" in errors[0] and "checkpoints/0:" in errors[0]
  assert "File too large" in errors[0] and "there is no older checkpoint" in errors[0]
  assert proc.stderr.rstrip().splitlines()[-1] == errors[0]
  assert soak_kill.complete_steps(str(workdir)) == []
  assert not (workdir / "metrics.jsonl").exists() and not (workdir / "tensorboard").exists()
  rerun = subprocess.run([sys.executable, TRAIN, *args], capture_output=True, text=True,
                         timeout=300, env=env)
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  assert "resumed" not in rerun.stdout and "init_from:" in rerun.stdout
  evals = [r["step"] for r in soak_kill.read_metrics(str(workdir)) if r["split"] == "eval"]
  assert evals[0] == 0 and evals.count(0) == 1
  assert soak_kill.complete_steps(str(workdir))[0] == 0
