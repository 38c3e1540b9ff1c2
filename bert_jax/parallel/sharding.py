"""Device mesh, logical-axis rules, and the shardings of state and batches.

The one place that maps the model's logical axis names onto mesh axes. The mesh
is (data, model) over every device of every host; data parallel by default,
parameters optionally sharded over the data axis too ('fsdp').
"""

import math
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from bert_jax.errors import ConfigError

DATA, MODEL = "data", "model"


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


def check_batch(global_batch: int, mesh: Mesh, grad_accum_steps: int = 1,
                field: str = "train.batch_size") -> None:
  """One ConfigError line naming `field` for a global batch the mesh cannot split."""
  data = mesh.shape[DATA]
  if grad_accum_steps <= 0:
    raise ConfigError(f"config.train.grad_accum_steps={grad_accum_steps}: expected >= 1")
  if global_batch <= 0 or global_batch % (data * grad_accum_steps):
    raise ConfigError(
        f"config.{field}={global_batch}: expected a positive multiple of "
        f"{data} data-parallel devices x {grad_accum_steps} accumulation steps")
  if global_batch % jax.process_count():
    raise ConfigError(
        f"config.{field}={global_batch}: expected a multiple of the "
        f"{jax.process_count()} processes")


def batch_unit(mesh: Mesh, grad_accum_steps: int = 1) -> int:
  """What every global batch must be a multiple of: the data-parallel devices times the
  accumulation steps, and the processes (check_batch)."""
  return math.lcm(mesh.shape[DATA] * grad_accum_steps, jax.process_count())


def global_batch(local: Any, mesh: Mesh) -> Any:
  """Per-host numpy batch (a Batch, or any tree of arrays) -> global jax.Arrays split over data."""
  sharding = batch_sharding(mesh)
  return jax.tree.map(
      lambda v: jax.make_array_from_process_local_data(sharding, np.asarray(v)), local)


def replicate(value: np.ndarray, mesh: Mesh) -> jax.Array:
  """A host value (the same on every process) -> one array replicated on all devices."""
  value = np.asarray(value)
  return jax.make_array_from_callback(value.shape, replicated(mesh), lambda index: value[index])
