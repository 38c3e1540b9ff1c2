"""Orbax checkpoints: train state for resuming, params alone for features.

A checkpoint at step s holds three items:
  params     the model parameters (enough for feature extraction)
  opt_state  optimizer state and the root RNG key (only needed to resume)
  meta       JSON: step, data position, model config, vocabulary, full config
Keeping params apart lets `restore_params` read them without the optimizer, on
any number of devices.
"""

import errno
import logging
import os
import re
import sys
from typing import Any, Optional

import jax
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from bert_jax.errors import CheckpointError
from bert_jax.io import orbax_private
from bert_jax.storage import fs
from bert_jax.storage.workdir import opened

ITEMS = ("params", "opt_state", "meta")
RESTORED_STEP = "restored_step"  # added to the meta restore_params returns


# A write that fails (a full or read-only disk) is reported by the caller as one line.
# Orbax's writer threads add their own account of it on stderr: an absl ERROR with a
# traceback per thread, and, from TensorStore's callbacks into the save's event loop,
# closed by then, one unraisable "Event loop is closed" traceback per pending write
# (dozens). Both are dropped; every other log record and unraisable error goes on.
class _OrbaxWriterNoise(logging.Filter):
  """Orbax's background threads log a failed write at ERROR with its traceback (about
  100 lines each, several per failure); the run reports the failure itself in one
  `error:` or `warning:` line, so their records keep one line: message and cause."""

  def filter(self, record: logging.LogRecord) -> bool:
    if "_SignalingThread.run() raised an exception" in record.getMessage():
      return False
    if record.exc_info and "orbax" in (record.pathname or ""):
      e = record.exc_info[1]
      first = record.getMessage().splitlines()[0] if record.getMessage() else ""
      cause = " ".join(str(e).split())[:200] if e is not None else ""
      record.msg = f"{first} ({type(e).__name__}: {cause})" if e is not None else first
      record.args, record.exc_info, record.exc_text = (), None, None
    return True


def _quiet_closed_loop(previous):
  def hook(unraisable):
    e = unraisable.exc_value
    if not (isinstance(e, RuntimeError) and str(e) == "Event loop is closed"):
      previous(unraisable)
  hook.bert_jax = True
  return hook


def _quiet_orbax_writers() -> None:
  """The two filters above, installed once a process, when its first manager is made (not
  at import: a process that imports this module and writes no checkpoint keeps absl's
  log and its unraisable hook as they were)."""
  noise = logging.getLogger("absl")
  if not any(isinstance(f, _OrbaxWriterNoise) for f in noise.filters):
    noise.addFilter(_OrbaxWriterNoise())
  if not getattr(sys.unraisablehook, "bert_jax", False):
    sys.unraisablehook = _quiet_closed_loop(sys.unraisablehook)


# Orbax splits a replicated array into one slice per replica and writes each slice
# from its own device ("replica-parallel"), which pays on a pod for large arrays but
# costs a device slice op (and its compile) per replica for every array: 1400 of them
# for a 2-layer model on 8 devices, about 6 s of a tiny run's 6.3 s of checkpointing.
# Below this many bytes a replica, one replica writes the whole array.
MIN_REPLICA_SLICE_BYTES = 1 << 20


def _handlers(root: str) -> dict:
  """The items' handlers of a manager on `root`. Registered up front so a manager opened
  only to read (restore_params) knows each item's format and can report its metadata.
  Every manager is made with them, so the settings below are in place before any."""
  # TensorStore retries a GCS request up to 32 times with delays up to 32 s (a quarter
  # of an hour against a server that is gone); a run should stop with one line well
  # before that: the bucket backend's bound (`retries.tensorstore_retries`).
  orbax_private.use_tensorstore_context(fs.tensorstore_context(root))
  _quiet_orbax_writers()
  # Arrays restore the same either way (tests/test_checkpointing.py); only their chunks
  # on disk and the device that copies each out differ.
  orbax_private.use_array_handler(MIN_REPLICA_SLICE_BYTES)
  return {"params": ocp.StandardCheckpointHandler(),
          "opt_state": ocp.StandardCheckpointHandler(),
          "meta": ocp.JsonCheckpointHandler()}


