"""Splash attention (`attention_kernel='splash'`, model/splash.py) against the model's
reference attention (`einsum`), in Pallas' interpret mode on CPU: padded rows, packed
rows of 1-5 documents, sliding windows, a fully padded row; forward and gradients, in
float32 and bf16; both model families; and the train step on 8 devices (shard_map).

Tolerances: float32 1e-5 (the kernel's online softmax sums in another order); bf16
2e-2 relative to the output's scale (bf16 keeps 8 bits of mantissa; the two cores
round the probabilities at different points)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.model import build, precision, splash
from bert_jax.settings.model import ModelConfig

B, L, H, K = 2, 128, 2, 16


def _qkv(dtype, seed=0):
  keys = jax.random.split(jax.random.key(seed), 3)
  return [jax.random.normal(k, (B, L, H, K), jnp.float32).astype(dtype) * 0.5 for k in keys]


def _rows(kind: str):
  """(mask [B, L], documents [B, L] or None) of a row shape."""
  mask = np.ones((B, L), np.int32)
  docs = None
  if kind == "padded":
    mask[0, 100:] = 0
    mask[1, 7:] = 0
  elif kind == "fully_padded_row":
    mask[1, :] = 0
  elif kind.startswith("packed"):
    n = int(kind[-1])
    bounds = np.linspace(0, 120, n + 1).astype(int)
    docs = np.zeros((B, L), np.int32)
    for d, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
      docs[:, a:b] = d
    docs[:, 120:] = n - 1
    mask[:, 120:] = 0
  return mask, docs


@pytest.mark.parametrize("kind", ["padded", "fully_padded_row", "packed1", "packed3",
                                  "packed5"])
@pytest.mark.parametrize("window", [None, 8])
def test_forward_and_gradients_equal_the_dense_masked_attention_float32(kind, window):
  mask, docs = _rows(kind)
  seg = splash.segment_ids(jnp.asarray(mask), None if docs is None else jnp.asarray(docs))
  q, k, v = _qkv(jnp.float32)
  real = mask.astype(bool)

  def loss(fn, q, k, v):  # real positions only: padding's outputs are nobody's
    return jnp.sum(fn(q, k, v, seg, window) * jnp.asarray(real)[:, :, None, None] * v)
  got = splash.attention(q, k, v, seg, window)
  want = splash.reference(q, k, v, seg, window)
  np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], atol=1e-5)
  g_got = jax.grad(loss, argnums=(1, 2, 3))(splash.attention, q, k, v)
  g_want = jax.grad(loss, argnums=(1, 2, 3))(splash.reference, q, k, v)
  for a, b in zip(g_got, g_want):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4)


def test_bf16_inputs_agree_within_bf16_tolerance():
  mask, docs = _rows("packed3")
  seg = splash.segment_ids(jnp.asarray(mask), jnp.asarray(docs))
  q, k, v = _qkv(jnp.bfloat16)
  got = np.asarray(splash.attention(q, k, v, seg, 8).astype(jnp.float32))
  want = np.asarray(splash.reference(q, k, v, seg, 8))
  real = mask.astype(bool)
  scale = np.abs(want[real]).max()
  assert np.abs(got[real] - want[real]).max() / scale < 2e-2


@pytest.mark.parametrize("family_name", ["bert", "modernbert"])
def test_a_model_with_splash_equals_it_with_einsum_on_padded_and_packed_rows(family_name):
  extra = ({"local_attention": 16, "global_attn_every_n_layers": 2, "layer_norm_eps": 1e-5}
           if family_name == "modernbert" else {})
  c = ModelConfig(vocab_size=64, family=family_name, hidden_size=32, num_layers=3, num_heads=2,
                 intermediate_size=48, max_position_embeddings=L, dropout_rate=0.0,
                 attention_dropout_rate=0.0, **extra)
  params = build.init_params(c, jax.random.key(0))
  rng = np.random.default_rng(0)
  for kind in ("padded", "packed3"):
    mask, docs = _rows(kind)
    ids = (rng.integers(5, 64, (B, L)) * mask).astype(np.int32)
    args = (jnp.asarray(ids), jnp.zeros((B, L), jnp.int32), jnp.asarray(mask),
            jnp.zeros((B, 4), jnp.int32))
    kw = {"documents_BxL": None if docs is None else jnp.asarray(docs)}
    outs = [build.pretraining_model(dataclasses.replace(c, attention_kernel=kernel)).apply(
        {"params": params}, *args, **kw).encoder.sequence_BxLxD
            for kernel in ("einsum", "splash")]
    real = mask.astype(bool)
    np.testing.assert_allclose(np.asarray(outs[1])[real], np.asarray(outs[0])[real],
                               atol=2e-5, err_msg=kind)


def test_attention_dropout_with_splash_is_one_line():
  from bert_jax.errors import ConfigError
  with pytest.raises(ConfigError) as e:
    ModelConfig(vocab_size=8, hidden_size=32, num_heads=2, attention_kernel="splash",
               attention_dropout_rate=0.1).validate()
  assert "attention_dropout_rate" in str(e.value) and "\n" not in str(e.value)


def test_block_sizes_per_length():
  assert [splash.block_size(n) for n in (128, 512, 2048, 8192)] == [128, 512, 512, 512]


@pytest.mark.slow
@pytest.mark.parametrize("family_name", ["bert", "modernbert"])
def test_a_packed_run_on_8_devices_with_splash_equals_it_with_einsum(tmp_path, family_name):
  """The whole train step, sharded over 8 simulated devices (splash through shard_map,
  batch on 'data'), packed rows: every train row's loss equals the einsum run's."""
  import json
  import os
  import soak_kill
  from bert_jax.trainer import train_and_evaluate
  extra = {"objective": "mlm", "data.packing": True, "model.attention_dropout_rate": 0.0,
           "model.family": family_name, "model.num_layers": 2, "train.seq_lens": (128,),
           "train.max_predictions": (20,), "model.max_position_embeddings": 128}
  if family_name == "modernbert":
    extra.update({"model.local_attention": 8, "model.global_attn_every_n_layers": 2})
  rows = {}
  for kernel in ("einsum", "splash"):
    workdir = str(tmp_path / kernel)
    train_and_evaluate(soak_kill.tiny_config(str(tmp_path / "prepared"), 6, **extra, **{
        "model.attention_kernel": kernel}), workdir)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      rows[kernel] = {r["step"]: r["loss"] for r in map(json.loads, f) if r["split"] == "train"}
  assert sorted(rows["splash"]) == sorted(rows["einsum"]) == list(range(1, 7))
  np.testing.assert_allclose([rows["splash"][s] for s in range(1, 7)],
                             [rows["einsum"][s] for s in range(1, 7)], rtol=1e-4)


def test_splash_with_a_length_that_is_not_a_multiple_of_128_is_refused_before_any_work():
  import tiny_run
  from bert_jax import settings
  from bert_jax.errors import ConfigError
  config = tiny_run.config(**{"model.attention_kernel": "splash",
                              "model.attention_dropout_rate": 0.0})
  with pytest.raises(ConfigError) as e:
    settings.from_config(config)
  assert "--config.train.seq_lens" in str(e.value) and "128" in str(e.value)


@pytest.mark.parametrize("platform, dropout, lens, want", [
    ("tpu", 0.0, (128, 512), "splash"),  # the longest phase decides
    ("tpu", 0.0, (128, 256), "einsum"),  # splash pays in memory from 512 (plan_kernels.md)
    ("tpu", 0.1, (128, 512), "einsum"),  # the reference BERT's attention dropout
    ("tpu", 0.0, (128, 640, 200), "einsum"),  # a length splash's 128-wide tiles do not divide
    ("cpu", 0.0, (128, 512), "einsum"),
    ("gpu", 0.0, (128, 512), "einsum")])
def test_auto_is_splash_on_a_tpu_where_it_applies_and_einsum_elsewhere(platform, dropout,
                                                                       lens, want):
  assert precision.resolve_attention_kernel("auto", dropout, lens, platform) == want
  assert precision.resolve_attention_kernel("jax", dropout, lens, platform) == "jax"  # as asked


def test_auto_resolves_for_this_host_and_again_for_the_tpu_a_plan_compiles_for():
  import tiny_run
  from bert_jax import settings
  from bert_jax.planner import plan as plan_lib
  s = settings.from_config(tiny_run.config(**{
      "model.attention_kernel": "auto", "model.attention_dropout_rate": 0.0,
      "train.seq_lens": (512,), "train.max_predictions": (20,),
      "model.max_position_embeddings": 512}))
  assert (s.model.attention_kernel, s.requested_attention_kernel) == ("einsum", "auto")
  assert plan_lib.for_platform(s, "tpu").model.attention_kernel == "splash"
  assert plan_lib.for_platform(s, "cpu").model.attention_kernel == "einsum"
