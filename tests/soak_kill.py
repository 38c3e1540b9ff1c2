"""Soak test: SIGKILL training at random moments, resume, compare bit for bit.

  python tests/soak_kill.py                 # 20 trials of 3 kills each, 2 phases, ~10-20 min
  python tests/soak_kill.py --trials 5 --kills 2 --phases 3 --seed 7

Each trial trains a tiny BERT on the toy corpus in a fresh workdir with
`train.py`, kills it with SIGKILL at a random moment `--kills` times, reruns it
to the end, and compares every array of every checkpoint (parameters and
optimizer state) and every train row of metrics.jsonl with those of one
uninterrupted reference run. Runs have `--phases` sequence-length phases. Kill moments alternate between "mid-save" (as soon as an Orbax
temporary checkpoint folder appears: in the middle of an asynchronous write)
and "random" (after a random number of newly logged steps plus a random
delay). After every kill the rerun must resume from the newest complete
checkpoint. Prints how many trials ended identical; exits 1 if any did not.
Not part of CI; tests/test_faults.py runs one short trial.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import tiny_run
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOY = os.path.join(ROOT, "data", "corpus.txt")
TMP_MARK = ".orbax-checkpoint-tmp"


# (phase_fractions, seq_lens, max_predictions) of a run with 1, 2 or 3 phases. With
# 16 (2 phases) or 24 steps (3 phases) and a checkpoint every 4 steps, every phase
# has a checkpoint inside it and every phase boundary is a checkpoint.
KEEP_ALL = 1000  # keep_checkpoints for runs whose every checkpoint is compared
PHASES = {1: ((1.0,), (32,), (5,)),
          2: ((0.5, 0.5), (16, 32), (3, 5)),
          3: ((1 / 3, 1 / 3, 1 / 3), (16, 24, 32), (3, 4, 5))}


def tiny_overrides(cache_dir: str, steps: int, phases: int = 1, **extra) -> dict:
  """Config fields of a run of a few seconds that checkpoints every 4 steps."""
  fractions, seq_lens, preds = PHASES[phases]
  return tiny_run.overrides(**{
      "data.cache_dir": cache_dir, "model.num_layers": 1, "train.num_steps": steps,
      "train.phase_fractions": fractions, "train.seq_lens": seq_lens,
      "train.max_predictions": preds, "log_every": 1, "checkpoint_every": 4,
      "eval_every": 1000, "eval_batches": 1,
      "probe.tasks": (), **extra})  # configs/tiny.py's probe is tested on its own


def tiny_args(workdir: str, cache_dir: str, steps: int, phases: int = 1, **extra) -> list[str]:
  """train.py flags for `tiny_overrides`."""
  return (["--config", os.path.join(ROOT, "configs", "tiny.py"), "--workdir", workdir]
          + [f"--config.{k}={v}"
             for k, v in tiny_overrides(cache_dir, steps, phases, **extra).items()])


def tiny_config(cache_dir: str, steps: int, phases: int = 1, **extra):
  """The same run as `tiny_args`, as a config for `train_and_evaluate` in this process."""
  sys.path.insert(0, ROOT)
  from configs import tiny
  config = tiny.get_config()
  config.update_from_flattened_dict(tiny_overrides(cache_dir, steps, phases, **extra))
  return config


def phase_bounds(steps: int, phases: int) -> list[tuple[int, int]]:
  """(start, end) step of each phase of a `tiny_overrides` run (as settings.phases splits)."""
  bounds, start, acc = [], 0, 0.0
  for i, f in enumerate(PHASES[phases][0]):
    acc += f
    end = steps if i == phases - 1 else int(round(acc * steps))
    bounds.append((start, end))
    start = end
  return bounds


def checkpoint_arrays(workdir: str) -> dict[int, dict[str, object]]:
  """Every array of every complete checkpoint: {step: {"params/...": array, ...}}."""
  import jax  # only here: the parent of the runs needs no JAX otherwise
  import orbax.checkpoint as ocp
  reader = ocp.StandardCheckpointer()
  out = {}
  for step in complete_steps(workdir):
    arrays = {}
    for item in ("params", "opt_state"):
      tree = reader.restore(os.path.join(workdir, "checkpoints", str(step), item))
      for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        arrays[item + jax.tree_util.keystr(path)] = jax.device_get(leaf)
    out[step] = arrays
  return out


# Train-row fields that are a function of the computation alone (rates are timings).
EXACT_TRAIN_FIELDS = ("loss", "mlm_loss", "mlm_accuracy", "nsp_loss", "nsp_accuracy",
                      "grad_norm", "learning_rate", "skipped_steps")


def train_rows(workdir: str) -> dict[int, dict[str, float]]:
  """{step: exact fields} of the train rows of metrics.jsonl (the last row of a step wins)."""
  return {int(r["step"]): {k: r[k] for k in EXACT_TRAIN_FIELDS if k in r}
          for r in read_metrics(workdir) if r.get("split") == "train"}


def differences(reference: str, workdir: str) -> list[str]:
  """How `workdir` differs from `reference`: checkpoints (steps, arrays) and train rows."""
  import numpy as np
  diffs = []
  ref, got = checkpoint_arrays(reference), checkpoint_arrays(workdir)
  if sorted(ref) != sorted(got):
    diffs.append(f"checkpoint steps {sorted(got)}, reference {sorted(ref)}")
  for step in sorted(set(ref) & set(got)):
    if sorted(ref[step]) != sorted(got[step]):
      diffs.append(f"step {step}: other arrays")
      continue
    bad = [k for k in ref[step] if not np.array_equal(ref[step][k], got[step][k])]
    if bad:
      diffs.append(f"step {step}: {len(bad)} arrays differ, e.g. {bad[0]}")
  ref_rows, got_rows = train_rows(reference), train_rows(workdir)
  bad_rows = [s for s in sorted(ref_rows) if got_rows.get(s) != ref_rows[s]]
  if bad_rows or sorted(got_rows) != sorted(ref_rows):
    diffs.append(f"train rows differ at steps {bad_rows or sorted(set(got_rows) ^ set(ref_rows))}")
  return diffs


def subprocess_env(compile_cache: Optional[str] = None) -> dict:
  """The caller's environment (device count included); optionally a shared compile cache."""
  env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
  if compile_cache:
    # Reruns then skip XLA compilation (most of a tiny run's time); the cached
    # executables are the ones a fresh compile would produce.
    env.update(JAX_COMPILATION_CACHE_DIR=compile_cache,
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1")
  return env


@contextlib.contextmanager
def in_process_compile_cache(cache_dir: str):
  """JAX's persistent compilation cache in `cache_dir` for this process, restored after.

  The tests' runs compile the same programs again and again; with the cache (and
  `subprocess_env(cache_dir)` for their train.py runs) each is compiled once.
  """
  import jax  # only here: the parent of the runs needs no JAX otherwise
  from jax._src import compilation_cache
  values = {"jax_compilation_cache_dir": cache_dir,
            "jax_persistent_cache_min_compile_time_secs": 0,
            "jax_persistent_cache_min_entry_size_bytes": -1}
  before = {k: getattr(jax.config, k) for k in values}
  for k, v in values.items():
    jax.config.update(k, v)
  compilation_cache.reset_cache()
  try:
    yield cache_dir
  finally:
    for k, v in before.items():
      jax.config.update(k, v)
    compilation_cache.reset_cache()


def complete_steps(workdir: str, bucket: bool = False) -> list[int]:
  """Steps whose checkpoint Orbax committed: the folder renamed into place on a local disk,
  a `commit_success.txt` in it in a bucket (`workdir` is then the server's copy of it)."""
  ckpt = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(ckpt):
    return []
  return sorted(int(n) for n in os.listdir(ckpt) if n.isdigit() and (
      not bucket or os.path.exists(os.path.join(ckpt, n, "commit_success.txt"))))


def tmp_dirs(workdir: str) -> list[str]:
  ckpt = os.path.join(workdir, "checkpoints")
  try:
    return [n for n in os.listdir(ckpt) if TMP_MARK in n]
  except FileNotFoundError:
    return []


def read_metrics(workdir: str) -> list[dict]:
  """The rows of metrics.jsonl (a line cut short by a kill is skipped)."""
  rows = []
  try:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      for line in f:
        try:
          rows.append(json.loads(line))
        except ValueError:
          continue
  except FileNotFoundError:
    pass
  return rows


def logged_steps(workdir: str) -> int:
  """Highest train step in metrics.jsonl (0 if none)."""
  return max([int(r["step"]) for r in read_metrics(workdir) if r.get("split") == "train"],
             default=0)


def wait_for_step(proc: subprocess.Popen, workdir: str, step: int,
                  timeout: float = 300.0) -> None:
  """Until the run has logged train step `step` (or ended)."""
  deadline = time.monotonic() + timeout
  while proc.poll() is None and logged_steps(workdir) < step:
    if time.monotonic() > deadline:
      raise TimeoutError(f"train.py logged no step {step} in {timeout:.0f} s")
    time.sleep(0.005)


def kill_once(start: Callable[[], subprocess.Popen],
              wait: Callable[[subprocess.Popen], None]) -> bool:
  """The one kill -9 of the tests: a run from `start()`, SIGKILLed once `wait(proc)`
  returns (if it is still running); never left behind. Returns whether it was killed."""
  proc = start()
  try:
    wait(proc)
    killed = proc.poll() is None
    if killed:
      proc.send_signal(signal.SIGKILL)
    proc.wait()
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  return killed


def kill_after_steps(start: Callable[[], subprocess.Popen], workdir: str,
                     steps: Sequence[int]) -> None:
  """For each of `steps`: a run from `start()`, SIGKILLed once it has logged that step."""
  for at in steps:
    kill_once(start, lambda proc, at=at: wait_for_step(proc, workdir, at))


def kill_after_checkpoints(start: Callable[[], subprocess.Popen], workdir: str,
                           checkpoints: Sequence[int], rng: random.Random,
                           note: str = "") -> list[int]:
  """For each of `checkpoints`: a run from `start()`, SIGKILLed at a random moment just
  after that checkpoint is complete (each resumes from the one before). Returns the
  newest complete checkpoint after each kill (what the next run resumed from)."""
  def just_after(proc: subprocess.Popen, ckpt: int) -> None:
    while proc.poll() is None and ckpt not in complete_steps(workdir):
      sleep(0.002)
    sleep(rng.uniform(0.0, 0.03))
    assert proc.poll() is None, f"{note}train.py ended before checkpoint {ckpt}"

  newest = []
  for ckpt in checkpoints:
    kill_once(start, lambda proc, ckpt=ckpt: just_after(proc, ckpt))
    newest.append(complete_steps(workdir)[-1])
  return newest


def wait_for_tmp_dir(proc: subprocess.Popen, workdir: str) -> None:
  """Until an Orbax temporary checkpoint folder exists: a save is being written."""
  while proc.poll() is None and not tmp_dirs(workdir):
    time.sleep(0.001)


sleep = time.sleep


@dataclasses.dataclass
class Kill:
  mode: str  # "mid-save" or "random"
  killed: bool  # False if the run ended first
  at_step: int  # highest logged step when killed
  tmp_left: list[str]  # Orbax temporary folders right after the kill
  newest_complete: Optional[int]  # what the rerun must resume from


def run_and_kill(args: list[str], env: dict, workdir: str, mode: str,
                 rng: random.Random) -> Kill:
  """Starts train.py and SIGKILLs it at a moment chosen by `mode`."""
  target = logged_steps(workdir) + rng.randint(1, 6)
  delay = rng.uniform(0.0, 0.3)

  def wait(proc: subprocess.Popen) -> None:
    wait_for_step(proc, workdir, target)
    if mode == "mid-save":
      wait_for_tmp_dir(proc, workdir)
    else:
      time.sleep(delay)
  killed = kill_once(lambda: subprocess.Popen(
      [sys.executable, os.path.join(ROOT, "train.py"), *args], env=env,
      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), wait)
  steps = complete_steps(workdir)
  return Kill(mode, killed, logged_steps(workdir), tmp_dirs(workdir),
              steps[-1] if steps else None)


def run_to_end(args: list[str], env: dict, timeout: float = 600.0) -> subprocess.CompletedProcess:
  proc = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *args], env=env,
                        capture_output=True, text=True, timeout=timeout)
  if proc.returncode != 0:
    raise RuntimeError(f"train.py exited {proc.returncode}: {proc.stderr[-2000:]}")
  return proc


