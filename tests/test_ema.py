"""Issue 57: a moving average of the parameters during a stage (`train.phase_ema`): each
phase's average restarts at its first step and follows ema = d * ema + (1 - d) * params
inside it (the closed form, at every step of a three-phase optimizer built from the
settings), goes on through an Adam reset, is absent (the optimizer state unchanged)
when not asked for, and is read back by `merge --ema`."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_jax import settings as settings_lib
from bert_jax.errors import ConfigError
from bert_jax.train import optim
import tiny_run

DECAYS = (0.0, 0.5, 0.9)


def _settings(**extra):
  return settings_lib.from_config(tiny_run.config(**{
      "train.num_steps": 12, "train.phase_fractions": (0.25, 0.25, 0.5),
      "train.seq_lens": (16, 16, 32), "train.max_predictions": (3, 3, 5),
      "train.phase_ema": DECAYS, **extra}))


def test_each_phase_averages_from_its_first_step_at_every_step():
  s = _settings()
  assert s.optimizer.ema_spans == ((0, 3, 0.0), (3, 6, 0.5), (6, 12, 0.9))
  tx, _ = optim.make_optimizer(s.optimizer)
  params = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3)}
  state = tx.init(params)
  rng = np.random.default_rng(0)
  ema = None
  for step in range(12):
    grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
    updates, state = tx.update(grads, state, params)
    params = optax.apply_updates(params, updates)
    phase = next(i for i, (a, b, _) in enumerate(s.optimizer.ema_spans) if a <= step < b)
    d = 0.0 if step == s.optimizer.ema_spans[phase][0] else DECAYS[phase]
    ema = jax.tree.map(lambda p: np.asarray(p, np.float64), params) if ema is None or d == 0 \
        else jax.tree.map(lambda e, p: d * e + (1 - d) * np.asarray(p, np.float64), ema, params)
    got = optim.ema_of(state)
    for k in params:
      np.testing.assert_allclose(got[k], ema[k], rtol=1e-6, atol=1e-6, err_msg=f"step {step}")
    if d == 0:  # a restart, or a phase with no average: the parameters themselves
      assert all(np.array_equal(got[k], params[k]) for k in params), step


def test_a_skipped_step_leaves_the_average_as_it_was():
  tx, _ = optim.make_optimizer(_settings().optimizer)
  params = {"w": jnp.ones(3)}
  state = tx.init(params)
  _, after = tx.update({"w": jnp.array([1.0, jnp.nan, 0.0])}, state, params)
  assert np.array_equal(optim.ema_of(after)["w"], optim.ema_of(state)["w"])
  assert int(after.skipped) == 1


def test_an_adam_reset_keeps_the_average_and_the_schedule():
  tx, _ = optim.make_optimizer(_settings().optimizer)
  params = {"w": jnp.ones(3)}
  state = tx.init(params)
  for _ in range(4):
    updates, state = tx.update({"w": jnp.ones(3)}, state, params)
    params = optax.apply_updates(params, updates)
  reset = optim.reset_moments(state, tx.init(params))
  assert np.array_equal(optim.ema_of(reset)["w"], optim.ema_of(state)["w"])
  assert int(reset.inner[-1].count) == int(reset.inner[-2].count) == 4  # average, schedule
  assert int(reset.inner[1].count) == 0 and not np.any(reset.inner[1].mu["w"])  # Adam's


def test_no_phase_ema_keeps_the_optimizer_state_as_it_was():
  tx, _ = optim.make_optimizer(_settings(**{"train.phase_ema": ()}).optimizer)
  state = tx.init({"w": jnp.ones(3)})
  assert optim.ema_of(state) is None
  assert not any(isinstance(s, optim.ParamEmaState) for s in state.inner)


@pytest.mark.parametrize("decays", [(0.9,), (0.0, 1.0, 0.5), (0.0, -0.1, 0.5),
                                    (0.0, True, 0.5), (0.0, "0.9", 0.5)])
def test_a_bad_phase_ema_is_one_line(decays):
  with pytest.raises(ConfigError, match="train.phase_ema") as e:
    _settings(**{"train.phase_ema": decays})
  assert "\n" not in str(e.value)
