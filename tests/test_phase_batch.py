"""Issue 57: each phase trains at its own global batch (`train.phase_batch_sizes`), its own
budget (`train.phase_steps`, `train.phase_tokens`), and may start with fresh Adam moments
(`train.phase_reset_optimizer`): the settings. The runs (a batch change, a reset, an
appended stage, each killed at every boundary) are tests/test_stages.py's."""


import pytest

import tiny_run
from bert_jax import settings
from bert_jax.errors import ConfigError



def _phases(**extra):
  c = tiny_run.config(**{"train.num_steps": 20, "train.phase_fractions": (0.5, 0.5),
                         "train.seq_lens": (32, 64), "train.max_predictions": (5, 10),
                         **extra})
  return settings.from_config(c).train


def test_each_phase_has_its_batch_and_none_means_the_runs():
  t = _phases(**{"train.phase_batch_sizes": (16, 8)})
  assert [t.batch_of(p) for p in t.phases] == [16, 8] and t.batch_sizes == [16, 8]
  assert t.batch_fields() == [(16, "train.phase_batch_sizes[0]"),
                              (8, "train.phase_batch_sizes[1]")]
  plain = _phases()
  assert [plain.batch_of(p) for p in plain.phases] == [16, 16]
  assert plain.batch_fields() == [(16, "train.batch_size")]


@pytest.mark.parametrize("extra, field", [
    ({"train.phase_batch_sizes": (16,)}, "train.phase_batch_sizes"),
    ({"train.phase_batch_sizes": (16, 0)}, "train.phase_batch_sizes"),
    ({"train.phase_batch_sizes": (16, 6), "data.streams": 4}, "data.streams"),
    ({"train.phase_batch_sizes": (16, 8), "train.batch_ramp.start": 8,
      "train.batch_ramp.steps": 12}, "train.batch_ramp.steps"),
    ({"train.phase_batch_sizes": (8, 16), "train.batch_ramp.start": 8,
      "train.batch_ramp.steps": 4}, "train.batch_ramp.start"),
])
def test_a_bad_phase_batch_is_one_line_naming_the_field(extra, field):
  with pytest.raises(ConfigError, match=f"--config.{field}"):
    _phases(**extra)


# A batch change killed inside each stage and at its boundaries, and the refusal of
# another batch for a stage stopped inside it: tests/test_stages.py.

def test_step_budgets_are_exact_and_num_steps_is_their_sum():
  t = _phases(**{"train.phase_steps": (7, 5), "train.phase_fractions": (0.9, 0.1)})
  assert [(p.start, p.end) for p in t.phases] == [(0, 7), (7, 12)] and t.num_steps == 12


def test_token_budgets_count_rows_times_length_at_each_phases_batch():
  t = _phases(**{"train.phase_tokens": ("5120", "2.56K"), "train.phase_batch_sizes": (16, 8)})
  # 5120 / (16 x 32) = 10 steps; 2560 / (8 x 64) = 5 steps
  assert [(p.start, p.end) for p in t.phases] == [(0, 10), (10, 15)]


@pytest.mark.parametrize("extra, field", [
    ({"train.phase_steps": (5,)}, "train.phase_steps"),
    ({"train.phase_steps": (5, 5), "train.phase_tokens": ("1K", "1K")}, "train.phase_tokens"),
    ({"train.phase_tokens": ("1K", "lots")}, r"train.phase_tokens\[1\]"),
])
def test_a_bad_budget_is_one_line_naming_the_field(extra, field):
  with pytest.raises(ConfigError, match=f"--config.{field}="):
    _phases(**extra)


def test_a_command_lines_num_steps_must_agree_with_the_budgets():
  c = tiny_run.config(**{"train.phase_fractions": (0.5, 0.5), "train.seq_lens": (32, 64),
                         "train.max_predictions": (5, 10), "train.phase_steps": (4, 4),
                         "train.num_steps": 10})
  assert settings.from_config(c).train.num_steps == 8  # a config file's: the budgets decide
  with pytest.raises(ConfigError, match=r"--config.train.num_steps=10: expected 8"):
    settings.from_config(c, explicit=("train.num_steps",))


def test_reset_flags_are_one_per_phase():
  t = _phases(**{"train.phase_reset_optimizer": (False, True)})
  assert [p.reset_optimizer for p in t.phases] == [False, True]
  with pytest.raises(ConfigError, match="--config.train.phase_reset_optimizer="):
    _phases(**{"train.phase_reset_optimizer": (True,)})