def resumed_step(stdout: str) -> Optional[int]:
  m = re.search(r"resumed from .* at step (\d+)", stdout)
  return int(m.group(1)) if m else None


def trial(workdir: str, cache_dir: str, steps: int, kills: int, env: dict,
          rng: random.Random, phases: int = 1) -> tuple[list[Kill], Optional[int]]:
  """Kills a fresh run `kills` times, then finishes it. Returns the kills and the step
  the finishing run resumed from. Raises AssertionError if a rerun did not resume
  from the newest complete checkpoint."""
  args = tiny_args(workdir, cache_dir, steps, phases, keep_checkpoints=KEEP_ALL)
  done = []
  for i in range(kills):
    k = run_and_kill(args, env, workdir, "mid-save" if i % 2 == 0 else "random", rng)
    done.append(k)
    if not k.killed:
      return done, None
  last = run_to_end(args, env)
  expected = done[-1].newest_complete
  got = resumed_step(last.stdout)
  assert got == expected, f"resumed from step {got}, newest complete checkpoint was {expected}"
  assert not tmp_dirs(workdir), f"temporary checkpoint folders left: {tmp_dirs(workdir)}"
  return done, got


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--trials", type=int, default=20)
  ap.add_argument("--kills", type=int, default=3)
  ap.add_argument("--steps", type=int, default=24)
  ap.add_argument("--phases", type=int, default=2, choices=sorted(PHASES),
                  help="sequence-length phases of the run (kills land in any of them)")
  ap.add_argument("--seed", type=int, default=None)
  ap.add_argument("--workdir", default=None, help="default: a temporary directory, removed")
  opts = ap.parse_args()
  seed = opts.seed if opts.seed is not None else random.randrange(2**31)
  rng = random.Random(seed)
  base = opts.workdir or tempfile.mkdtemp(prefix="soak_kill_")
  os.makedirs(base, exist_ok=True)
  sys.path.insert(0, ROOT)
  cache_dir, compile_cache = os.path.join(base, "prepared"), os.path.join(base, "xla_cache")
  env = subprocess_env(compile_cache)
  print(f"seed {seed}; runs in {base}", flush=True)
  ref_dir = os.path.join(base, "reference")
  shutil.rmtree(ref_dir, ignore_errors=True)
  run_to_end(tiny_args(ref_dir, cache_dir, opts.steps, opts.phases, keep_checkpoints=KEEP_ALL),
             env)
  bounds = phase_bounds(opts.steps, opts.phases)
  in_phase = lambda step: next(i for i, (a, b) in enumerate(bounds) if a <= step < b)
  same = 0
  for t in range(opts.trials):
    wd = os.path.join(base, f"trial_{t}")
    shutil.rmtree(wd, ignore_errors=True)
    try:
      kills, _ = trial(wd, cache_dir, opts.steps, opts.kills, env, rng, opts.phases)
      diffs = differences(ref_dir, wd)
      ok = not diffs
      note = "; ".join(
          f"{k.mode} kill at step {k.at_step} (phase {in_phase(k.at_step)})"
          + (f" (left {k.tmp_left[0]})" if k.tmp_left else "")
          + f" -> resume {k.newest_complete}" for k in kills if k.killed)
      if diffs:
        note += "; " + "; ".join(diffs)
    except (AssertionError, RuntimeError, TimeoutError) as e:
      ok, note = False, f"FAILED: {e}"
    same += ok
    print(f"trial {t + 1}/{opts.trials}: {'identical' if ok else 'DIFFERENT'}; {note}", flush=True)
  print(f"{same}/{opts.trials} trials ended identical to the uninterrupted run (every array "
        f"of every checkpoint and every train row; {opts.phases} phases)")
  if not opts.workdir:
    shutil.rmtree(base, ignore_errors=True)
  return 0 if same == opts.trials else 1


if __name__ == "__main__":
  sys.exit(main())
