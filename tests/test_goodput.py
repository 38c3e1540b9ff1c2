"""Goodput (train/goodput.py): a run's wall time split by where it went, over restarts."""

import glob
import json
import os
import subprocess
import sys
import time

import pytest

from bert_jax.train import goodput
import soak_kill

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Clock:
  """time.time() as the test says: sessions of known lengths, instantly."""

  def __init__(self, monkeypatch, now: float):
    self.now = now
    monkeypatch.setattr(time, "time", lambda: self.now)


def test_steps_run_past_the_restored_checkpoint_are_lost_to_the_restart(tmp_path, monkeypatch):
  clock = Clock(monkeypatch, 1000.0)
  first = goodput.Ledger(str(tmp_path), True, 1000.0)
  clock.now = 1010.0
  first.loop_starts()  # 10 s of start-up
  clock.now = 1036.0
  first.steps_done(last_step=13, steps=13, seconds=26.0)  # 2 s a step
  first.flush()  # killed after step 13; the newest checkpoint was 12
  second = goodput.Ledger(str(tmp_path), True, 1040.0)
  clock.now = 1042.0
  second.restored(12)
  second.loop_starts()
  assert second.recomputed == 1 and second.seconds["lost_restart"] == pytest.approx(2.0)
  assert second.seconds["startup"] == pytest.approx(2.0)
  total = second.total()
  assert total["sessions"] == 2 and total["recomputed_steps"] == 1
  assert total["wall"] == pytest.approx(38.0) and total["productive"] == pytest.approx(24.0)
  assert total["startup"] == pytest.approx(12.0) and total["lost_restart"] == pytest.approx(2.0)
  assert sum(total[k] for k in goodput.CATEGORIES) == pytest.approx(total["wall"])


def test_a_session_that_restored_its_last_step_lost_nothing(tmp_path):
  first = goodput.Ledger(str(tmp_path), True, time.time())
  first.loop_starts()
  first.steps_done(last_step=8, steps=8, seconds=0.0)
  first.flush()
  second = goodput.Ledger(str(tmp_path), True, time.time())
  second.restored(8)
  assert second.recomputed == 0 and second.seconds["lost_restart"] == 0


def test_a_session_that_never_trained_writes_nothing(tmp_path):
  ledger = goodput.Ledger(str(tmp_path), True, time.time())
  ledger.restored(0)
  ledger.flush()  # refused, or its work already done: the workdir stays as it was
  assert not (tmp_path / "goodput").exists()


def test_a_record_that_cannot_be_written_is_one_line(tmp_path, monkeypatch):
  import errno  # pylint: disable=import-outside-toplevel
  from bert_jax.errors import ConfigError  # pylint: disable=import-outside-toplevel

  def full(*_, **__):
    raise OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(goodput.fs, "write_json", full)
  ledger = goodput.Ledger(str(tmp_path), True, time.time())
  ledger.loop_starts()
  with pytest.raises(ConfigError, match=r"could not write .*goodput/session-.*No space left"):
    ledger.flush()


def test_a_log_points_record_on_a_bucket_is_written_in_the_background(tmp_path, monkeypatch):
  """Written synchronously at every log point, a stalled bucket held the run's steps."""
  import threading  # pylint: disable=import-outside-toplevel
  from bert_jax.errors import ConfigError  # pylint: disable=import-outside-toplevel
  release, written, real = threading.Event(), [], goodput.fs.write_json

  def stalled(path, record, **kw):  # the bucket's server stops answering for a while
    release.wait(10)
    written.append(record["last_step"])
    real(path, record, **kw)

  monkeypatch.setattr(goodput.fs, "write_json", stalled)
  ledger = goodput.Ledger(str(tmp_path), True, time.time())
  ledger._bucket = True  # pylint: disable=protected-access  # what a gs:// workdir sets
  ledger.loop_starts()
  for step in (4, 8, 12):
    ledger.steps_done(last_step=step, steps=4, seconds=1.0)
    start = time.monotonic()
    ledger.flush(background=True)
    assert time.monotonic() - start < 0.5  # the step goes on
  release.set()
  ledger.flush()  # the session's end: waits for the background write, then the last
  assert written == sorted(written) and written[-1] == 12 and len(written) <= 4
  (path,) = glob.glob(f"{tmp_path}/goodput/*.json")
  assert json.load(open(path))["last_step"] == 12
  # A background write that fails is raised at the next log point, as one line.
  monkeypatch.setattr(goodput.fs, "write_json",
                      lambda *a, **k: (_ for _ in ()).throw(OSError(28, "No space left")))
  ledger.flush(background=True)
  with pytest.raises(ConfigError, match="could not write .*No space left"):
    ledger.wait()


