"""The jitted train step: same result on 1 and 8 devices, with accumulation, with FSDP."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import settings
from bert_jax.parallel import sharding
from bert_jax.data.tokenizer import SpecialIds
from bert_jax.errors import ConfigError
from bert_jax.data.pretraining_data import Batch
from bert_jax.trainer import make_steps
from configs import tiny

pytestmark = pytest.mark.slow  # trains or starts processes: the full suite, not the fast tier

VOCAB, L = 200, 32


def _config(**train):
  c = tiny.get_config()
  c.model.hidden_size, c.model.num_heads, c.model.intermediate_size = 32, 2, 64
  c.model.max_position_embeddings = L
  c.train.batch_size = 16
  c.train.warmup_steps = 0
  c.train.seq_lens, c.train.max_predictions = (L,), (5,)
  for k, v in train.items():
    c.train[k] = v
  return c


def _batch(seed=0, batch=16):
  rs = np.random.RandomState(seed)
  ids = rs.randint(5, VOCAB, size=(batch, L)).astype(np.int32)
  ids[:, 0], ids[:, 10], ids[:, 25], ids[:, 26:] = 2, 3, 3, 0
  seg = np.zeros_like(ids)
  seg[:, 11:26] = 1
  return Batch.from_features({
      "input_ids": ids, "segment_ids": seg, "input_mask": (ids != 0).astype(np.int32),
      "next_sentence_label": rs.randint(0, 2, size=batch).astype(np.int32)})


def _steps(config, mesh=None):
  return make_steps(settings.from_config(config), VOCAB, SpecialIds(0, 1, 2, 3, 4), mesh=mesh)


def _run(config, devices, steps=2):
  mesh = sharding.make_mesh(config.mesh.model_parallel, devices=devices)
  t = _steps(config, mesh)
  params, opt = t.init_state()
  step_fn = t.train_step_fn(t.phases[0])
  losses = []
  for s in range(steps):
    params, opt, m = step_fn(params, opt, jnp.int32(s), sharding.global_batch(_batch(s), mesh))
    losses.append(float(m["loss"]))
  return losses, jax.device_get(params)


def _assert_trees_close(a, b, atol):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(x, y, atol=atol, rtol=0)


def test_eight_devices_equal_one_device():
  one = _run(_config(), jax.devices()[:1])
  eight = _run(_config(), jax.devices())
  np.testing.assert_allclose(one[0], eight[0], atol=1e-5)
  _assert_trees_close(one[1], eight[1], atol=1e-5)


def test_gradient_accumulation_equals_one_big_batch():
  c1, c2 = _config(), _config(grad_accum_steps=2)
  for c in (c1, c2):
    c.model.dropout_rate = c.model.attention_dropout_rate = 0.0  # dropout keys differ per micro-batch
  a, b = _run(c1, jax.devices()), _run(c2, jax.devices())
  np.testing.assert_allclose(a[0], b[0], atol=1e-5)
  _assert_trees_close(a[1], b[1], atol=1e-5)


def test_fsdp_parameter_sharding_equals_replicated():
  rep = _run(_config(), jax.devices())
  c = _config()
  c.mesh.param_sharding = "fsdp"
  fsdp = _run(c, jax.devices())
  np.testing.assert_allclose(rep[0], fsdp[0], atol=1e-5)
  _assert_trees_close(rep[1], fsdp[1], atol=1e-5)


def test_fsdp_really_shards_parameters():
  c = _config()
  c.mesh.param_sharding = "fsdp"
  t = _steps(c)
  kernel = t.param_shardings["bert"]["layer_0"]["intermediate"]["kernel"]
  assert kernel.spec[0] == "data"


def test_loss_decreases_on_a_repeated_batch():
  c = _config(learning_rate=1e-3)
  mesh = sharding.make_mesh(1)
  t = _steps(c, mesh)
  params, opt = t.init_state()
  step_fn = t.train_step_fn(t.phases[0])
  batch = sharding.global_batch(_batch(0), mesh)
  first = last = None
  for s in range(30):
    params, opt, m = step_fn(params, opt, jnp.int32(0), batch)  # same mask every step
    first = first if first is not None else float(m["loss"])
    last = float(m["loss"])
  assert last < 0.8 * first


def test_batch_not_divisible_by_devices_is_rejected():
  c = _config()
  c.train.batch_size = 12
  with pytest.raises(ConfigError, match="batch_size=12"):
    _steps(c)
