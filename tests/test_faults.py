"""Faults during training: signals, kill -9, corrupt checkpoints, full disk, NaN/inf.

One uninterrupted reference run (in this process) is compared with a chain of
`train.py` runs in one workdir, each ended by a different fault:

  1. SIGTERM (twice) at a random step    -> checkpoint of that step, exit 143
  2. SIGKILL while a checkpoint is written -> only an Orbax temporary folder left
  3. writes fail (EFBIG) from its 2nd save -> one `error:` line, exit 2
  4. SIGKILL at a random moment
  5. run to the end                        -> parameters equal the reference's bit for bit

Kill moments are random; the seed is in every failure message.
"""

import dataclasses
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import settings
from bert_jax.data import input_pipeline
from bert_jax.parallel import sharding
from bert_jax.io import checkpointing
from bert_jax.train import optim
from bert_jax.errors import ConfigError, NonFiniteError, Preempted
from bert_jax.storage.retries import StorageError
from bert_jax.data.pretraining_data import Batch
from bert_jax.train.resume import RunCheckpoints, RunState
from bert_jax.train.steps import TrainSteps
from bert_jax.data.tokenizer import Tokenizer
from bert_jax.trainer import make_steps, train_and_evaluate
import soak_kill

pytestmark = pytest.mark.slow  # trains or starts processes: the full suite, not the fast tier

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 20  # checkpoints every 4 steps, keeps 3

# Runs train.py; from the 2nd checkpoint save on, any file write past 64 KiB
# fails with EFBIG, as on a full disk (metrics and TensorBoard files stay smaller;
# a checkpoint's data file does not).
DISK_FULL_DRIVER = """
import resource, runpy, signal, sys
sys.path.insert(0, {root!r})
from bert_jax.io import checkpointing
real, calls = checkpointing.save, []
def save(*args, **kwargs):
  calls.append(1)
  if len(calls) == 2:  # the first save of this run is complete by now
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # fail the write instead of killing
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))
  return real(*args, **kwargs)
checkpointing.save = save
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path({train!r}, run_name="__main__")
"""


@pytest.fixture(scope="module")
def base(tmp_path_factory):
  return tmp_path_factory.mktemp("faults")


@pytest.fixture(scope="module", autouse=True)
def compile_cache(module_compile_cache):  # every test of the module compiles through it
  return module_compile_cache


@pytest.fixture(scope="module")
def reference(base):
  """An uninterrupted run in this process; it also prepares the shared data."""
  workdir = str(base / "reference")
  train_and_evaluate(soak_kill.tiny_config(str(base / "prepared"), STEPS), workdir)
  return workdir


def _config(base, steps=STEPS, **fields):
  c = soak_kill.tiny_config(str(base / "prepared"), steps)
  c.update_from_flattened_dict(fields)
  return c


def _params(workdir):
  params, meta = checkpointing.restore_params(workdir)
  return jax.device_get(params), meta


def _assert_identical(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(x, y)


def _train_losses(workdir):
  return [(r["step"], r["loss"]) for r in soak_kill.read_metrics(workdir) if r["split"] == "train"]


# ----------------------------------------------------------------------------
# The chain of faulted train.py runs


@dataclasses.dataclass
class Launch:
  fault: str
  returncode: int
  stdout: str
  stderr: str
  newest_complete: object  # newest complete checkpoint step after the run ended
  tmp_left: list  # Orbax temporary folders after it ended
  logged: int  # highest logged train step
  exit_after_error: object = None  # seconds from its `error:` line to its exit, if any


def _launch(argv, env, workdir, fault, stop):
  """Starts `argv`, calls `stop(proc)` (which ends it or returns), waits, records."""
  proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
  out, err, error_at = [], [], []

  def read(pipe, lines, is_stderr):
    for line in pipe:
      if is_stderr and "error:" in line and not error_at:
        error_at.append(time.monotonic())
      lines.append(line)

  readers = [threading.Thread(target=read, args=(proc.stdout, out, False), daemon=True),
             threading.Thread(target=read, args=(proc.stderr, err, True), daemon=True)]
  for r in readers:
    r.start()
  try:
    stop(proc)
    proc.wait(timeout=300)
    exited = time.monotonic()
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
    for r in readers:
      r.join(timeout=30)
  steps = soak_kill.complete_steps(workdir)
  return Launch(fault, proc.returncode, "".join(out), "".join(err), steps[-1] if steps else None,
                soak_kill.tmp_dirs(workdir), soak_kill.logged_steps(workdir),
                exited - error_at[0] if error_at else None)


@pytest.fixture(scope="module")
def chain(base, reference, compile_cache):
  seed = random.randrange(2**31)
  rng = random.Random(seed)
  workdir = str(base / "chain")
  args = soak_kill.tiny_args(workdir, str(base / "prepared"), STEPS)
  env = soak_kill.subprocess_env(compile_cache)
  train = [sys.executable, os.path.join(ROOT, "train.py"), *args]
  launches = []

  def sigterm(proc):
    soak_kill.wait_for_step(proc, workdir, rng.randint(2, 6))
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGTERM)  # a second one, while the checkpoint is written

  def sigkill_mid_save(proc):
    soak_kill.wait_for_step(proc, workdir, launches[-1].logged + rng.randint(1, 3))
    soak_kill.wait_for_tmp_dir(proc, workdir)
    proc.send_signal(signal.SIGKILL)

  def sigkill_random(proc):
    soak_kill.wait_for_step(proc, workdir, launches[-1].logged + rng.randint(1, 4))
    soak_kill.sleep(rng.uniform(0.0, 0.3))
    proc.send_signal(signal.SIGKILL)

  launches.append(_launch(train, env, workdir, "sigterm", sigterm))
  launches.append(_launch(train, env, workdir, "sigkill mid-save", sigkill_mid_save))
  driver = DISK_FULL_DRIVER.format(root=ROOT, train=os.path.join(ROOT, "train.py"))
  launches.append(_launch([sys.executable, "-c", driver, *args], env, workdir, "disk full",
                          lambda proc: None))
  restorable_after_disk_full = _params(workdir)[1]["step"]
  launches.append(_launch(train, env, workdir, "sigkill random", sigkill_random))
  launches.append(_launch(train, env, workdir, "none", lambda proc: None))
  return {"seed": seed, "workdir": workdir, "launches": launches,
          "restorable_after_disk_full": restorable_after_disk_full}


