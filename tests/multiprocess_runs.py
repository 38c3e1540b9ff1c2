"""Test helper: several commands started at once (jax.distributed processes on loopback).

  out = launch({"p0": (argv0, 4), "p1": (argv1, 4)}, logs_dir, cache_dir)

Each command runs with `devices` simulated CPU devices (and JAX's persistent
compilation cache in `cache`, or none); all must exit 0 within the timeout, or every
one still running is killed (a process left alone would wait for its peer in a
collective) and LaunchFailed carries each failed one's stderr tail. `launch_retrying` starts them
once more, from a clean workdir, when gloo's start-up timed out (below).
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import socket
import subprocess
import time
from typing import Optional

GLOO_STARTUP = "Gloo context initialization failed"
# Gloo's connection message, "[Gloo] Rank 1 is connected to 1 peer ranks. Expected number
# of connected peer ranks is : 1", is written piece by piece ("[Gloo] Rank ", 1, " is
# connected to ", ... and the line end apart) by threads that do not synchronise, so
# a line can hold pieces of two messages, a message can end on the next line, and
# another's line end can leave an empty line (a CI run saw process 1 print just '').
# A line made of nothing but those pieces, numbers and blanks is Gloo's, as is any line
# that starts with "[Gloo]".
_GLOO_PIECES = re.compile(r"\[Gloo\] Rank|is connected to|peer ranks\.|"
                          r"Expected number of connected peer ranks is :|\d+|\s+")


def own_lines(text: str) -> list[str]:
  """The lines of a process's output that are not Gloo's connection messages (nor blank)."""
  return [l for l in text.splitlines()
          if not l.startswith("[Gloo]") and _GLOO_PIECES.sub("", l)]


class LaunchFailed(Exception):
  pass


def free_port() -> int:
  """A loopback port P free with P + 1 free too (bert-jax's start-up roster listens next
  to the coordinator), outside the kernel's ephemeral range: a port bind(0) hands out is
  one of the next ones the processes' own HTTP connections get (to the GCS server of
  tests/test_gcs.py), and one of them once took P + 1 before the roster did."""
  try:
    with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
      low = int(f.read().split()[0])
  except (OSError, ValueError, IndexError):
    low = 32768
  rng = random.Random()
  for _ in range(500):
    port = rng.randrange(10000, max(low - 1, 10002))
    try:
      with socket.socket() as s, socket.socket() as t:
        s.bind(("127.0.0.1", port))
        t.bind(("127.0.0.1", port + 1))
    except OSError:
      continue
    return port
  raise RuntimeError("no two consecutive free loopback ports")


def _env(devices: int, cache: Optional[str]) -> dict:
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3",
         "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
  if cache:
    env |= {"JAX_COMPILATION_CACHE_DIR": cache, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
  return env


def launch(runs: dict[str, tuple[list[str], int]], logs: str, cache: Optional[str], cwd: str,
           timeout_s: float = 300) -> dict[str, str]:
  """Starts every run {name: (argv, devices)} at once; their stdouts, or LaunchFailed."""
  os.makedirs(logs, exist_ok=True)
  procs = {}
  for name, (argv, devices) in runs.items():
    out, err = (open(os.path.join(logs, f"{name}.{x}"), "w+") for x in ("out", "err"))
    procs[name] = (subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=err,
                                    env=_env(devices, cache), start_new_session=True), out, err)
  deadline = time.monotonic() + timeout_s
  while any(p.poll() is None for p, _, _ in procs.values()):
    if time.monotonic() > deadline or any(p.poll() not in (None, 0) for p, _, _ in procs.values()):
      break
    time.sleep(0.2)
  results, failed = {}, []
  for name, (p, out, err) in procs.items():
    if p.poll() is None:
      os.killpg(p.pid, signal.SIGKILL)
      p.wait()
    out.seek(0)
    err.seek(0)
    results[name], err_text = out.read(), err.read()
    out.close()
    err.close()
    if p.returncode != 0:
      tail = own_lines(err_text)[-15:]
      failed.append(f"--- {name} (exit {p.returncode}):\n" + "\n".join(tail))
  if failed:
    raise LaunchFailed("\n".join(failed))
  return results


def launch_retrying(runs: dict[str, tuple[list[str], int]], logs: str, cache: Optional[str],
                    cwd: str,
                    outputs: list[str]) -> dict[str, str]:
  """`launch`, once more after deleting `outputs` if gloo's start-up timed out.

  Gloo sets up its communicator at the first collective and gives the other process
  30 s (not configurable) to get there: on a loaded 2-core machine one process may
  still be compiling its first step. A `gs://` output is deleted through the storage
  API, as a run sees it (deleting the GCS server's files behind its back left objects
  it still listed).
  """
  try:
    return launch(runs, logs, cache, cwd)
  except LaunchFailed as e:
    if GLOO_STARTUP not in str(e):
      raise
  for path in outputs:
    if path.startswith("gs://"):
      from bert_jax.storage import fs  # pylint: disable=import-outside-toplevel
      if fs.exists(path):
        fs.rmtree(path)
    else:
      shutil.rmtree(path, ignore_errors=True)
  return launch(runs, logs, cache, cwd)