def manager(directory: str, keep: int = 3, async_save: bool = True) -> ocp.CheckpointManager:
  """The manager a training run writes with.

  Orbax writes each step into `<step>.orbax-checkpoint-tmp-*` and renames it
  when complete, so a run killed mid-write leaves only that temporary folder:
  it is never listed as a step, and it is deleted here when the run restarts.
  """
  options = ocp.CheckpointManagerOptions(
      max_to_keep=keep, enable_async_checkpointing=async_save, create=True,
      cleanup_tmp_directories=True)
  root = fs.abspath(directory)
  return ocp.CheckpointManager(root, options=options, item_handlers=_handlers(root))


def move_aside(mngr: ocp.CheckpointManager, step: int) -> str:
  """Renames an unreadable step folder to `corrupt-<step>` (kept for inspection).

  Orbax no longer lists it, and the step can be written again. Returns the new path.
  """
  root = str(mngr.directory)
  target = fs.join(root, f"corrupt-{step}")
  if jax.process_index() == 0:
    n = 1
    while fs.exists(target):
      target, n = fs.join(root, f"corrupt-{step}-{n}"), n + 1
    fs.move_tree(fs.join(root, str(step)), target)  # on a bucket: copied, then deleted
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(f"bert_jax:moved_aside_{step}")
  mngr.reload()
  return target


def save(mngr: ocp.CheckpointManager, step: int, params: Any, opt_state: Any,
         meta: dict) -> None:
  """Starts an (async) save; the previous one is waited for by Orbax."""
  mngr.save(step, force=True, args=ocp.args.Composite(
      params=ocp.args.StandardSave(params),
      opt_state=ocp.args.StandardSave(opt_state),
      meta=ocp.args.JsonSave(meta)))


def restore_train_state(mngr: ocp.CheckpointManager, step: int, abstract_params: Any,
                        abstract_opt_state: Any) -> tuple[Any, Any, dict]:
  """Restores (params, opt_state, meta) onto the shardings of the abstract trees."""
  out = mngr.restore(step, args=ocp.args.Composite(
      params=ocp.args.StandardRestore(abstract_params),
      opt_state=ocp.args.StandardRestore(abstract_opt_state),
      meta=ocp.args.JsonRestore()))
  return out["params"], out["opt_state"], out["meta"]


def _checkpoint_root(path: str) -> tuple[str, Optional[int]]:
  """Accepts a workdir, its checkpoints/ folder, or one step folder."""
  path = fs.abspath(path)
  if not fs.isdir(path):
    raise CheckpointError(f"checkpoint {path}: no such directory; expected a workdir, its "
                          "checkpoints/ folder or a step folder")
  if fs.isdir(opened(path).checkpoints):
    return opened(path).checkpoints, None
  if fs.isdir(fs.join(path, "params")) and fs.basename(path).isdigit():
    return fs.parent(path), int(fs.basename(path))
  return path, None


def complete_steps(path: str) -> tuple[str, list[int]]:
  """(the checkpoints folder, its complete steps in order) of a workdir, its checkpoints/
  folder or a step folder."""
  root, _ = _checkpoint_root(path)
  mngr = ocp.CheckpointManager(root, item_handlers=_handlers(root))
  try:
    return root, sorted(mngr.all_steps())
  finally:
    mngr.close()


