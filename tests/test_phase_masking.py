"""Masking rates per phase (`train.phase_mask_probs`: a rate, or a linear ramp over the
phase) and evaluation at one fixed rate (`eval.mask_prob`, default 15%), as ModernBERT,
Ettin and mmBERT train at 30% -> 15% -> 5% and report MLM at 15%."""

import pytest

from bert_jax.errors import ConfigError
from bert_jax.settings.train import phases
from bert_jax.trainer import train_and_evaluate
import soak_kill

STEPS = 12


def test_a_ramp_and_a_constant_give_each_step_its_rate():
  ph = phases((0.5, 0.5), (32, 64), (5, 10), 12, 64, mask_probs=((0.3, 0.15), 0.05))
  assert [ph[0].mask_prob_at(s, 0.15) for s in range(0, 6)] == pytest.approx(
      [0.3, 0.27, 0.24, 0.21, 0.18, 0.15])
  assert {ph[1].mask_prob_at(s, 0.15) for s in range(6, 12)} == {0.05}


def test_no_phase_rates_are_the_masking_rate_everywhere():
  ph = phases((0.5, 0.5), (32, 64), (5, 10), 12, 64)
  assert {p.mask_prob_at(s, 0.2) for p in ph for s in range(p.start, p.end)} == {0.2}


@pytest.mark.parametrize("masks", [(0.3,), (0.3, 1.0), ((0.3, 0.1, 0.05), 0.1), (True, 0.1),
                                   ("0.3", 0.1)])
def test_bad_phase_rates_are_one_line(masks):
  with pytest.raises(ConfigError, match="train.phase_mask_probs") as e:
    phases((0.5, 0.5), (32, 64), (5, 10), 12, 64, mask_probs=masks)
  assert "\n" not in str(e.value)


def _run(tmp_path, name, **extra):
  config = soak_kill.tiny_config(str(tmp_path / "prepared"), STEPS, 2, **{
      "eval_every": 6, "eval_batches": 2, **extra})
  train_and_evaluate(config, str(tmp_path / name))
  rows = soak_kill.read_metrics(str(tmp_path / name))
  return ([r for r in rows if r["split"] == "train"], [r for r in rows if r["split"] == "eval"])


@pytest.mark.slow
def test_a_run_asked_to_evaluates_at_its_training_rate(tmp_path):
  # The default, evaluation at 15% whatever the stage trains at, and every step's rate
  # and learning rate in a three-stage run: tests/test_stages.py.
  train, evals = _run(tmp_path, "train_rate", **{"train.phase_mask_probs": ((0.3, 0.15), 0.05),
                                                 "eval.mask_prob": 0.0})
  ph = phases((0.5, 0.5), (16, 32), (3, 5), STEPS, 64, mask_probs=((0.3, 0.15), 0.05))
  for r in train:  # row `step` logs the step that ran as step - 1
    step = r["step"] - 1
    phase = next(p for p in ph if p.start <= step < p.end)
    assert r["mask_prob"] == pytest.approx(phase.mask_prob_at(step, 0.15), abs=1e-6)
  # Each evaluation at the rate of the step it follows: the ramp's end, then 5%.
  assert {e["step"]: round(e["mask_prob"], 6) for e in evals} == {6: 0.15, 12: 0.05}
  assert all(e["mask_prob"] == pytest.approx(e["train_mask_prob"]) for e in evals)


def test_changing_the_rates_of_the_phase_a_run_stopped_in_is_refused_and_a_later_one_is_not(
    tmp_path):
  from bert_jax import settings as settings_lib
  from bert_jax.train.resume import check_same_phase

  def settings(masks):
    c = soak_kill.tiny_config(str(tmp_path), STEPS, 2, **{"train.phase_mask_probs": masks})
    return settings_lib.from_config(c), c.train.to_dict()

  ours, _ = settings(((0.3, 0.2), 0.05))
  _, saved = settings(((0.3, 0.15), 0.05))
  with pytest.raises(ConfigError, match="phase_mask_probs") as e:
    check_same_phase(saved, 3, ours, "w")  # inside phase 0, whose ramp changed
  assert "from 0.3 to 0.15" in str(e.value) and "from 0.3 to 0.2" in str(e.value)
  later, _ = settings(((0.3, 0.15), 0.1))
  check_same_phase(saved, 3, later, "w")  # phase 1 may change: it has not started