def _lines(text, prefix):
  return [l for l in text.splitlines() if l.startswith(prefix)]


def test_sigterm_checkpoints_the_current_step_and_exits_143(chain):
  first = chain["launches"][0]
  msg = f"seed {chain['seed']}: {first}"
  assert first.returncode == 128 + signal.SIGTERM, msg
  lines = _lines(first.stderr, "interrupted:")
  assert len(lines) == 1 and "SIGTERM" in lines[0], msg
  step = int(lines[0].split(" at step ")[1].split(";")[0])
  assert first.newest_complete == step == first.logged, msg  # the very step it stopped at
  assert not first.tmp_left, msg  # waited for the write to finish despite the 2nd signal


def test_sigkill_mid_save_leaves_only_a_temporary_folder(chain):
  killed = chain["launches"][1]
  msg = f"seed {chain['seed']}: {killed}"
  assert killed.returncode == -signal.SIGKILL, msg
  assert killed.tmp_left, msg
  assert all(int(n.split(".")[0]) > killed.newest_complete for n in killed.tmp_left), msg


def test_each_rerun_resumes_from_the_newest_complete_checkpoint(chain):
  launches = chain["launches"]
  for before, after in zip(launches, launches[1:]):
    got = soak_kill.resumed_step(after.stdout)
    assert got == before.newest_complete, (
        f"seed {chain['seed']}: after '{before.fault}' (newest complete "
        f"{before.newest_complete}, temporary {before.tmp_left}) resumed from {got}")


def test_disk_full_is_one_error_line_and_older_checkpoints_restore(chain):
  full = chain["launches"][2]
  msg = f"seed {chain['seed']}: {full}"
  assert full.returncode == 2, msg
  errors = _lines(full.stderr, "error:")
  assert len(errors) == 1, msg
  assert "could not write checkpoint" in errors[0] and "older checkpoints are intact" in errors[0]
  failed = int(errors[0].split("checkpoints/")[1].split(":")[0])
  assert f"{failed}.orbax-checkpoint-tmp" in full.tmp_left, msg  # never listed as a step
  assert chain["restorable_after_disk_full"] == full.newest_complete < failed, msg
  # The failed write's background threads do not keep the process alive, and
  # what they print never follows the error line.
  assert full.exit_after_error is not None and full.exit_after_error < 5, msg
  assert full.stderr.rstrip().splitlines()[-1] == errors[0], msg


def test_finished_chain_equals_the_uninterrupted_run_bit_for_bit(chain, reference):
  last = chain["launches"][-1]
  assert last.returncode == 0 and not last.tmp_left, f"seed {chain['seed']}: {last}"
  a, meta_a = _params(reference)
  b, meta_b = _params(chain["workdir"])
  assert meta_a["step"] == meta_b["step"] == STEPS
  _assert_identical(a, b)


# ----------------------------------------------------------------------------
# Corrupt newest checkpoint