def restore_params(path: str, step: Optional[int] = None,
                   sharding: Optional[jax.sharding.Sharding] = None) -> tuple[Any, dict]:
  """Restores only the params (no optimizer state) and the meta of a checkpoint (with
  RESTORED_STEP: the step read).

  `path` is a workdir, its checkpoints/ folder or a step folder; the newest
  step unless one is given. Arrays land on `sharding` (default: the first
  local device), whatever device layout the checkpoint was written with.

  With no step given, a step whose own files are damaged (params missing,
  meta unreadable, data that does not decode) is skipped with one `warning:`
  line on stderr naming it, and the newest complete one is read; nothing is
  moved or deleted. A given step that is damaged, or no readable step at
  all, is a one-line CheckpointError. A run writing the workdir meanwhile is
  no problem: Orbax lists a step only once it is complete (its temporary
  `<step>.orbax-checkpoint-tmp-*` folder is never listed, and is left alone).
  """
  root, step_in_path = _checkpoint_root(path)
  mngr = ocp.CheckpointManager(root, item_handlers=_handlers(root))
  try:
    step = step if step is not None else step_in_path
    steps = sorted(mngr.all_steps(), reverse=True)
    if step is None and not steps or step is not None and step not in steps:
      raise CheckpointError(
          f"checkpoint {root}: no step{'' if step is None else f' {step}'} found "
          f"(have {sorted(steps)}); "
          + ("expected one of them" if steps else
             "expected a checkpoint written by train.py or bert_jax.io.convert"))
    sharding = sharding or jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    if step is not None:
      try:
        return _restore_params_step(mngr, root, step, sharding)
      except Exception as e:  # pylint: disable=broad-except
        why = _damage(e, f"{root}/{step}")
        raise CheckpointError(
            f"checkpoint {root}/{step} is incomplete or unreadable ({why}); expected a "
            f"complete checkpoint: pass another step (have {sorted(steps)}) or none for the "
            "newest complete one") from None
    return _restore_newest_complete(mngr, root, steps, sharding)
  finally:
    mngr.close()


def restore_ema(path: str, step: Optional[int] = None,
                sharding: Optional[jax.sharding.Sharding] = None) -> tuple[Any, dict]:
  """The moving average of the parameters (`config.train.phase_ema`) that a training
  checkpoint's optimizer state holds, shaped as its params, and its meta (with
  RESTORED_STEP); the newest step unless one is given. A checkpoint without one (a run
  with no phase_ema, an import, a merge) is a one-line CheckpointError."""
  root, step_in_path = _checkpoint_root(path)
  mngr = ocp.CheckpointManager(root, item_handlers=_handlers(root))
  try:
    steps = sorted(mngr.all_steps())
    step = step if step is not None else step_in_path if step_in_path is not None else (
        steps[-1] if steps else None)
    if step is None or step not in steps:
      raise CheckpointError(f"checkpoint {root}: no step {'' if step is None else step} "
                            f"found (have {steps}); expected a step of a training run")
    try:
      tree = getattr(mngr.item_metadata(step)["opt_state"], "tree", None)
    except KeyError:  # an import or a merge: no optimizer state at all
      tree = None
    inner = (((tree or {}).get("opt_state") or {}).get("inner") or [None])[-1]
    if not isinstance(inner, dict) or "ema" not in inner:
      raise CheckpointError(f"checkpoint {root}/{step}: no moving average of the parameters "
                            "in its optimizer state; expected a step of a run with "
                            "--config.train.phase_ema")
    sharding = sharding or jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    out = mngr.restore(step, args=ocp.args.Composite(
        opt_state=ocp.args.StandardRestore(_abstract(tree, sharding)),
        meta=ocp.args.JsonRestore()))
    return out["opt_state"]["opt_state"]["inner"][-1]["ema"], {**out["meta"],
                                                               RESTORED_STEP: step}
  finally:
    mngr.close()


