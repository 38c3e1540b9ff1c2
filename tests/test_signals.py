"""A SIGTERM is never lost: a handler notes it, the work stops at its next safe point.

Python drops an exception raised while a garbage-collection callback runs ("Exception
ignored in: <function _xla_gc_callback>"), so a handler that raised to stop the work
lost a preemption notice now and then (issue 41). The handler only notes the request
(`errors.request_stop`); preparation, its worker pool, the run's chapters and the
training loop check it.
"""

import argparse
import gc
import os
import random
import signal
import subprocess
import sys
import time

import pytest

import soak_kill
from bert_jax import errors
from bert_jax.commands import train as train_command


@pytest.fixture
def noted_sigterm():
  """The command's SIGTERM handler, installed for the test and removed after it."""
  errors.clear_stop()
  previous = signal.signal(signal.SIGTERM, train_command._terminated)  # pylint: disable=protected-access
  try:
    yield
  finally:
    signal.signal(signal.SIGTERM, previous)
    errors.clear_stop()


def test_a_sigterm_delivered_inside_a_garbage_collection_callback_is_kept(noted_sigterm, capfd):
  fired = []

  def callback(phase, info):
    del info
    if phase == "start" and not fired:
      fired.append(True)
      os.kill(os.getpid(), signal.SIGTERM)
      for _ in range(1000):  # bytecodes inside the callback: the handler runs here
        pass

  gc.callbacks.append(callback)
  try:
    gc.collect()
  finally:
    gc.callbacks.remove(callback)
  assert fired
  assert errors.stop_requested() == signal.SIGTERM  # noted, not raised into gc and dropped
  with pytest.raises(errors.Terminated):
    errors.check_stop()  # the next safe point acts on it
  assert "Exception ignored" not in capfd.readouterr().err


def test_a_second_sigterm_keeps_the_first_and_says_one_line(noted_sigterm, capfd):
  os.kill(os.getpid(), signal.SIGTERM)
  os.kill(os.getpid(), signal.SIGTERM)
  time.sleep(0.01)
  assert errors.stop_requested() == signal.SIGTERM
  assert capfd.readouterr().err.count("SIGTERM received") == 1


def test_a_sigterm_while_the_vocabulary_trains_stops_it_at_once_saying_so(
    noted_sigterm, monkeypatch, tmp_path, capfd):
  """Training a vocabulary is native work that once held SIGTERM 17-52 s (past a 30 s
  preemption notice), then said 'finished parts of the data are kept' of nothing."""
  from bert_jax.data import bpe, dataset
  from bert_jax.settings import DataSettings
  monkeypatch.setattr(bpe.Tokenizer, "train",  # a long native call
                      classmethod(lambda cls, *a: time.sleep(30)))
  threading_timer = __import__("threading").Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM))
  threading_timer.start()
  start = time.monotonic()
  with pytest.raises(errors.Terminated) as e:
    dataset.make_tokenizer(DataSettings(corpus=str(tmp_path / "unread.txt")), seed=0)
  assert time.monotonic() - start < 2.0 and e.value.during == "training the vocabulary"
  monkeypatch.setattr(train_command, "train_and_evaluate", lambda *a, **k: (_ for _ in ()).throw(
      e.value))
  args = argparse.Namespace(verbosity=-1, coordinator_address=None, num_processes=None,
                            process_id=None, jax_distributed=False, workdir="unused",
                            explicit=frozenset())
  with pytest.raises(SystemExit) as exited:
    train_command._train(args, None)  # pylint: disable=protected-access
  assert exited.value.code == 143
  line = capfd.readouterr().err.strip().splitlines()[-1]
  assert line == ("interrupted: SIGTERM before training started (while training the "
                  "vocabulary; nothing of it is kept: rerun the same command to start it "
                  "again)"), line


@pytest.fixture
def finished_train(monkeypatch):
  """`commands.train._train` around a run that returns at once (its own steps tested
  elsewhere); the SIGTERM handler it leaves is put back after the test."""
  errors.clear_stop()
  monkeypatch.setattr(train_command, "_END_LINE_DUE", [True])
  previous = signal.getsignal(signal.SIGTERM)
  args = argparse.Namespace(verbosity=-1, coordinator_address=None, num_processes=None,
                            process_id=None, jax_distributed=False, workdir="unused",
                            explicit=frozenset())
  try:
    yield lambda run: (monkeypatch.setattr(train_command, "train_and_evaluate", run),
                       train_command._train(args, None))  # pylint: disable=protected-access
  finally:
    signal.signal(signal.SIGTERM, previous)
    errors.clear_stop()


