"""config.train.optimizer='lamb': optax.lamb with the BERT decay mask and schedule."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_jax import settings
from bert_jax.train import optim
from bert_jax.errors import ConfigError
from bert_jax.settings import OptimizerSettings
from configs import tiny


def _params():
  k = iter(jax.random.split(jax.random.key(0), 8))
  return {"dense": {"kernel": jax.random.normal(next(k), (4, 3)),
                    "bias": jax.random.normal(next(k), (3,))},
          "LayerNorm": {"scale": 1 + 0.1 * jax.random.normal(next(k), (3,))},
          "embed": {"embedding": 0.02 * jax.random.normal(next(k), (5, 3))}}


def test_lamb_updates_equal_optax_lamb_with_the_decay_mask():
  s = OptimizerSettings(optimizer="lamb", learning_rate=1e-2, warmup_steps=0, num_steps=10,
                        weight_decay=0.01, max_grad_norm=0.0)
  ours, schedule = optim.make_optimizer(s)
  ref = optax.lamb(schedule, b1=s.b1, b2=s.b2, eps=s.eps, weight_decay=s.weight_decay,
                   mask=optim.decay_mask)
  p_ours = p_ref = _params()
  st_ours, st_ref = ours.init(p_ours), ref.init(p_ref)
  for step in range(4):
    grads = jax.tree.map(lambda x, i=step: jnp.sin(x * (i + 1)) * (i + 1), p_ours)
    u_ours, st_ours = ours.update(grads, st_ours, p_ours)
    u_ref, st_ref = ref.update(grads, st_ref, p_ref)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9),
                 u_ours, u_ref)
    p_ours, p_ref = optax.apply_updates(p_ours, u_ours), optax.apply_updates(p_ref, u_ref)
  # The trust ratio made it LAMB: AdamW's step differs.
  adamw, _ = optim.make_optimizer(OptimizerSettings(
      learning_rate=1e-2, warmup_steps=0, num_steps=10, max_grad_norm=0.0))
  p = _params()
  u_adamw, _ = adamw.update(jax.tree.map(jnp.ones_like, p), adamw.init(p), p)
  u_lamb, _ = ours.update(jax.tree.map(jnp.ones_like, p), ours.init(p), p)
  assert not np.allclose(u_adamw["dense"]["kernel"], u_lamb["dense"]["kernel"])


def test_adamw_state_keeps_its_structure_so_older_checkpoints_still_load():
  s = OptimizerSettings()
  tx, schedule = optim.make_optimizer(s)
  before = optim.skip_nonfinite(optax.chain(
      optax.clip_by_global_norm(s.max_grad_norm), optax.scale_by_adam(s.b1, s.b2, s.eps),
      optax.add_decayed_weights(s.weight_decay, optim.decay_mask),
      optax.scale_by_learning_rate(schedule)))
  p = _params()
  assert jax.tree.structure(tx.init(p)) == jax.tree.structure(before.init(p))


@pytest.mark.parametrize("value", ["LAMB", "adam", ""])
def test_a_bad_optimizer_is_one_line_naming_the_field(value):
  c = tiny.get_config()
  c.train.optimizer = value
  with pytest.raises(ConfigError) as e:
    settings.from_config(c)
  assert "\n" not in str(e.value) and "--config.train.optimizer" in str(e.value)