def _restore_newest_complete(mngr: ocp.CheckpointManager, root: str, steps: list[int],
                             sharding: jax.sharding.Sharding) -> tuple[Any, dict]:
  """The newest step that restores, skipping damaged ones with one warning line."""
  skipped, tried, rotations = [], set(), 0
  while (s := next((s for s in steps if s not in tried), None)) is not None:
    tried.add(s)
    try:
      out = _restore_params_step(mngr, root, s, sharding)
    except Exception as e:  # pylint: disable=broad-except
      why = _damage(e, f"{root}/{s}")
      if not fs.isdir(fs.join(root, str(s))) and rotations < _MAX_ROTATIONS:
        # Deleted meanwhile by a run's max_to_keep (a newer step replaced it), not
        # damaged: list the steps again.
        rotations += 1
        mngr.reload()
        steps = sorted(mngr.all_steps(), reverse=True)
        continue
      skipped.append(f"{root}/{s} ({why})")
      continue
    if skipped:
      print(f"warning: skipped incomplete or unreadable checkpoint {'; '.join(skipped)}; "
            f"using step {s}, the newest complete one",
            file=sys.stderr, flush=True)
    return out
  raise CheckpointError(f"checkpoint {root}: no step is complete and readable: "
                        f"{'; '.join(skipped)}; expected at least one complete checkpoint")


def _damage(e: Exception, where: str) -> str:
  """Why the checkpoint at `where` is damaged; an error of the environment becomes one
  CheckpointError line, and anything else (a bug) is raised as it is."""
  kind, why = classify(e)
  if kind == "environment":
    raise CheckpointError(environment_message(where, why)) from None
  if kind == "other":
    raise e
  return why


_MAX_ROTATIONS = 5  # steps a reader lets a writing run rotate away before giving up

# What a step's own damaged files raise: missing items (KeyError) or files
# (FileNotFoundError, OSError), undecodable JSON or array data (ValueError,
# TensorStore's DATA_LOSS included), and our own checks (CheckpointError).
_DAMAGE = (KeyError, OSError, ValueError, CheckpointError)

# What the environment raises, however intact the checkpoint: no space, a
# read-only or forbidden file, no memory. Reading again once that is fixed works.
_ENVIRONMENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS,
                                 errno.EACCES, errno.EPERM, errno.ENOMEM, errno.EMFILE,
                                 errno.ENFILE})
# The same as TensorStore and XLA report them (a status code or the OS's words in a
# long text; TensorStore also appends os_error_code='N').
_ENVIRONMENT_TEXT = re.compile(
    r"RESOURCE_EXHAUSTED|PERMISSION_DENIED|No space left on device|Disk quota exceeded|"
    r"Read-only file system|Permission denied|Operation not permitted|Cannot allocate memory|"
    r"Out of memory|Too many open files")


def classify(e: BaseException) -> tuple[str, str]:
  """What a failure to read a checkpoint says about it, and why in one short line.

  ("environment", why): no space, read-only, permission, memory (host or device):
      the checkpoint may be intact, so it must not be moved or skipped;
  ("damage", why): the checkpoint's own files are missing, truncated or do not
      decode: another step may be read instead;
  ("other", why): anything else (a bug, an interrupt): let it propagate.
  The exception's causes count too: Orbax wraps TensorStore's errors (a
  truncated file's OUT_OF_RANGE or DATA_LOSS ValueError) in a bare Exception.
  """
  seen, depth, damage = e, 0, None
  while seen is not None and depth < 8:
    if isinstance(seen, MemoryError):
      return "environment", "MemoryError: out of host memory"
    if isinstance(seen, OSError) and seen.errno in _ENVIRONMENT_ERRNOS:
      return "environment", f"OSError: [Errno {seen.errno}] {os.strerror(seen.errno)}"
    text = str(seen)
    code = re.search(r"os_error_code='?(\d+)", text)
    if code and int(code.group(1)) in _ENVIRONMENT_ERRNOS:
      return "environment", f"OSError: [Errno {code.group(1)}] {os.strerror(int(code.group(1)))}"
    if _ENVIRONMENT_TEXT.search(text):
      return "environment", _reason(seen)
    if damage is None and isinstance(seen, _DAMAGE):
      damage = seen  # Orbax raises a bare Exception around TensorStore's ValueError
    seen, depth = seen.__cause__ or seen.__context__, depth + 1
  if damage is not None:
    return "damage", _reason(damage)
  return "other", _reason(e)


