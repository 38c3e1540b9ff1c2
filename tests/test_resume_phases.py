"""A run's data position belongs to the phase it was saved in: a run stopped inside a
phase resumes only with that phase's length (one error line otherwise); a finished or
later phase may change.

Exact resume inside every phase and at every boundary, killed with SIGKILL, is
tests/test_stages.py's (a three-stage run with accumulation, FSDP, packing and a
mixture), tests/test_batch_ramp.py's and tests/test_gcs.py's (BERT's two phases, locally
and on a bucket); in this process at a packed run's boundary, tests/test_packing.py's.
"""

import pytest

import soak_kill


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


SAVED = {"phase_fractions": (0.5, 0.5), "seq_lens": (16, 32), "max_predictions": (3, 5),
         "num_steps": 16, "batch_size": 16}


@pytest.mark.parametrize("step, changes, refused", [
    (10, {"train.seq_lens": (32, 32)}, "train.seq_lens"),  # finished phase 0, another length
    (8, {"train.seq_lens": (16, 24)}, None),  # at the boundary: phase 1 not started
    (16, {"train.num_steps": 24}, "phase_fractions"),  # phase 0 would end at 12, not 8
    (16, {"train.num_steps": 24, "train.phase_fractions": (1 / 3, 1 / 3, 1 / 3),  # appended
          "train.seq_lens": (16, 32, 32), "train.max_predictions": (3, 5, 5)}, None),
    (16, {"model.family": "modernbert", "objective": "mlm",
          "train.phase_rope_thetas": (20000.0, 10000.0)}, "train.phase_rope_thetas"),
    (12, {"train.phase_mask_probs": (0.2, 0.15)}, "train.phase_mask_probs"),
    (16, {"train.phase_batch_sizes": (8, 16)}, "train.phase_batch_sizes")])
def test_a_finished_phase_keeps_its_definition_and_a_phase_may_be_appended(
    step, changes, refused, tmp_path):
  """Issue 57: changing a finished stage's definition on resume is one line; appending a
  stage to a finished run, or changing one not started, is allowed."""
  from bert_jax import settings
  from bert_jax.errors import ConfigError
  from bert_jax.train import resume
  phases = len(changes.get("train.seq_lens", SAVED["seq_lens"]))
  s = settings.from_config(soak_kill.tiny_config(
      str(tmp_path), changes.get("train.num_steps", 16), phases, **changes))
  if refused is None:
    resume.check_finished_phases(SAVED, step, s, "run")
    return
  with pytest.raises(ConfigError) as e:
    resume.check_finished_phases(SAVED, step, s, "run")
  assert str(e.value).startswith("--config.") and refused in str(e.value).split(":")[0]
  assert "that finished its phase 0" in str(e.value) and "\n" not in str(e.value)


def test_a_finished_run_of_one_phase_may_grow():
  """A finished run extended past its end (raising num_steps; WSD from its stable phase)."""
  from bert_jax import settings
  from bert_jax.train import resume
  one = {"phase_fractions": (1.0,), "seq_lens": (16,), "max_predictions": (3,),
         "num_steps": 16, "batch_size": 16}
  s = settings.from_config(soak_kill.tiny_config("/tmp", 24, 1, **{
      "train.seq_lens": (16,), "train.max_predictions": (3,)}))
  resume.check_finished_phases(one, 16, s, "run")
