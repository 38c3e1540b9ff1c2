"""Exact resume in every phase of a multi-phase run, and at its phase boundaries.

A run's data position belongs to the phase it was saved in: a run restored
inside phase p must continue phase p's batches where it stopped, and one
restored at a phase boundary must start the next phase at its first batch.
(The chain in test_faults.py is one phase, and test_train's two-phase run
never resumed, so neither could see a resume that restarted a later phase's
data: see loop.TrainLoop.train.)

Two ways in, both compared with one uninterrupted run of the same config on
every array of every checkpoint (parameters and optimizer state) and every
train row of metrics.jsonl:
- in this process: resume a three-phase run (grad accumulation and FSDP on, so
  neither hides a difference) at a phase boundary and inside a later phase;
- with SIGKILL: `train.py` killed once after each checkpoint of a two- and a
  three-phase run (every phase's inside and every boundary), then run to the end.
"""

import os
import shutil

import pytest

from bert_jax.trainer import train_and_evaluate
import soak_kill

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = {2: 16, 3: 24}  # a checkpoint every 4 steps: inside every phase and at each boundary


@pytest.fixture(scope="module")
def base(tmp_path_factory):
  return tmp_path_factory.mktemp("resume_phases")


@pytest.fixture(scope="module", autouse=True)
def compile_cache(module_compile_cache):  # every test of the module compiles through it
  return module_compile_cache


def _extra(phases):
  # In-process runs and train.py runs must be the same config.
  return {"keep_checkpoints": soak_kill.KEEP_ALL, "train.grad_accum_steps": 2,
          "mesh.param_sharding": "fsdp"} if phases == 3 else {"keep_checkpoints":
                                                              soak_kill.KEEP_ALL}


def _config(base, phases):
  return soak_kill.tiny_config(str(base / "prepared"), STEPS[phases], phases, **_extra(phases))


@pytest.fixture(scope="module")
def references(base):
  """{phases: workdir of the uninterrupted run}."""
  out = {}
  for phases in (3,):  # two phases: tests/test_stages.py, tests/test_packing.py
    out[phases] = str(base / f"reference_{phases}")
    train_and_evaluate(_config(base, phases), out[phases])
  return out


def _checkpoints_inside_and_at_boundaries(phases):
  steps = STEPS[phases]
  bounds = soak_kill.phase_bounds(steps, phases)
  ckpts = list(range(4, steps, 4))
  inside = {i: [c for c in ckpts if a < c < b] for i, (a, b) in enumerate(bounds)}
  boundaries = [b for _, b in bounds[:-1]]
  assert all(inside.values()) and set(boundaries) <= set(ckpts)  # the premise of the tests
  return ckpts


def test_reference_runs_have_the_phases_the_tests_need(references):
  for phases, workdir in references.items():
    _checkpoints_inside_and_at_boundaries(phases)
    assert soak_kill.complete_steps(workdir) == list(range(4, STEPS[phases] + 1, 4))


# A phase boundary (8) and the inside of a later phase (12); the SIGKILL test below resumes
# the same run from every checkpoint, through train.py.
@pytest.mark.parametrize("resume_at", [8, 12])
def test_resume_in_this_process_of_three_phases_is_exact(base, references, resume_at):
  """Restores checkpoint `resume_at` (a copy with every later checkpoint removed)."""
  workdir = str(base / f"resume_3_at_{resume_at}")
  shutil.copytree(references[3], workdir)
  for step in soak_kill.complete_steps(workdir):
    if step > resume_at:
      shutil.rmtree(os.path.join(workdir, "checkpoints", str(step)))
  train_and_evaluate(_config(base, 3), workdir)
  assert soak_kill.differences(references[3], workdir) == [], f"resumed at step {resume_at}"


@pytest.mark.parametrize("phases", [3])
def test_sigkill_after_every_checkpoint_of_every_phase_ends_exact(base, references,
                                                                  compile_cache, killed_run,
                                                                  phases):
  workdir = str(base / f"killed_{phases}")
  args = soak_kill.tiny_args(workdir, str(base / "prepared"), STEPS[phases], phases,
                             **_extra(phases))
  env = soak_kill.subprocess_env(compile_cache)
  # Killed at a random moment shortly after each checkpoint.
  resumed_from, seed = killed_run(args, env, workdir,
                                  _checkpoints_inside_and_at_boundaries(phases))
  last = soak_kill.run_to_end(args, env)
  assert soak_kill.resumed_step(last.stdout) == resumed_from[-1]
  msg = f"seed {seed}: killed with newest checkpoints {resumed_from}"
  # Every phase was resumed inside, every boundary exactly (the kills landed where meant).
  bounds = soak_kill.phase_bounds(STEPS[phases], phases)
  for a, b in bounds:
    assert any(a < r < b for r in resumed_from), msg
  assert {b for _, b in bounds[:-1]} <= set(resumed_from), msg
  assert soak_kill.differences(references[phases], workdir) == [], msg


@pytest.mark.parametrize("step, seq_lens, refused", [
    (10, (16, 24), True),   # inside phase 1, its length changed
    (10, (32, 32), False),  # inside phase 1, only the finished phase 0 changed
    (8, (16, 24), False),   # at the boundary: phase 1 has not started
    (4, (16, 24), False),   # inside phase 0, a later phase changed
    (4, (24, 32), True)])   # inside phase 0, its length changed
def test_a_phase_resumed_inside_keeps_its_length(step, seq_lens, refused, tmp_path):
  """A run stopped inside a phase went on at a changed length from the old length's
  data position, without a word."""
  from bert_jax import settings
  from bert_jax.errors import ConfigError
  from bert_jax.train import resume
  saved = {"phase_fractions": (0.5, 0.5), "seq_lens": (16, 32), "max_predictions": (3, 5),
           "num_steps": 16}
  s = settings.from_config(soak_kill.tiny_config(str(tmp_path), 16, 2, **{
      "train.seq_lens": seq_lens}))
  if not refused:
    resume.check_same_phase(saved, step, s, "run")
    return
  with pytest.raises(ConfigError) as e:
    resume.check_same_phase(saved, step, s, "run")
  assert f"holds a run stopped at step {step}, inside its phase" in str(e.value)
  assert "\n" not in str(e.value)
