"""Multi-process start-up faults end within --distributed_timeout in one `error:` line.

The command-line cases are `python train.py` subprocesses (as a user starts
them), all at once to keep the file fast; initialisation fails before any data
or model work. The roster and the port lock are also tested in-process.
"""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

import multiprocess_runs as multiprocess

from bert_jax.parallel import startup, startup_roster
from bert_jax.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, "train.py")
TIMEOUT = 6  # --distributed_timeout of every case
LIMIT_S = 60  # per process: import time on a busy machine + TIMEOUT


def _free_port() -> int:
  return multiprocess.free_port()  # and P+1, the roster's


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


@pytest.mark.slow
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
      # --process_id=0 twice, at the same instant: one takes the port's lock and
      # waits for a process 1, the other stops at once.
      "zero-twice-a": _start(tmp_path, "e", f"127.0.0.1:{twice_port}", 2, 0),
      "zero-twice-b": _start(tmp_path, "f", f"127.0.0.1:{twice_port}", 2, 0),
  }
  try:
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
  twice = sorted((done[n][1] for n in ("zero-twice-a", "zero-twice-b")),
                 key=lambda err: "did not all join" in err)
  _one_error_line(done["zero-twice-a"][0], twice[0], "already in use by another bert-jax "
                  "process 0", startup_roster.lock_path(twice_port))
  _one_error_line(done["zero-twice-b"][0], twice[1], "did not all join",
                  f"--distributed_timeout={TIMEOUT}", "each id once")
  # Bounded: nobody waits much longer than the timeout after importing.
  assert max(t for _, _, t in done.values()) - start < LIMIT_S


def test_pre_checks_in_process():
  with pytest.raises(ConfigError, match="expected host:port"):
    startup.initialize_distributed("localhost", 2, 0, initialization_timeout=5)
  with pytest.raises(ConfigError, match="distributed_timeout=0"):
    startup.initialize_distributed("127.0.0.1:1234", 2, 0, initialization_timeout=0)
  with socket.socket() as busy:
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    with pytest.raises(ConfigError, match="already in use"):
      startup.initialize_distributed(f"127.0.0.1:{busy.getsockname()[1]}", 2, 0,
                                      initialization_timeout=5)
  with pytest.raises(ConfigError, match="leaves no port 65535\+1 for bert-jax's start-up roster"):
    startup.initialize_distributed("127.0.0.1:65535", 2, 1, initialization_timeout=5)
  t = time.monotonic()
  with pytest.raises(ConfigError, match="nothing listens"):
    startup.initialize_distributed(f"127.0.0.1:{_free_port()}", 2, 1, initialization_timeout=1)
  assert time.monotonic() - t < 10


# --- the roster (port P+1 of process 0) and the port lock, in-process ---------------------


def _join(address: str, i: int, n: int, timeout: float = 30) -> socket.socket:
  host, port = startup_roster.split_address(address)
  return startup_roster.join(host, port, address, i, n, timeout)


@pytest.fixture
def roster():
  port = _free_port()
  served = startup_roster.serve_roster(port, f"127.0.0.1:{port}", 3)
  yield f"127.0.0.1:{port}"
  served.close()


def test_a_taken_id_is_refused_at_once_naming_its_holder(roster):
  seat = _join(roster, 1, 3)
  t = time.monotonic()
  with pytest.raises(ConfigError) as e:
    _join(roster, 1, 3, timeout=30)
  assert time.monotonic() - t < 5  # not after the timeout
  msg = str(e.value)
  assert "--process_id=1 is already taken" in msg and f"pid {os.getpid()}" in msg, msg
  assert f"host {socket.gethostname()}" in msg and "expected" in msg and "\n" not in msg
  seat.close()


def test_the_id_of_a_holder_that_died_is_free_again(roster):
  # A killed process's connection is closed by the kernel: the same as this close.
  host, port = startup_roster.split_address(roster)
  dead = socket.create_connection((host, port + 1))
  dead.sendall(b'{"process_id": 2, "num_processes": 3, "host": "h", "pid": 1}\n')
  assert b'"ok": true' in dead.recv(4096)
  dead.close()
  _join(roster, 2, 3).close()


