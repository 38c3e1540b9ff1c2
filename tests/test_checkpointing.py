"""Orbax round trips: full train state, and params alone on another device layout."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.parallel import sharding
from bert_jax.io import checkpointing
from bert_jax.errors import CheckpointError


def _tree(mesh):
  rs = np.random.RandomState(0)
  shard = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
  params = {"w": jax.device_put(rs.randn(8, 4).astype(np.float32), shard),
            "b": jax.device_put(rs.randn(4).astype(np.float32), sharding.replicated(mesh))}
  opt = {"opt_state": {"mu": jax.tree.map(lambda x: x * 0.5, params), "count": jnp.int32(3)},
         "rng": jax.random.key_data(jax.random.key(7))}
  return params, opt


def test_train_state_round_trip_is_exact(tmp_path):
  mesh = sharding.make_mesh(1)
  params, opt = _tree(mesh)
  mngr = checkpointing.manager(str(tmp_path), keep=2)
  checkpointing.save(mngr, 5, params, opt, {"step": 5, "data_position": 17})
  mngr.wait_until_finished()
  abstract = lambda t: jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), t)
  p, o, meta = checkpointing.restore_train_state(mngr, 5, abstract(params), abstract(opt))
  mngr.close()
  assert meta == {"step": 5, "data_position": 17}
  for a, b in zip(jax.tree.leaves((params, opt)), jax.tree.leaves((p, o))):
    np.testing.assert_array_equal(a, b)


def test_only_the_last_k_checkpoints_are_kept(tmp_path):
  params, opt = _tree(sharding.make_mesh(1))
  mngr = checkpointing.manager(str(tmp_path), keep=2)
  for step in (1, 2, 3):
    checkpointing.save(mngr, step, params, opt, {"step": step})
  mngr.wait_until_finished()
  assert list(mngr.all_steps()) == [2, 3]
  mngr.close()


def test_params_only_restore_moves_8_device_arrays_to_one_device(tmp_path):
  params, opt = _tree(sharding.make_mesh(1))  # (8, 4) split over 8 devices
  mngr = checkpointing.manager(str(tmp_path / "checkpoints"))
  checkpointing.save(mngr, 3, params, opt, {"step": 3})
  mngr.wait_until_finished()
  mngr.close()
  restored, meta = checkpointing.restore_params(str(tmp_path))  # a workdir works too
  assert meta["step"] == 3 and set(restored) == {"w", "b"}
  assert len(restored["w"].sharding.device_set) == 1
  np.testing.assert_array_equal(restored["w"], params["w"])


def test_restoring_a_missing_checkpoint_names_it(tmp_path):
  with pytest.raises(CheckpointError, match="no such directory"):
    checkpointing.restore_params(str(tmp_path / "nothing"))
  (tmp_path / "empty").mkdir()
  with pytest.raises(CheckpointError, match="empty"):
    checkpointing.restore_params(str(tmp_path / "empty"))


def _sliced_saves(tmp_path, monkeypatch, shape) -> int:
  """Device slice ops Orbax makes to save one array of `shape`, replicated on 8 devices."""
  from orbax.checkpoint._src.serialization import replica_slices  # pylint: disable=import-outside-toplevel
  sliced = []
  real = replica_slices.ReplicaSlice.data
  monkeypatch.setattr(replica_slices.ReplicaSlice, "data", lambda self: (
      sliced.append(self.slice_args) if self.slice_args is not None else None, real(self))[1])
  mesh = sharding.make_mesh(8)
  params = {"x": jax.device_put(np.ones(shape, np.float32), sharding.replicated(mesh))}
  mngr = checkpointing.manager(str(tmp_path), keep=1)
  checkpointing.save(mngr, 1, params, {"rng": jnp.zeros(2, jnp.uint32)}, {"step": 1})
  mngr.wait_until_finished()
  restored = checkpointing.restore_params(str(tmp_path))[0]
  mngr.close()
  np.testing.assert_array_equal(restored["x"], params["x"])
  return len(sliced)


def test_a_small_replicated_array_is_written_by_one_replica_without_device_slices(
    tmp_path, monkeypatch):
  # Replica-parallel writes cost a device slice op (and its compile) per replica per
  # array: most of a small model's checkpoint time. Under MIN_REPLICA_SLICE_BYTES a
  # replica, one replica writes it.
  assert _sliced_saves(tmp_path, monkeypatch, (8, 1024)) == 0  # 4 KiB a replica


def test_a_large_replicated_array_is_still_written_by_all_replicas(tmp_path, monkeypatch):
  rows = 8 * checkpointing.MIN_REPLICA_SLICE_BYTES // (4 * 256)  # 1 MiB a replica
  assert _sliced_saves(tmp_path, monkeypatch, (rows, 256)) == 8
