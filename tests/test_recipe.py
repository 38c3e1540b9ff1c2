"""A run resumes only with the optimizer and objective it started with."""

import pytest

from bert_jax.errors import CheckpointError
from bert_jax.train.resume import check_same_recipe

OURS = {"train": {"optimizer": "adamw"}, "objective": "mlm+nsp"}


def test_a_checkpoint_from_before_the_fields_counts_as_the_defaults():
  check_same_recipe({"train": {}}, OURS, "ckpt")  # raises nothing


def test_another_optimizer_is_one_line_naming_the_field_and_both_values():
  with pytest.raises(CheckpointError) as e:
    check_same_recipe({"train": {"optimizer": "lamb"}}, OURS, "ckpt")
  msg = str(e.value)
  assert "\n" not in msg and "--config.train.optimizer='adamw'" in msg and "'lamb'" in msg


def test_another_objective_is_one_line_naming_the_field():
  with pytest.raises(CheckpointError, match=r"--config.objective='mlm\+nsp'.*'mlm'"):
    check_same_recipe({"objective": "mlm"}, OURS, "ckpt")
