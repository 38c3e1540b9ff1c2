"""Multi-process start-up faults end within --distributed_timeout in one `error:` line.

Each case is a `python train.py` subprocess (as a user starts them), all cases at
once to keep the file fast; initialisation fails before any data or model work.
"""

import os
import socket
import subprocess
import sys
import time

import pytest

from bert_jax import sharding
from bert_jax.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, "train.py")
TIMEOUT = 6  # --distributed_timeout of every case
LIMIT_S = 60  # per process: import time on a busy machine + TIMEOUT


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _start(tmp_path, name: str, address: str, n: int, i: int) -> subprocess.Popen:
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3",
         "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
  return subprocess.Popen(
      [sys.executable, TRAIN, f"--workdir={tmp_path / name}", f"--coordinator_address={address}",
       f"--num_processes={n}", f"--process_id={i}", f"--distributed_timeout={TIMEOUT}"],
      cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      start_new_session=True)


def _finish(proc: subprocess.Popen) -> tuple[int, str, float]:
  try:
    _, err = proc.communicate(timeout=LIMIT_S)
  except subprocess.TimeoutExpired:
    proc.kill()
    _, err = proc.communicate()
    pytest.fail(f"still running after {LIMIT_S} s:\n{err[-2000:]}")
  return proc.returncode, err, time.monotonic()


def _one_error_line(rc: int, err: str, *says: str) -> str:
  assert rc == 2, err
  assert "Traceback" not in err and "Check failure" not in err, err
  lines = [l for l in err.splitlines() if l.strip()]
  errors = [l for l in lines if l.startswith("error:")]
  assert len(errors) == 1 and lines[-1] == errors[0], err
  for s in says:
    assert s in errors[0], errors[0]
  assert "expected" in errors[0]
  return errors[0]


def _wait_listening(port: int, limit: float) -> None:
  deadline = time.monotonic() + limit
  while time.monotonic() < deadline:
    try:
      socket.create_connection(("127.0.0.1", port), timeout=1).close()
      return
    except OSError:
      time.sleep(0.2)
  pytest.fail(f"no coordinator came up on port {port}")


def test_startup_faults_end_in_one_error_line_within_the_timeout(tmp_path):
  busy = socket.socket()
  busy.bind(("127.0.0.1", 0))
  busy.listen()
  busy_port = busy.getsockname()[1]
  twice_port, nobody_port = _free_port(), _free_port()
  start = time.monotonic()
  procs = {
      # A port someone else holds: process 0 stops before starting the coordinator.
      "port-in-use": _start(tmp_path, "a", f"127.0.0.1:{busy_port}", 2, 0),
      # An id out of range.
      "id-out-of-range": _start(tmp_path, "b", f"127.0.0.1:{_free_port()}", 2, 2),
      # Two processes given --process_id=1 and none 0: both wait, bounded.
      "no-process-0-a": _start(tmp_path, "c", f"127.0.0.1:{nobody_port}", 2, 1),
      "no-process-0-b": _start(tmp_path, "d", f"127.0.0.1:{nobody_port}", 2, 1),
      # --process_id=0 twice: the first hosts the coordinator and waits for a process 1.
      "zero-twice-first": _start(tmp_path, "e", f"127.0.0.1:{twice_port}", 2, 0),
  }
  try:
    _wait_listening(twice_port, LIMIT_S)
    procs["zero-twice-second"] = _start(tmp_path, "f", f"127.0.0.1:{twice_port}", 2, 0)
    done = {name: _finish(p) for name, p in procs.items()}
  finally:
    busy.close()
    for p in procs.values():
      if p.poll() is None:
        p.kill()
        p.wait()

  _one_error_line(*done["port-in-use"][:2], f"127.0.0.1:{busy_port}", "already in use")
  _one_error_line(*done["id-out-of-range"][:2], "--process_id=2", "--num_processes=2")
  for name in ("no-process-0-a", "no-process-0-b"):
    _one_error_line(*done[name][:2], "nothing listens", f"--distributed_timeout={TIMEOUT}")
  _one_error_line(*done["zero-twice-second"][:2], "already in use")
  _one_error_line(*done["zero-twice-first"][:2], "did not all join",
                  f"--distributed_timeout={TIMEOUT}", "each id once")
  # Bounded: nobody waits much longer than the timeout after importing.
  assert max(t for _, _, t in done.values()) - start < LIMIT_S


def test_pre_checks_in_process():
  with pytest.raises(ConfigError, match="expected host:port"):
    sharding.initialize_distributed("localhost", 2, 0, initialization_timeout=5)
  with pytest.raises(ConfigError, match="distributed_timeout=0"):
    sharding.initialize_distributed("127.0.0.1:1234", 2, 0, initialization_timeout=0)
  with socket.socket() as busy:
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    with pytest.raises(ConfigError, match="already in use"):
      sharding.initialize_distributed(f"127.0.0.1:{busy.getsockname()[1]}", 2, 0,
                                      initialization_timeout=5)
  t = time.monotonic()
  with pytest.raises(ConfigError, match="nothing listens"):
    sharding.initialize_distributed(f"127.0.0.1:{_free_port()}", 2, 1, initialization_timeout=1)
  assert time.monotonic() - t < 10
