"""Goodput (train/goodput.py): a run's wall time split by where it went, over restarts."""

import glob
import json
import os
import signal
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
  proc = _popen(workdir, cache, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    soak_kill.wait_for_step(proc, workdir, 9)  # past checkpoint 8 (maybe unfinished), before 12
    killed = time.time()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
  finally:
    if proc.poll() is None:
      proc.kill()
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
