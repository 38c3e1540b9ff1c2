"""The two settings Orbax 0.12 offers no public option for, in the one module that
touches its private names (an architecture test holds that no other does; a test holds
that the names exist in the installed Orbax, so an upgrade that moves them fails CI,
not a run).

- TensorStore's context (its GCS request retries): Orbax builds every TensorStore
  context it opens from two module dicts, and neither `CheckpointManager`,
  `StandardCheckpointHandler` nor `ArrayHandler` takes a context (checked against
  orbax-checkpoint 0.12.8; only the experimental v1 API passes one through). A
  jax.Array handler of our own (public: a subclass swapping `ParamInfo.ts_context`)
  would reach the arrays' reads and writes but not the OCDBT merge at a save's finalize,
  which builds its context from the same dicts (`merge_ocdbt_per_process_files`): a
  stalled bucket would then wait out TensorStore's own 32 retries there. The entries
  come from the storage backend of the path (`fs.tensorstore_context`).
- The handler of jax.Array: its replica-parallel threshold is an `ArrayHandler`
  argument, but `StandardCheckpointHandler` takes no handler of its own, so the global
  registry is the one place; `ArrayHandler` then needs the metadata store that its
  default registration builds (a private class).
"""

import logging

import jax
import orbax.checkpoint as ocp

# What this module reads from Orbax's private modules: (module, name).
PRIVATE_NAMES = (
    ("orbax.checkpoint._src.serialization.tensorstore_utils", "_BASE_TS_CONTEXT"),
    ("orbax.checkpoint._src.serialization.tensorstore_utils", "_DEFAULT_OCDBT_TS_CONTEXT"),
    ("orbax.checkpoint._src.metadata.array_metadata_store", "Store"),
)
_array_handler_set = False  # once a process


def use_tensorstore_context(entries: dict) -> None:
  """Every TensorStore context Orbax opens from now on has `entries` (process-wide: the
  dicts are Orbax's module globals). Nothing for `{}` (a local path)."""
  if not entries:
    return
  from orbax.checkpoint._src.serialization import tensorstore_utils as ts_utils
  for context in (ts_utils._BASE_TS_CONTEXT,  # pylint: disable=protected-access
                  ts_utils._DEFAULT_OCDBT_TS_CONTEXT):  # pylint: disable=protected-access
    context.update(entries)


def use_array_handler(min_slice_bytes_for_replica_parallel: int) -> None:
  """jax.Array leaves are written by an `ArrayHandler` with this replica-parallel
  threshold, from now on in this process (the first call decides)."""
  global _array_handler_set
  if _array_handler_set:
    return
  from orbax.checkpoint._src.metadata import array_metadata_store
  _array_handler_set = True
  absl_log = logging.getLogger("absl")
  level = absl_log.level
  absl_log.setLevel(logging.ERROR)  # not Orbax's warning that a handler is overridden
  try:
    ocp.type_handlers.register_type_handler(jax.Array, ocp.type_handlers.ArrayHandler(
        min_slice_bytes_for_replica_parallel=min_slice_bytes_for_replica_parallel,
        array_metadata_store=array_metadata_store.Store()), override=True)
  finally:
    absl_log.setLevel(level)
