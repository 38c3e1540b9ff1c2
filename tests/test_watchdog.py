"""The hang watchdog (config.watchdog_s, bert_jax/train/watchdog.py): a step that never
completes is found, every thread's stack goes to a file in the workdir naming the frame
that hangs, one line says where; paused work (compiles, evals) is not a hang; with
watchdog_exit the process ends with status 3 and the rerun resumes."""

import os
import re
import subprocess
import sys
import threading
import time

import pytest

import soak_kill
from bert_jax.train.watchdog import EXIT_STATUS, Watchdog

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sleepy_frame(seconds: float) -> None:
  time.sleep(seconds)


def test_no_beat_for_the_timeout_dumps_every_threads_stack_naming_the_hung_frame(
    tmp_path, capfd):
  with Watchdog(0.5, str(tmp_path)) as dog:
    dog.beat(7)
    t = threading.Thread(target=sleepy_frame, args=(2.5,), name="stuck-collective")
    t.start()
    t.join()
  assert dog.fired == str(tmp_path / f"hang-{os.uname().nodename}-{os.getpid()}-step7.txt")
  text = open(dog.fired, encoding="utf-8").read()
  assert "after step 7" in text and "sleepy_frame" in text and "stuck-collective" in text
  err = [l for l in capfd.readouterr().err.splitlines() if l.startswith("error:")]
  assert len(err) == 1 and dog.fired in err[0] and "still waiting" in err[0], err


def test_beats_and_paused_work_are_not_a_hang(tmp_path):
  with Watchdog(0.5, str(tmp_path)) as dog:
    for step in range(10):
      dog.beat(step)
      time.sleep(0.1)
    with dog.paused():  # a compile or an evaluation
      time.sleep(1.5)
    time.sleep(0.2)
  assert dog.fired is None and not os.listdir(tmp_path)


def test_off_by_default_starts_no_thread(tmp_path):
  with Watchdog(0, str(tmp_path)) as dog:
    time.sleep(0.1)
  assert dog._thread is None  # pylint: disable=protected-access


HANG = """
import runpy, sys, time
from bert_jax.data import input_pipeline
nxt = input_pipeline.TrainIterator.__next__
calls = [0]

def sleepy_next(self):  # the input pipeline stuck on storage at the 7th batch
  calls[0] += 1
  if calls[0] == 7:
    time.sleep(120)
  return nxt(self)
input_pipeline.TrainIterator.__next__ = sleepy_next
sys.argv = ["train.py", *{args!r}]
runpy.run_path({train!r}, run_name="__main__")
"""


@pytest.mark.slow
def test_a_hung_run_dumps_its_stacks_exits_3_and_the_rerun_resumes(tmp_path):
  workdir, cache = str(tmp_path / "run"), str(tmp_path / "prepared")
  args = soak_kill.tiny_args(workdir, cache, 12, **{"watchdog_s": 3, "watchdog_exit": True})
  env = {**soak_kill.subprocess_env(), "BERT_JAX_MALLOC": "system"}  # no exec: keep the patch
  start = time.monotonic()
  proc = subprocess.run([sys.executable, "-c", HANG.format(
      args=args, train=os.path.join(ROOT, "train.py"))], env=env, capture_output=True,
      text=True, timeout=300)
  assert proc.returncode == EXIT_STATUS, proc.stderr[-3000:]
  assert time.monotonic() - start < 100  # not the 120 s sleep
  errors = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
  # 3 s or a little more: the watchdog's thread may wake late on a loaded machine.
  waited = re.search(r"no training step completed for (\d+) s after step 6 ", errors[0]
                     if len(errors) == 1 else "")
  assert waited and 3 <= int(waited.group(1)) < 100, errors
  dumps = [f for f in os.listdir(workdir) if f.startswith("hang-")]
  assert len(dumps) == 1 and dumps[0] in errors[0]
  assert "sleepy_next" in open(os.path.join(workdir, dumps[0]), encoding="utf-8").read()
  done = soak_kill.run_to_end(args, soak_kill.subprocess_env())
  assert "resumed from" in done.stdout + done.stderr
  assert sorted(soak_kill.train_rows(workdir)) == list(range(1, 13))


def test_each_stall_is_reported_not_only_the_first(tmp_path, capfd):
  """The watchdog fired once per process: a false alarm (slow steps under load) left the
  real stall later in the run unreported."""
  with Watchdog(0.5, str(tmp_path)) as dog:
    dog.beat(3)
    time.sleep(1.2)  # the first stall
    for step in range(4, 8):  # training goes on
      dog.beat(step)
      time.sleep(0.1)
    time.sleep(1.2)  # the second, later stall
  assert dog.stalls == 2
  assert sorted(os.listdir(tmp_path)) == [f"hang-{os.uname().nodename}-{os.getpid()}-step{s}.txt"
                                          for s in (3, 7)]
  err = capfd.readouterr().err.splitlines()
  assert [re.sub(r"for \d+ s", "for N s", l.split(" (")[0]) for l in err
          if l.startswith("error:")] == [
              f"error: no training step completed for N s after step {s}" for s in (3, 7)], err
  assert sum(l.startswith("note: training went on at step") for l in err) == 1, err
