"""Device mesh, logical-axis rules, and the shardings of state and batches.

The one place that maps the model's logical axis names onto mesh axes. The mesh
is (data, model) over every device of every host; data parallel by default,
parameters optionally sharded over the data axis too ('fsdp').
"""

import contextlib
import os
import sys
import threading
from typing import Any, Optional

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from bert_jax import startup_roster
from bert_jax.errors import ConfigError

DATA, MODEL = "data", "model"


DEFAULT_DISTRIBUTED_TIMEOUT_S = 120


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
    if any(v is None for v in explicit):
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
                                                 num_processes, initialization_timeout))
  # CPU processes need a cross-process collective implementation, or every
  # cross-host all-reduce fails; gloo ships with jaxlib (the default in recent
  # jax, set explicitly so an older default of "none" cannot break it). It
  # only affects the CPU backend, so TPU and GPU runs are unchanged.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  who = (f"process {process_id} of {num_processes} at --coordinator_address="
         f"{coordinator_address}" if process_id is not None else "this process (auto-detected)")
  done = threading.Event()

  def give_up() -> None:  # JAX's own timeout ends in a C++ abort: end first, in one line
    if not done.wait(initialization_timeout):
      for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
          stream.flush()
      os.write(2, (f"error: {who}: the processes did not all join within "
                   f"--distributed_timeout={initialization_timeout} s; expected "
                   + (f"{num_processes} processes with --process_id 0..{num_processes - 1}, "
                      "each id once, all with the same --coordinator_address and "
                      "--num_processes" if num_processes else "every process of the cluster")
                   + "\n").encode())
      os._exit(2)

  threading.Thread(target=give_up, name="bert_jax-distributed-timeout", daemon=True).start()
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


# JAX is given a little longer than our own limit, so ours reports first.
_JAX_TIMEOUT_MARGIN_S = 30

# Process 0's port lock and roster, or another process's roster connection:
# kept (never closed) for the life of the process, which is what they guard.
_STARTUP_GUARDS: list = []


def make_mesh(model_parallel: int = 1, devices=None) -> Mesh:
  devices = list(jax.devices() if devices is None else devices)
  if model_parallel <= 0 or len(devices) % model_parallel:
    raise ConfigError(
        f"config.mesh.model_parallel={model_parallel}: expected a positive divisor "
        f"of the {len(devices)} devices")
  grid = np.asarray(devices).reshape(len(devices) // model_parallel, model_parallel)
  # Auto axes: XLA (GSPMD) propagates shardings from inputs and parameters.
  return Mesh(grid, (DATA, MODEL), axis_types=(jax.sharding.AxisType.Auto,) * 2)


def logical_rules(param_sharding: str = "replicated") -> tuple:
  """Logical axis name -> mesh axis. 'fsdp' shards the hidden dim over data."""
  if param_sharding not in ("replicated", "fsdp"):
    raise ConfigError(
        f"config.mesh.param_sharding={param_sharding!r}: expected 'replicated' or 'fsdp'")
  embed = DATA if param_sharding == "fsdp" else None
  return (("batch", DATA), ("vocab", MODEL), ("mlp", MODEL), ("heads", MODEL),
          ("kv", None), ("embed", embed), ("length", None))


def tree_shardings(boxed_tree: Any, mesh: Mesh, rules: tuple) -> Any:
  """NamedShardings for a tree whose leaves may be nn.Partitioned boxes."""
  specs = nn.get_partition_spec(boxed_tree)
  with nn.logical_axis_rules(rules):
    return nn.logical_to_mesh_sharding(specs, mesh, rules)


def with_shardings(abstract_tree: Any, shardings: Any) -> Any:
  """ShapeDtypeStructs that also carry their shardings (restore targets, AOT lowering)."""
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                      abstract_tree, shardings)


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) dimension split over the data axis."""
  return NamedSharding(mesh, P(DATA))


def check_batch(global_batch: int, mesh: Mesh, grad_accum_steps: int = 1) -> None:
  data = mesh.shape[DATA]
  if grad_accum_steps <= 0:
    raise ConfigError(f"config.train.grad_accum_steps={grad_accum_steps}: expected >= 1")
  if global_batch <= 0 or global_batch % (data * grad_accum_steps):
    raise ConfigError(
        f"config.train.batch_size={global_batch}: expected a positive multiple of "
        f"{data} data-parallel devices x {grad_accum_steps} accumulation steps")
  if global_batch % jax.process_count():
    raise ConfigError(
        f"config.train.batch_size={global_batch}: expected a multiple of the "
        f"{jax.process_count()} processes")


def global_batch(local: Any, mesh: Mesh) -> Any:
  """Per-host numpy batch (a Batch, or any tree of arrays) -> global jax.Arrays split over data."""
  sharding = batch_sharding(mesh)
  return jax.tree.map(
      lambda v: jax.make_array_from_process_local_data(sharding, np.asarray(v)), local)


def replicate(value: np.ndarray, mesh: Mesh) -> jax.Array:
  """A host value (the same on every process) -> one array replicated on all devices."""
  value = np.asarray(value)
  return jax.make_array_from_callback(value.shape, replicated(mesh), lambda index: value[index])