def test_the_process_start_is_before_now_and_after_the_interpreter_began():
  started = goodput.process_start_time()
  assert time.time() - 24 * 3600 < started <= time.time()


STEPS = 16


def _popen(workdir, cache, **kw):
  return subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"),
                           *soak_kill.tiny_args(workdir, cache, STEPS)],
                          env=soak_kill.subprocess_env(), **kw)


@pytest.mark.slow
def test_a_killed_and_resumed_run_accounts_for_its_wall_time(tmp_path):
  workdir, cache = str(tmp_path / "run"), str(tmp_path / "prepared")
  t0 = time.time()
  killed = None

  def wait(proc):
    nonlocal killed
    soak_kill.wait_for_step(proc, workdir, 9)  # past checkpoint 8 (maybe unfinished), before 12
    killed = time.time()

  assert soak_kill.kill_once(
      lambda: _popen(workdir, cache, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), wait)
  measured = time.time() - t0
  t0 = time.time()
  proc = _popen(workdir, cache, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  out, err = proc.communicate(timeout=600)
  exited = time.time()
  measured += exited - t0
  assert proc.returncode == 0, err[-3000:]
  sessions = [json.load(open(p)) for p in sorted(glob.glob(f"{workdir}/goodput/*.json"))]
  sessions.sort(key=lambda r: r["started"])
  assert len(sessions) == 2
  first, second = sessions
  first_path = sorted(glob.glob(f"{workdir}/goodput/*.json"),
                      key=lambda p: json.load(open(p))["started"])[0]
  # The killed session's steps after the checkpoint the resume found (8, or 4 when 8 was
  # still being written) were computed again, and counted lost.
  assert second["restored_step"] in (4, 8) and second["restored_step"] < first["last_step"]
  assert second["recomputed_steps"] == first["last_step"] - second["restored_step"]
  assert second["seconds"]["lost_restart"] > 0
  row = [json.loads(l) for l in open(os.path.join(workdir, "metrics.jsonl"))
         if '"goodput"' in l][-1]
  split = sum(row[k] for k in goodput.CATEGORIES)
  assert split == pytest.approx(row["wall"], rel=0.01), row
  # Every category measured, and the whole: only what a record cannot see is missing,
  # the time between the killed session's last record and the kill, and the finished
  # session's teardown after its summary row. Both are measured here (file times), so on
  # a loaded machine, where either can take seconds, the bound stays tight.
  for k in ("productive", "startup", "compile", "eval", "checkpoint", "lost_restart"):
    assert row[k] > 0, (k, row)
  unseen = ((killed - os.path.getmtime(first_path))
            + (exited - os.path.getmtime(os.path.join(workdir, "metrics.jsonl"))))
  assert 0.97 * (measured - unseen) - 0.5 < row["wall"] <= measured, (row["wall"], measured,
                                                                      unseen)
  # Every step once, less the two that compiled (each session's first), counted there.
  assert first["steps"] + second["steps"] - second["recomputed_steps"] == STEPS - 2
  assert "goodput: " in out and "2 session(s)" in out


def test_a_stall_in_a_log_points_writes_is_not_productive_time(tmp_path, monkeypatch):
  """A 75 s storage stall once went to 'productive' (133.7 of 166.1 s): the log point's
  writes fall in the next interval's clock, which counted them as steps."""
  from bert_jax.train import reporting  # pylint: disable=import-outside-toplevel
  from bert_jax.trainer import train_and_evaluate  # pylint: disable=import-outside-toplevel
  real = reporting.Reporter.write

  def slow(self, split, step, metrics):
    if split == "train" and step == 4:
      time.sleep(2.0)  # the bucket's server stalls here
    real(self, split, step, metrics)

  monkeypatch.setattr(reporting.Reporter, "write", slow)
  workdir = str(tmp_path / "run")
  train_and_evaluate(soak_kill.tiny_config(str(tmp_path / "prepared"), 8, **{
      "log_every": 2, "checkpoint_every": 100}), workdir)
  (path,) = glob.glob(f"{workdir}/goodput/*.json")
  seconds = json.load(open(path))["seconds"]
  assert seconds["other"] >= 2.0, seconds