def environment_message(step_dir: str, why: str) -> str:
  """The one line for a checkpoint that the environment keeps from being read."""
  return (f"could not read checkpoint {step_dir}: {why}; this is the environment, not the "
          "checkpoint: nothing was moved or skipped; rerun once it is fixed (reading needs "
          "permission, free space and memory)")


def newest_meta(ckpt_dir: str) -> Optional[dict]:
  """The meta of the newest step whose meta reads, or None; reads only, writes nothing."""
  if not fs.isdir(ckpt_dir):
    return None
  root = fs.abspath(ckpt_dir)
  mngr = ocp.CheckpointManager(root, item_handlers=_handlers(root))
  try:
    for step in sorted(mngr.all_steps(), reverse=True):
      try:
        meta = mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
      except _DAMAGE:
        continue  # the run's own resume reports or moves aside damaged steps
      if isinstance(meta, dict):
        return meta
    return None
  finally:
    mngr.close()


def _restore_params_step(mngr: ocp.CheckpointManager, root: str, step: int,
                         sharding: jax.sharding.Sharding) -> tuple[Any, dict]:
  tree = mngr.item_metadata(step)["params"]
  tree = getattr(tree, "tree", tree)
  if tree is None:
    raise CheckpointError(f"checkpoint {root}/{step}: no readable params item")
  abstract = _abstract(tree, sharding)
  out = mngr.restore(step, args=ocp.args.Composite(
      params=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
  if not isinstance(out["meta"], dict):
    raise CheckpointError(f"checkpoint {root}/{step}: meta is a {type(out['meta']).__name__}, "
                          "not a JSON object")
  # Which step was read (a live workdir moves on; an import's meta has no "step").
  return out["params"], {**out["meta"], RESTORED_STEP: step}


def _abstract(tree: Any, sharding: jax.sharding.Sharding) -> Any:
  """A stored item's metadata tree as arrays to restore onto `sharding`."""
  return jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=sharding),
                      tree, is_leaf=lambda m: hasattr(m, "shape"))


def _reason(e: BaseException) -> str:
  """An exception as a short single line for a warning or an error."""
  if isinstance(e, CheckpointError):
    text = str(e).rpartition(": ")[2]
  elif isinstance(e, KeyError):
    text = f"missing item: {e.args[0] if e.args else e}"
  else:
    text = f"{type(e).__name__}: {e}"
  text = " ".join(text.split())
  return text if len(text) <= 160 else text[:157] + "..."


def save_params(directory: str, step: int, params: Any, meta: dict,
                this_process_only: bool = False) -> str:
  """Writes `<directory>/checkpoints/<step>/` with only params and meta, synchronously.

  For checkpoints that do not come from training (e.g. imported weights):
  there is no optimizer state, so `restore_params` reads them but training
  cannot resume from them. `this_process_only`: host (numpy) params written by
  this process alone, with no barrier with the others (a multi-process
  fine-tuning's process 0). Returns the step folder.
  """
  root = opened(fs.abspath(directory)).checkpoints
  me = jax.process_index()
  alone = (ocp.options.MultiprocessingOptions(primary_host=me, active_processes={me})
           if this_process_only and jax.process_count() > 1
           else ocp.options.MultiprocessingOptions())
  fs.makedirs(root)  # Orbax's create=True refuses active_processes
  options = ocp.CheckpointManagerOptions(enable_async_checkpointing=False, create=False,
                                         multiprocessing_options=alone)
  mngr = ocp.CheckpointManager(root, options=options, item_handlers=_handlers(root))
  try:
    mngr.save(step, force=True, args=ocp.args.Composite(
        params=ocp.args.StandardSave(params), meta=ocp.args.JsonSave(meta)))
    mngr.wait_until_finished()
  finally:
    mngr.close()
  return fs.join(root, str(step))
