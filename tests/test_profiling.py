"""Profiles (config.profile, bert_jax/train/profiling.py): a trace of the planned steps,
and of the next steps once <workdir>/PROFILE appears in a running run, that a trace
reader loads: its step annotations are the steps asked for."""

import glob
import gzip
import json
import os
import subprocess
import sys
import time

import pytest

import soak_kill

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _traced_steps(workdir: str) -> list[list[int]]:
  """Per capture (oldest first): the step numbers of its `train` step annotations, read
  from the Chrome-trace JSON the profiler writes beside its xplane.pb."""
  out = []
  for run in sorted(glob.glob(os.path.join(workdir, "tensorboard", "plugins", "profile", "*"))):
    assert glob.glob(os.path.join(run, "*.xplane.pb")), run  # what TensorBoard's plugin reads
    steps = set()
    for path in glob.glob(os.path.join(run, "*.trace.json.gz")):
      with gzip.open(path) as f:
        trace = json.load(f)
      for e in trace["traceEvents"]:
        if isinstance(e, dict) and e.get("name") == "train":
          steps.add(int(e["args"]["step_num"]))
    out.append(sorted(steps))
  return out


@pytest.mark.slow
def test_planned_steps_are_traced(tmp_path):
  from bert_jax.trainer import train_and_evaluate
  workdir = str(tmp_path / "run")
  train_and_evaluate(soak_kill.tiny_config(str(tmp_path / "prepared"), 12, **{
      "profile.steps": (5, 8)}), workdir)
  assert _traced_steps(workdir) == [[5, 6, 7]]


@pytest.mark.slow
def test_touching_profile_in_a_running_run_traces_its_next_steps(tmp_path):
  workdir = str(tmp_path / "run")
  args = soak_kill.tiny_args(workdir, str(tmp_path / "prepared"), 80,
                             **{"profile.on_demand_steps": 3})
  proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *args],
                          env=soak_kill.subprocess_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  try:
    soak_kill.wait_for_step(proc, workdir, 5)
    with open(os.path.join(workdir, "PROFILE"), "w", encoding="utf-8") as f:
      f.write("4\n")  # a number asks for that many steps
    deadline = time.monotonic() + 120
    while os.path.exists(os.path.join(workdir, "PROFILE")) and time.monotonic() < deadline:
      time.sleep(0.05)
    out, _ = proc.communicate(timeout=600)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == 0, out[-3000:]
  (steps,) = _traced_steps(workdir)
  assert len(steps) == 4 and steps == list(range(steps[0], steps[0] + 4)) and steps[0] >= 5
  assert f"profile: tracing steps {steps[0]}..{steps[-1]}" in out


@pytest.mark.slow
def test_a_profile_request_that_is_a_folder_is_a_request_not_a_crash(tmp_path):
  """`mkdir <workdir>/PROFILE` (issue 41: IsADirectoryError ended the run, and its resume)."""
  workdir = str(tmp_path / "run")
  os.makedirs(os.path.join(workdir, "PROFILE", "inside"))
  args = soak_kill.tiny_args(workdir, str(tmp_path / "prepared"), 8,
                             **{"profile.on_demand_steps": 2})
  proc = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *args],
                        env=soak_kill.subprocess_env(), capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr
  warnings = [l for l in proc.stderr.splitlines() if "PROFILE could not be read" in l]
  assert len(warnings) == 1 and warnings[0].startswith("warning: profile:"), proc.stderr
  assert not os.path.exists(os.path.join(workdir, "PROFILE"))  # taken: not asked again
  (steps,) = _traced_steps(workdir)
  assert len(steps) == 2


def test_a_profile_request_of_bytes_that_are_not_text_traces_the_default_steps(
    tmp_path, monkeypatch, capsys):
  from bert_jax.train import profiling
  started = []
  monkeypatch.setattr(profiling.StepProfiler, "_start",
                      lambda self, step, end: started.append((step, end)))
  with open(tmp_path / "PROFILE", "wb") as f:
    f.write(b"\xff\xfe\x00garbage")
  profiler = profiling.StepProfiler((), 5, str(tmp_path))
  profiler.check_request(10)
  assert started == [(10, 15)]
  assert not os.path.exists(tmp_path / "PROFILE")
  assert "UnicodeDecodeError" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["abc", "0", "-3"])
def test_a_profile_request_that_is_not_a_step_count_says_so_and_traces_the_default(
    tmp_path, monkeypatch, capsys, text):
  from bert_jax.train import profiling
  started = []
  monkeypatch.setattr(profiling.StepProfiler, "_start",
                      lambda self, step, end: started.append((step, end)))
  (tmp_path / "PROFILE").write_text(text + "\n")
  profiling.StepProfiler((), 5, str(tmp_path)).check_request(10)
  assert started == [(10, 15)] and not os.path.exists(tmp_path / "PROFILE")
  err = capsys.readouterr().err
  assert f"holds {text!r}; expected a positive step count" in err, err