def _corrupt_newest(reference, tmp_path, damage):
  workdir = tmp_path / "work"
  shutil.copytree(reference, workdir)
  newest = max(soak_kill.complete_steps(str(workdir)))
  data = workdir / "checkpoints" / str(newest) / "params" / "ocdbt.process_0" / "d"
  biggest = max(data.iterdir(), key=lambda p: p.stat().st_size)
  damage(biggest)
  return str(workdir), newest


@pytest.mark.parametrize("damage", [
    lambda f: os.truncate(f, f.stat().st_size // 2),
    lambda f: f.unlink(),
], ids=["truncated", "deleted"])
def test_corrupt_newest_checkpoint_falls_back_to_the_previous_one(
    base, reference, tmp_path, capsys, damage):
  workdir, newest = _corrupt_newest(reference, tmp_path, damage)
  previous = soak_kill.complete_steps(workdir)[-2]
  train_and_evaluate(_config(base), workdir)
  err = capsys.readouterr().err
  assert (f"warning: checkpoint {workdir}/checkpoints/{newest} is unreadable" in err
          and f"falling back to step {previous}" in err), err
  assert os.path.isdir(os.path.join(workdir, "checkpoints", f"corrupt-{newest}"))
  # Retrained from `previous`, the step is written again and equals the original.
  _assert_identical(_params(reference)[0], _params(workdir)[0])


# ----------------------------------------------------------------------------
# SIGINT in this process: a second signal during the save, handlers restored


@pytest.fixture(scope="module")
def sigint_run(base, reference):
  workdir = str(base / "sigint")
  before = signal.getsignal(signal.SIGINT)
  real_next, real_save = input_pipeline.TrainIterator.__next__, checkpointing.save
  calls = {"next": 0}

  def next_with_sigint(self):
    calls["next"] += 1
    if calls["next"] == 5:  # while step 5's batch is fetched
      os.kill(os.getpid(), signal.SIGINT)
    return real_next(self)

  def save_with_sigint(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)  # a second Ctrl-C while saving
    return real_save(*args, **kwargs)

  mp = pytest.MonkeyPatch()
  mp.setattr(input_pipeline.TrainIterator, "__next__", next_with_sigint)
  mp.setattr(checkpointing, "save", save_with_sigint)
  try:
    with pytest.raises(Preempted) as e:
      train_and_evaluate(_config(base, checkpoint_every=100), workdir)
  finally:
    mp.undo()
  return {"workdir": workdir, "error": e.value, "before": before,
          "after": signal.getsignal(signal.SIGINT)}


def test_sigint_checkpoints_the_step_it_arrived_at_despite_a_second_one(sigint_run):
  err = sigint_run["error"]
  assert err.signum == signal.SIGINT and err.step == 5
  meta = _params(sigint_run["workdir"])[1]
  assert meta["step"] == 5 and meta["data_position"] == 5


def test_signal_handlers_are_restored_after_training(sigint_run):
  assert sigint_run["after"] is sigint_run["before"]


def test_a_second_run_with_the_same_seed_config_and_devices_logs_identical_losses(
    sigint_run, reference):
  # The SIGINT run is an independent run of the reference's config (until step 5).
  again = _train_losses(sigint_run["workdir"])
  assert [s for s, _ in again] == [1, 2, 3, 4, 5]
  assert again == _train_losses(reference)[:5]


# ----------------------------------------------------------------------------
# NaN / inf


def test_nan_parameters_stop_the_run_after_the_configured_streak(base, reference, tmp_path,
                                                                 monkeypatch):
  real_init = TrainSteps.init_state

  def init_with_nan(self):
    params, opt_state = real_init(self)
    params["nsp"]["bias"] = params["nsp"]["bias"] * jnp.nan
    return params, opt_state

  monkeypatch.setattr(TrainSteps, "init_state", init_with_nan)
  with pytest.raises(NonFiniteError, match="NaN/inf for 3 consecutive steps .*"
                     "max_consecutive_nonfinite=3"):
    train_and_evaluate(_config(base, **{"train.max_consecutive_nonfinite": 3,
                                        "checkpoint_every": 100}), str(tmp_path))
  rows = [r for r in soak_kill.read_metrics(str(tmp_path)) if r["split"] == "train"]
  assert [r["skipped_steps"] for r in rows] == [1.0, 2.0, 3.0]


def _trainer(base, reference):
  """The TrainSteps of the runs here (same programs, so compiled ones are reused)."""
  c = _config(base)
  meta = _params(reference)[1]
  tok = Tokenizer(meta["vocab"], meta["lowercase"])
  return c, make_steps(settings.from_config(c), tok.vocab_size, tok.special_ids())


def test_a_checkpoint_with_nan_parameters_is_never_written(base, reference, tmp_path):
  c, t = _trainer(base, reference)
  params, opt_state = t.init_state()
  params["nsp"]["bias"] = params["nsp"]["bias"] * jnp.nan
  ckpts = RunCheckpoints(str(tmp_path / "checkpoints"), 3, t, {})
  with pytest.raises(NonFiniteError, match="parameters at step 4 are NaN/inf"):
    ckpts.save(RunState(4, 0, params, opt_state), settings.from_config(c).train.phases[0], 0)
  ckpts.abandon()
  assert os.listdir(tmp_path / "checkpoints") == []


def test_a_save_that_fails_while_the_run_stops_on_another_error_marks_that_error_to_exit_at_once(
    base, reference, tmp_path, monkeypatch, capfd):
  # The run stops on one error (a bucket that stopped answering at a log point) while a
  # checkpoint is in flight, and that write fails too: its Orbax threads and abandoned
  # asyncio futures would print tracebacks at the interpreter's end, after the error line
  # (seen on a 2-core host in test_gcs's server-dies test), so the stopping error must end
  # the process at once, as the write's own error does.
  c, t = _trainer(base, reference)
  params, opt_state = t.init_state()
  ckpts = RunCheckpoints(str(tmp_path / "checkpoints"), 3, t, {})
  ckpts.save(RunState(4, 0, params, opt_state), settings.from_config(c).train.phases[0], 0)
  real_wait = ckpts.mngr.wait_until_finished

  def failed_write():
    real_wait()
    raise OSError(28, "No space left on device")
  monkeypatch.setattr(ckpts.mngr, "wait_until_finished", failed_write)
  cause = StorageError("cannot write gs://b/run/goodput/x.json: the storage server did not answer")
  ckpts.abandon(cause)
  assert getattr(cause, "background_failure", False)
  assert "warning: could not write checkpoint" in capfd.readouterr().err
  other = StorageError("a stop with no checkpoint in flight")
  ckpts.abandon(other)
  assert not getattr(other, "background_failure", False)


def test_a_step_with_infinite_loss_changes_nothing_and_is_counted(base, reference):
  c, t = _trainer(base, reference)
  params, opt = t.init_state()
  # Segment B's embedding is inf: batches of segment A only are fine, others are not.
  emb = params["bert"]["embeddings"]["token_type_embeddings"]["embedding"]
  params["bert"]["embeddings"]["token_type_embeddings"]["embedding"] = emb.at[1].set(jnp.inf)
  rs = np.random.RandomState(0)
  ids = rs.randint(5, t.bert_config.vocab_size, size=(16, 32)).astype(np.int32)
  ids[:, 0], ids[:, 31] = 2, 3

  def batch(segment_b):
    segments = np.zeros_like(ids)
    segments[:, 16:] = int(segment_b)
    return sharding.global_batch(Batch.from_features({
        "input_ids": ids, "segment_ids": segments, "input_mask": np.ones_like(ids),
        "next_sentence_label": np.zeros(16, np.int32)}), t.mesh)

  step = t.train_step_fn(dataclasses.replace(t.phases[0], max_predictions=5))
  params, opt, _ = step(params, opt, jnp.int32(0), batch(False))
  before = jax.device_get((params, opt))
  params, opt, m = step(params, opt, jnp.int32(1), batch(True))
  after = jax.device_get((params, opt))
  _assert_identical((before[0], before[1].inner), (after[0], after[1].inner))
  assert float(m["skipped"]) == 1 and int(m["skipped_total"]) == 1
  assert float(m["loss"]) == 0.0  # kept out of the logged averages
  params, opt, m = step(params, opt, jnp.int32(2), batch(False))
  assert float(m["skipped"]) == 0 and int(m["nonfinite_streak"]) == 0
  assert int(m["skipped_total"]) == 1


def test_skip_nonfinite_passes_finite_gradients_through_unchanged():
  inner = optim.optax.adam(0.1)
  tx = optim.skip_nonfinite(inner)
  params = {"w": jnp.arange(3.0)}
  grads = {"w": jnp.array([0.5, -1.0, 2.0])}
  got, state = tx.update(grads, tx.init(params), params, loss=jnp.float32(1.0))
  want, inner_state = inner.update(grads, inner.init(params), params)
  _assert_identical((got, state.inner), (want, inner_state))
  assert int(state.streak) == 0 and int(state.skipped) == 0


def test_zero_max_consecutive_nonfinite_is_a_config_error(base, tmp_path):
  with pytest.raises(ConfigError, match="max_consecutive_nonfinite"):
    train_and_evaluate(_config(base, **{"train.max_consecutive_nonfinite": 0}), str(tmp_path))