def test_a_process_0_elsewhere_is_refused_by_the_live_runs_roster(roster):
  # As if started on another host with this run's address: the port lock (host-local)
  # cannot see it, the roster can; the port itself is free here.
  host, port = startup_roster.split_address(roster)
  with pytest.raises(ConfigError, match=rf"--process_id=0 is already taken in this run by "
                                        rf"pid {os.getpid()} on host "):
    startup_roster.guard_process_0(host, port, roster, 3)
  os.close(startup_roster.lock_coordinator_port(port, roster))  # released on the way out


def test_another_num_processes_is_refused(roster):
  with pytest.raises(ConfigError, match=r"--num_processes=2: process 0 .* has "
                                        r"--num_processes=3; expected the same"):
    _join(roster, 1, 2)


def test_a_busy_roster_port_stops_process_0_and_frees_its_lock():
  port = _free_port()
  with socket.socket() as busy:
    busy.bind(("127.0.0.1", port + 1))
    busy.listen()
    with pytest.raises(ConfigError, match=rf"cannot listen on port {port + 1} .*roster.* "
                                          "another port"):
      startup_roster.guard_process_0("127.0.0.1", port, f"127.0.0.1:{port}", 2)
  os.close(startup_roster.lock_coordinator_port(port, f"127.0.0.1:{port}"))


def test_a_second_process_0_on_this_host_names_the_holder_until_it_dies():
  port = _free_port()
  code = ("import sys, time; sys.path.insert(0, %r)\n"
          "from bert_jax.parallel import startup_roster\n"
          "startup_roster.lock_coordinator_port(%d, 'x')\n"
          "print('held', flush=True)\n"
          "time.sleep(120)\n" % (ROOT, port))
  holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(ConfigError) as e:
      startup_roster.lock_coordinator_port(port, f"127.0.0.1:{port}")
    msg = str(e.value)
    assert f"port {port} is already in use by another bert-jax process 0" in msg, msg
    assert f"pid {holder.pid} on host {socket.gethostname()}" in msg and "expected" in msg
  finally:
    holder.kill()  # SIGKILL: nothing of the lock survives it
    holder.wait()
  os.close(startup_roster.lock_coordinator_port(port, f"127.0.0.1:{port}"))


# --- a live run is untouched by a process that repeats its id -----------------------------

_LIVE = """
import os, sys, time
sys.path.insert(0, {root!r})
import numpy as np
from bert_jax.parallel import startup
startup.initialize_distributed({address!r}, 2, {i}, initialization_timeout=60)
from jax.experimental import multihost_utils
print("joined", flush=True)
while not os.path.exists({gate!r}):
  time.sleep(0.1)
print("gathered", multihost_utils.process_allgather(np.array([{i}])).ravel().tolist(), flush=True)
"""


def test_a_repeated_process_id_is_refused_and_the_live_run_goes_on(tmp_path):
  address, gate = f"127.0.0.1:{_free_port()}", str(tmp_path / "go")
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3",
         "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
  live = [subprocess.Popen(
      [sys.executable, "-c", _LIVE.format(root=ROOT, address=address, i=i, gate=gate)],
      cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      start_new_session=True) for i in range(2)]
  try:
    for p in live:  # both joined: the run is assembled and live
      line = p.stdout.readline()
      assert line.strip() == "joined", line + p.stderr.read()[-2000:]
    intruder = subprocess.Popen(
        [sys.executable, TRAIN, f"--workdir={tmp_path / 'intruder'}",
         f"--coordinator_address={address}", "--num_processes=2", "--process_id=1",
         "--distributed_timeout=60"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    rc, err, _ = _finish(intruder)
    _one_error_line(rc, err, "--process_id=1 is already taken",
                    f"pid {live[1].pid} on host {socket.gethostname()}")
    assert not (tmp_path / "intruder").exists()  # nothing written
    time.sleep(1)  # an abort of the run would have reached the live processes by now
    open(gate, "w").close()
    for p in live:
      out, err = p.communicate(timeout=LIMIT_S)
      assert p.returncode == 0 and "gathered [0, 1]" in out, err[-2000:]
  finally:
    for p in live:
      if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
