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
