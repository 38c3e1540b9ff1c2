"""Mixed precision: bf16 operands with float32 accumulation on every matmul, forward and backward."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.model import losses, precision
from bert_jax.errors import ConfigError
from bert_jax.settings.model import ModelConfig
from bert_jax.model.bert import BertForPreTraining, BertModel

pytestmark = pytest.mark.slow  # trains or starts processes: the full suite, not the fast tier

SMALL = dict(vocab_size=300, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
             max_position_embeddings=64, vocab_pad_multiple=128)
F32 = ModelConfig(**SMALL)
MIXED = ModelConfig(**SMALL, dtype="bfloat16")
B, L, P = 2, 16, 3


def _bf16(x):
  return x.astype(jnp.bfloat16).astype(jnp.float32)


def _ref_dot(a, b):
  """The reference bf16 x bf16 -> f32 dot, differentiated by JAX itself."""
  return jax.lax.dot_general(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16),
                             (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)


def _operands(m=24, k=40, n=16):
  ka, kb = jax.random.split(jax.random.key(0))
  return jax.random.normal(ka, (m, k)), jax.random.normal(kb, (k, n))


def _inputs():
  rs = np.random.RandomState(0)
  ids = jnp.asarray(rs.randint(5, 300, (B, L)), jnp.int32)
  pos = jnp.asarray(rs.randint(0, L, (B, P)), jnp.int32)
  labels = jnp.asarray(rs.randint(5, 300, (B, P)), jnp.int32)
  return ids, jnp.zeros_like(ids), jnp.ones_like(ids), pos, labels


def _params(config, model_cls=BertForPreTraining):
  ids, seg, mask, pos, _ = _inputs()
  args = (ids, seg, mask) + ((pos,) if model_cls is BertForPreTraining else ())
  return nn.meta.unbox(model_cls(config).init(jax.random.key(0), *args))["params"]


def _loss_fn(config):
  ids, seg, mask, pos, labels = _inputs()
  model = BertForPreTraining(config)

  def loss(params):
    out = model.apply({"params": params}, ids, seg, mask, pos, deterministic=False,
                      rngs={"dropout": jax.random.key(1)})
    mlm = losses.mlm_sums(out.mlm_logits_BxPxV, labels, jnp.ones((B, P)))
    nsp = losses.nsp_sums(out.nsp_logits_Bx2, jnp.zeros(B, jnp.int32), jnp.ones(B))
    return mlm.loss / (B * P) + nsp.loss / B
  return loss


# --- the custom-VJP dot -------------------------------------------------------


def test_mixed_dot_forward_equals_float32_dot_of_bf16_rounded_operands():
  a, b = _operands()
  y = precision.dot_general(a, b, (((1,), (0,)), ((), ())))
  assert y.dtype == jnp.float32
  np.testing.assert_allclose(y, _bf16(a) @ _bf16(b), rtol=1e-6, atol=1e-5)


def test_mixed_dot_gradients_equal_jax_grad_of_the_reference_bf16_dot():
  a, b = _operands()
  w = jax.random.normal(jax.random.key(2), (24, 16))  # a non-uniform cotangent
  ours = jax.grad(lambda a, b: (precision.dot_general(
      a, b, (((1,), (0,)), ((), ()))) * w).sum(), (0, 1))(a, b)
  ref = jax.grad(lambda a, b: (_ref_dot(a, b) * w).sum(), (0, 1))(a, b)
  for g, r in zip(ours, ref):
    assert g.dtype == jnp.float32
    # JAX's own derivative rounds only the result (to f32); ours also rounds
    # the cotangent to bf16 before the gradient dots: within bf16 tolerance.
    np.testing.assert_allclose(g, r, rtol=2e-2, atol=2e-2 * float(jnp.abs(r).max()))


def test_mixed_einsum_matches_jnp_einsum_on_bf16_rounded_operands_for_attention_specs():
  ka, kb = jax.random.split(jax.random.key(3))
  q, k = jax.random.normal(ka, (2, 8, 4, 16)), jax.random.normal(kb, (2, 8, 4, 16))
  for spec in ("bqhk,bshk->bhqs", "bqhk,bshk->bqhs"):
    np.testing.assert_allclose(precision.einsum(spec, q, k),
                               jnp.einsum(spec, _bf16(q), _bf16(k)), rtol=1e-5, atol=1e-4)


# --- every matmul of the model ----------------------------------------------


def _assert_all_dots_mixed(jaxpr, at_least):
  dots = precision.dot_dtypes(jaxpr)
  assert len(dots) >= at_least
  bad = [d for d in dots if d != ("bfloat16", "bfloat16", "float32")]
  assert not bad, f"{len(bad)} of {len(dots)} dots are not bf16 x bf16 -> f32: {bad[:5]}"


# Per layer Q, K, V, output, 2 FFN, 2 attention einsums; then pooler, MLM dense,
# vocabulary projection, NSP.
N_FORWARD_DOTS = 8 * SMALL["num_layers"] + 4


@pytest.mark.parametrize("remat", [False, True])
def test_every_forward_dot_is_bf16_operands_with_f32_accumulation(remat):
  config = ModelConfig(**SMALL, dtype="bfloat16", remat=remat)
  params = _params(config)
  ids, seg, mask, pos, _ = _inputs()
  fwd = lambda p: BertForPreTraining(config).apply({"params": p}, ids, seg, mask, pos)
  _assert_all_dots_mixed(jax.make_jaxpr(fwd)(params), N_FORWARD_DOTS)


@pytest.mark.parametrize("remat, policy", [(False, "full"), (True, "full"), (True, "save_dots")])
def test_every_dot_of_the_pretraining_gradient_is_bf16_operands_with_f32_accumulation(
    remat, policy):
  config = ModelConfig(**SMALL, dtype="bfloat16", remat=remat, remat_policy=policy)
  jaxpr = jax.make_jaxpr(jax.grad(_loss_fn(config)))(_params(config))
  _assert_all_dots_mixed(jaxpr, 3 * N_FORWARD_DOTS)  # forward + two gradient dots each


def test_parameter_gradients_are_float32():
  grads = jax.jit(jax.grad(_loss_fn(MIXED)))(_params(MIXED))
  leaves = jax.tree.leaves(grads)
  assert leaves and all(g.dtype == jnp.float32 for g in leaves)
  assert all(bool(jnp.isfinite(g).all()) for g in leaves)


def test_float32_mode_has_no_bf16_dot():
  dots = precision.dot_dtypes(jax.make_jaxpr(jax.grad(_loss_fn(F32)))(_params(F32)))
  assert dots and all(d[:2] == ("float32", "float32") for d in dots)


def test_mixed_features_are_within_bf16_tolerance_of_float32():
  params = _params(F32, BertModel)
  ids, seg, mask, _, _ = _inputs()
  a = BertModel(F32).apply({"params": params}, ids, seg, mask)
  b = BertModel(MIXED).apply({"params": params}, ids, seg, mask)
  assert b.sequence_BxLxD.dtype == jnp.bfloat16
  # Post-LN features have unit scale; bf16 has 8 mantissa bits (2^-8 ~ 0.004 relative).
  err = jnp.abs(b.sequence_BxLxD.astype(jnp.float32) - a.sequence_BxLxD)
  assert float(err.max()) < 0.1 and float(err.mean()) < 0.02
  np.testing.assert_allclose(b.pooled_BxD.astype(jnp.float32), a.pooled_BxD, atol=0.05)


# --- dtype resolution ---------------------------------------------------------


@pytest.mark.parametrize("platform, flags, expected", [
    ("tpu", "fpu sse", "bfloat16"),
    ("gpu", "fpu sse", "bfloat16"),
    ("cuda", "", "bfloat16"),
    ("cpu", "fpu avx2 fma", "float32"),
    ("cpu", "fpu avx512f avx512_bf16", "bfloat16"),
    ("cpu", "fpu amx_tile amx_bf16", "bfloat16"),
])
def test_auto_dtype_resolves_by_platform_and_cpu_flags(tmp_path, platform, flags, expected):
  info = tmp_path / "cpuinfo"
  info.write_text(f"processor\t: 0\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n")
  assert precision.resolve_dtype("auto", platform, str(info)) == expected


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_explicit_dtypes_are_returned_unchanged(dtype):
  assert precision.resolve_dtype(dtype, "tpu", "/nonexistent") == dtype


def test_unresolved_auto_dtype_is_rejected_by_the_model_config():
  with pytest.raises(ConfigError, match="resolve_dtype"):
    ModelConfig(**SMALL, dtype="auto").validate()


# --- training -----------------------------------------------------------------


def _synthetic_batch(rs, n, length=32, n_pred=5, noise=0.1):
  """Each sequence repeats one of 64 tokens, 10% of positions replaced by noise.

  A masked token is predictable from its context except where it is noise:
  held-out MLM accuracy plateaus near 0.9 once the model has learnt the task.
  """
  ids = np.repeat(5 + rs.randint(0, 64, (n, 1)), length, 1)
  ids = np.where(rs.rand(n, length) < noise, rs.randint(5, 69, (n, length)), ids)
  pos = np.argsort(rs.rand(n, length), 1)[:, :n_pred]  # n_pred distinct positions
  labels = np.take_along_axis(ids, pos, 1)
  masked = ids.copy()
  np.put_along_axis(masked, pos, 4, 1)  # [MASK]
  return tuple(jnp.asarray(x, jnp.int32) for x in (masked, pos, labels))


def _train_and_eval(config, steps=700, batch=32, seed=0):
  import optax
  model = BertForPreTraining(config)
  ids, pos, _ = _synthetic_batch(np.random.RandomState(0), 2)
  params = nn.meta.unbox(model.init(jax.random.key(seed), ids, ids * 0, ids * 0 + 1, pos))["params"]
  tx = optax.adamw(optax.linear_schedule(0.0, 1e-2, 20), weight_decay=0.01)
  opt = tx.init(params)

  def loss_fn(p, ids, pos, labels, key):
    out = model.apply({"params": p}, ids, ids * 0, ids * 0 + 1, pos, deterministic=False,
                      rngs={"dropout": key})
    return losses.mlm_sums(out.mlm_logits_BxPxV, labels, jnp.ones(labels.shape)).loss / labels.size

  @jax.jit
  def step(p, opt, i, ids, pos, labels):
    g = jax.grad(loss_fn)(p, ids, pos, labels, jax.random.fold_in(jax.random.key(seed), i))
    updates, opt = tx.update(g, opt, p)
    return optax.apply_updates(p, updates), opt

  rs = np.random.RandomState(seed)
  for i in range(steps):
    params, opt = step(params, opt, i, *_synthetic_batch(rs, batch))
  ids, pos, labels = _synthetic_batch(np.random.RandomState(1234), 1024)
  logits = jax.jit(lambda p: model.apply({"params": p}, ids, ids * 0, ids * 0 + 1, pos)
                   .mlm_logits_BxPxV)(params)
  return float((jnp.argmax(logits, -1) == labels).mean())


def test_mixed_training_reaches_the_float32_heldout_mlm_accuracy():
  config = dict(SMALL, num_layers=1, max_position_embeddings=32, num_heads=2)
  f32 = _train_and_eval(ModelConfig(**config))
  mixed = _train_and_eval(ModelConfig(**config, dtype="bfloat16"))
  assert f32 > 0.85, f32  # the task was learnt (best constant guess: ~0.02)
  assert abs(mixed - f32) < 0.01, (f32, mixed)