def test_a_sigterm_after_the_last_safe_point_says_the_run_is_complete(finished_train, capfd):
  """The interpreter's shutdown after a finished run takes a second or more; a SIGTERM
  there once said 'stopping at the next safe point' and the run exited 0 (CI, stop 46)."""
  finished_train(lambda *a, **k: None)
  capfd.readouterr()
  os.kill(os.getpid(), signal.SIGTERM)
  os.kill(os.getpid(), signal.SIGTERM)
  time.sleep(0.01)
  err = capfd.readouterr().err
  assert err.count("SIGTERM received as the run ended: it is complete") == 1, err
  assert "next safe point" not in err


def test_a_sigterm_noted_during_the_run_is_said_once_at_its_end(finished_train, capfd):
  def run(*args, **kwargs):  # the signal came after the loop's last check
    del args, kwargs
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.01)

  signal.signal(signal.SIGTERM, train_command._terminated)  # pylint: disable=protected-access
  finished_train(run)
  os.kill(os.getpid(), signal.SIGTERM)  # and another during the shutdown
  time.sleep(0.01)
  err = capfd.readouterr().err
  assert err.count("SIGTERM received as the run ended: it is complete") == 1, err
  assert err.strip().splitlines()[-1].startswith("SIGTERM received as the run ended")


def _outcome(proc: subprocess.CompletedProcess, workdir: str, num_steps: int) -> str:
  """'stopped' (exit 143, one `interrupted:` line), 'complete' (exit 0, the signal came as
  the run ended and it says so), or what went wrong.

  One more 'complete': a signal in the last moments of the interpreter's shutdown, after
  Python has put the default handler back (killed, -15) or no longer runs handlers (exit
  0). Then the run had printed its last line and written its final checkpoint, and no
  handler said anything: nothing was left to stop."""
  err = proc.stderr
  if "Exception ignored" in err or "Traceback" in err:
    return f"a traceback: {err[-1500:]}"
  last = err.strip().splitlines()[-1] if err.strip() else ""
  if (proc.returncode == 128 + signal.SIGTERM and last.startswith("interrupted:")
      and "SIGTERM" in last):
    return "stopped"
  if proc.returncode == 0 and "SIGTERM received as the run ended" in last:
    return "complete"
  out_last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
  if (proc.returncode in (0, -signal.SIGTERM) and "SIGTERM received" not in err
      and out_last.startswith("checkpoints:")
      and os.path.isdir(os.path.join(workdir, "checkpoints", str(num_steps)))):
    return "complete"
  return f"exit {proc.returncode}, last line {last!r}"


def _run_and_signal(args, env, delay_or_marker) -> subprocess.CompletedProcess:
  proc = subprocess.Popen([sys.executable, os.path.join(soak_kill.ROOT, "train.py"), *args],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  if isinstance(delay_or_marker, str):  # as soon as the run prints this
    for line in proc.stdout:
      if delay_or_marker in line:
        break
  else:
    time.sleep(delay_or_marker)
  if proc.poll() is None:
    proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=300)
  return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.slow
def test_sigterm_at_random_moments_stops_the_run_or_finds_it_complete(tmp_path):
  """Through train.py: the signal at the start of data preparation, then at random
  moments from start-up to the end (compile, steps, saves, the final evaluation). Each
  run either stops (exit 143) or says it was already complete; never exit 0 with the
  signal dropped. A stopped run's rerun finishes."""
  seed = random.randrange(1 << 30)
  rng = random.Random(seed)
  env = soak_kill.subprocess_env(str(tmp_path / "xla-cache"))
  moments = ["Preparing pre-training data"] + [rng.uniform(3.0, 22.0) for _ in range(3)]
  outcomes = []
  for i, moment in enumerate(moments):
    workdir = str(tmp_path / f"run{i}")
    args = soak_kill.tiny_args(workdir, str(tmp_path / f"cache{i}"), 12,
                               **{"data.dupe_factor": 8})
    proc = _run_and_signal(args, env, moment)
    outcome = _outcome(proc, workdir, 12)
    outcomes.append((moment, outcome))
    assert outcome in ("stopped", "complete"), f"seed {seed}, moment {moment}: {outcome}"
    if outcome == "stopped" and i in (0, len(moments) - 1):
      soak_kill.run_to_end(args, env)  # the rerun goes on from what was kept
  assert outcomes[0][1] == "stopped", outcomes  # preparation is never run to the end of training
