"""Optimizer: decay mask, the reference schedule, decoupled weight decay."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from bert_jax.train import optim
from bert_jax.errors import ConfigError
from bert_jax.settings import OptimizerSettings


def test_no_weight_decay_on_layernorm_or_biases():
  params = {"bert": {"layer_0": {"attention_LayerNorm": {"norm": {"scale": 1, "bias": 1}},
                                 "intermediate": {"kernel": 1, "bias": 1}},
                     "embeddings": {"word_embeddings": {"embedding": 1}}},
            "mlm_bias": 1}
  mask = optim.decay_mask(params)
  assert mask["bert"]["layer_0"]["attention_LayerNorm"]["norm"] == {"scale": False, "bias": False}
  assert mask["bert"]["layer_0"]["intermediate"] == {"kernel": True, "bias": False}
  assert mask["bert"]["embeddings"]["word_embeddings"]["embedding"] is True
  assert mask["mlm_bias"] is False  # the reference's output_bias matches "bias" too


def test_schedule_warms_up_then_decays_linearly_to_zero():
  s = optim.bert_schedule(1e-4, warmup_steps=100, num_steps=1000)
  np.testing.assert_allclose([s(0), s(50), s(100), s(550), s(1000)],
                             [0.0, 5e-5, 0.9e-4, 0.45e-4, 0.0], rtol=1e-6, atol=1e-12)


def test_weight_decay_is_decoupled_from_adam_scaling():
  cfg = OptimizerSettings(learning_rate=0.1, warmup_steps=0, num_steps=10**9, weight_decay=0.01)
  tx, _ = optim.make_optimizer(cfg)
  params = {"kernel": jnp.full((3,), 2.0), "bias": jnp.full((3,), 2.0)}
  zero = jax.tree.map(jnp.zeros_like, params)
  updates, _ = tx.update(zero, tx.init(params), params)
  # With zero gradients Adam contributes nothing: only lr * wd * w remains.
  np.testing.assert_allclose(updates["kernel"], -0.1 * 0.01 * 2.0, rtol=1e-6)
  np.testing.assert_allclose(updates["bias"], 0.0)


def test_non_positive_num_steps_is_rejected():
  with pytest.raises(ConfigError, match="num_steps"):
    OptimizerSettings(num_steps=0)


def _two_updates(max_grad_norm):
  """The second update after a large then a small gradient (Adam's moments mix both)."""
  tx, _ = optim.make_optimizer(OptimizerSettings(
      learning_rate=0.1, warmup_steps=0, num_steps=10**9, weight_decay=0.0,
      max_grad_norm=max_grad_norm))
  params = {"kernel": jnp.zeros((3,))}
  state = tx.init(params)
  _, state = tx.update({"kernel": jnp.full((3,), 100.0)}, state, params)
  second, _ = tx.update({"kernel": jnp.array([0.01, -0.02, 0.03])}, state, params)
  return second["kernel"]


def test_max_grad_norm_zero_means_no_clipping():
  ref = optax.adam(0.1, b1=0.9, b2=0.999, eps=1e-6)
  params = {"kernel": jnp.zeros((3,))}
  state = ref.init(params)
  _, state = ref.update({"kernel": jnp.full((3,), 100.0)}, state, params)
  want, _ = ref.update({"kernel": jnp.array([0.01, -0.02, 0.03])}, state, params)
  np.testing.assert_allclose(_two_updates(0.0), want["kernel"], rtol=1e-5)


def test_a_positive_max_grad_norm_clips():
  # The large first gradient is clipped to norm 1, so the small second one weighs more.
  assert not np.allclose(_two_updates(1.0), _two_updates(0.0), rtol=1e-3)
