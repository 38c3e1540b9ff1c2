"""Joining a multi-process JAX run: checks, start-up guards, a bounded wait.

Process start-up changes for other reasons than the mesh (sharding.py): it
talks to the coordinator and the start-up roster, and must end the process
itself when JAX would hang or abort.
"""

import contextlib
import os
import sys
import threading
from typing import Optional

import jax

from bert_jax.parallel import startup_roster
from bert_jax.errors import ConfigError

DEFAULT_DISTRIBUTED_TIMEOUT_S = 120

# JAX is given a little longer than our own limit, so ours reports first.
_JAX_TIMEOUT_MARGIN_S = 30

# Process 0's port lock and roster, or another process's roster connection:
# kept (never closed) for the life of the process, which is what they guard.
_STARTUP_GUARDS: list = []


def initialize_distributed(coordinator_address: Optional[str] = None,
                           num_processes: Optional[int] = None,
                           process_id: Optional[int] = None,
                           initialization_timeout: int = DEFAULT_DISTRIBUTED_TIMEOUT_S) -> None:
  """Joins this process to a multi-process JAX run; call before any JAX computation.

  With no arguments the cluster is auto-detected (TPU pods, Slurm, Open MPI).
  Otherwise all three are needed, e.g. ('127.0.0.1:12345', 2, i) for two local
  processes; process 0 hosts the coordinator at that address, and bert-jax's
  start-up roster one port above it (see startup_roster).

  What can be checked first is (one ConfigError line each): the id is in
  range; on process 0, no other process 0 holds the port on this host and the
  port is free; on the others, the roster answers within
  `initialization_timeout` seconds and admits this id (not held by a live
  process, same number of processes). Joining itself is bounded by
  `initialization_timeout` too: if the run has not assembled by then (a
  process missing), this process prints one `error:` line and exits 2 (JAX
  would otherwise abort with a C++ stack trace, or wait for minutes).
  """
  if initialization_timeout is None or not 0 < initialization_timeout <= 86400:
    raise ConfigError(f"--distributed_timeout={initialization_timeout}: expected seconds in "
                      "(0, 86400]")
  explicit = (coordinator_address, num_processes, process_id)
  if any(v is not None for v in explicit):
    _take_startup_guards(coordinator_address, num_processes, process_id, initialization_timeout)
  # CPU processes need a cross-process collective implementation, or every
  # cross-host all-reduce fails; gloo ships with jaxlib (the default in recent
  # jax, set explicitly so an older default of "none" cannot break it). It
  # only affects the CPU backend, so TPU and GPU runs are unchanged.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  who = (f"process {process_id} of {num_processes} at --coordinator_address="
         f"{coordinator_address}" if process_id is not None else "this process (auto-detected)")
  done = threading.Event()
  threading.Thread(target=_exit_unless_joined,
                   args=(done, who, num_processes, initialization_timeout),
                   name="bert_jax-distributed-timeout", daemon=True).start()
  try:
    jax.distributed.initialize(
        coordinator_address, num_processes, process_id,
        initialization_timeout=initialization_timeout + _JAX_TIMEOUT_MARGIN_S)
  except (RuntimeError, ValueError, TypeError) as e:  # JaxRuntimeError is a RuntimeError
    raise ConfigError(f"{who}: jax.distributed.initialize failed "
                      f"({' '.join(str(e).split())[:300]}); expected a reachable coordinator "
                      "and consistent --num_processes/--process_id") from None
  finally:
    done.set()


def _take_startup_guards(coordinator_address: Optional[str], num_processes: Optional[int],
                         process_id: Optional[int], timeout: int) -> None:
  """Explicit flags: all three, in range; process 0's port lock and roster, or a roster id."""
  if coordinator_address is None or num_processes is None or process_id is None:
    raise ConfigError(
        "--coordinator_address, --num_processes and --process_id: expected all three "
        f"or none, got {coordinator_address!r}, {num_processes!r}, {process_id!r}")
  if num_processes < 1 or not 0 <= process_id < num_processes:
    raise ConfigError(f"--process_id={process_id}: expected 0 <= process_id < "
                      f"--num_processes={num_processes}")
  host, port = startup_roster.split_address(coordinator_address)
  if process_id == 0:
    _STARTUP_GUARDS.extend(startup_roster.guard_process_0(host, port, coordinator_address,
                                                          num_processes))
  else:
    _STARTUP_GUARDS.append(startup_roster.join(host, port, coordinator_address, process_id,
                                               num_processes, timeout))


def _exit_unless_joined(done: threading.Event, who: str, num_processes: Optional[int],
                        timeout: int) -> None:
  """JAX's own timeout ends in a C++ abort: end first, in one line."""
  if done.wait(timeout):
    return
  for stream in (sys.stdout, sys.stderr):
    with contextlib.suppress(Exception):
      stream.flush()
  os.write(2, (f"error: {who}: the processes did not all join within "
               f"--distributed_timeout={timeout} s; expected "
               + (f"{num_processes} processes with --process_id 0..{num_processes - 1}, "
                  "each id once, all with the same --coordinator_address and "
                  "--num_processes" if num_processes else "every process of the cluster")
               + "\n").encode())
  os._exit(2)
