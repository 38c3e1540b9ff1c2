"""Model invariants: padding, shapes and sizes, dtypes, config errors."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.errors import ConfigError
from bert_jax.model import precision
from bert_jax.settings.model import ModelConfig
from bert_jax.model.bert import BertForPreTraining, BertModel, gelu

SMALL = ModelConfig(vocab_size=300, hidden_size=32, num_layers=2, num_heads=4,
                   intermediate_size=64, max_position_embeddings=64, vocab_pad_multiple=128)


def _init(config, length=16, model_cls=BertForPreTraining):
  ids = jnp.ones((2, length), jnp.int32)
  args = (ids, ids, ids) + ((jnp.zeros((2, 3), jnp.int32),) if model_cls is BertForPreTraining else ())
  return nn.meta.unbox(model_cls(config).init(jax.random.key(0), *args))["params"]


def _n_params(config):
  ids = jnp.ones((1, 8), jnp.int32)
  shapes = jax.eval_shape(lambda: BertForPreTraining(config).init(
      jax.random.key(0), ids, ids, ids, jnp.zeros((1, 1), jnp.int32)))
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nn.meta.unbox(shapes)))


def test_padding_does_not_change_outputs_at_real_positions():
  params = _init(SMALL, model_cls=BertModel)
  rs = np.random.RandomState(0)
  ids = rs.randint(5, 300, size=(2, 10)).astype(np.int32)
  seg = np.zeros_like(ids)
  seg[:, 5:] = 1
  short = BertModel(SMALL).apply({"params": params}, ids, seg, np.ones_like(ids))
  pad = lambda x, v: np.pad(x, ((0, 0), (0, 6)), constant_values=v)
  padded = BertModel(SMALL).apply({"params": params}, pad(ids, 0), pad(seg, 0), pad(np.ones_like(ids), 0))
  np.testing.assert_allclose(padded.sequence_BxLxD[:, :10], short.sequence_BxLxD, atol=1e-5)
  np.testing.assert_allclose(padded.pooled_BxD, short.pooled_BxD, atol=1e-5)


def test_bert_base_has_110m_parameters():
  # The reference counts ~110M for BERT-Base with a 30,522 word-piece vocab.
  assert abs(_n_params(ModelConfig(vocab_size=30522)) / 110.1e6 - 1) < 0.01


def test_bert_large_has_335m_parameters():
  large = ModelConfig(vocab_size=30522, hidden_size=1024, num_layers=24, num_heads=16,
                     intermediate_size=4096)
  assert abs(_n_params(large) / 335.1e6 - 1) < 0.01


def test_padded_vocabulary_ids_are_never_predicted():
  params = _init(SMALL)
  ids = jnp.full((2, 16), 7, jnp.int32)
  out = BertForPreTraining(SMALL).apply({"params": params}, ids, ids * 0, ids * 0 + 1,
                                        jnp.zeros((2, 3), jnp.int32))
  assert out.mlm_logits_BxPxV.shape == (2, 3, 384)
  assert (out.mlm_logits_BxPxV[..., 300:] < -1e8).all()


def test_bfloat16_compute_keeps_float32_params_and_logits():
  cfg = ModelConfig(**{**SMALL.to_dict(), "dtype": "bfloat16"})
  params = _init(cfg)
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))
  ids = jnp.full((2, 16), 7, jnp.int32)
  out = BertForPreTraining(cfg).apply({"params": params}, ids, ids * 0, ids * 0 + 1,
                                      jnp.zeros((2, 3), jnp.int32))
  assert out.mlm_logits_BxPxV.dtype == jnp.float32
  assert out.encoder.sequence_BxLxD.dtype == jnp.bfloat16


def test_remat_gives_the_same_outputs():
  cfg = ModelConfig(**{**SMALL.to_dict(), "remat": True})
  params = _init(SMALL)
  ids = jnp.arange(32, dtype=jnp.int32).reshape(2, 16) + 5
  pos = jnp.ones((2, 3), jnp.int32)
  a = BertForPreTraining(SMALL).apply({"params": params}, ids, ids * 0, ids * 0 + 1, pos)
  b = BertForPreTraining(cfg).apply({"params": params}, ids, ids * 0, ids * 0 + 1, pos)
  np.testing.assert_allclose(a.mlm_logits_BxPxV, b.mlm_logits_BxPxV, atol=1e-6)


def _saved(config):
  """(names of the named residuals, bytes of all non-argument residuals) of a training grad."""
  from jax._src.ad_checkpoint import saved_residuals  # jax's own print_saved_residuals uses it
  params = _init(config, length=64)
  ids = jnp.arange(128, dtype=jnp.int32).reshape(2, 64) % 290 + 5
  pos = jnp.ones((2, 3), jnp.int32)

  def loss(p):
    out = BertForPreTraining(config).apply({"params": p}, ids, ids * 0, ids * 0 + 1, pos,
                                           deterministic=False,
                                           rngs={"dropout": jax.random.key(1)})
    return jnp.sum(out.mlm_logits_BxPxV[..., :300] ** 2) + jnp.sum(out.nsp_logits_Bx2)
  res = saved_residuals(loss, params)
  names = sorted(w.split("'")[1] for _, w in res if w.startswith("named "))
  nbytes = sum(a.size * a.dtype.itemsize for a, w in res if "argument" not in w)
  return names, nbytes


def test_remat_policies_keep_what_they_name():
  from bert_jax.model.bert import MATMUL_OUTPUTS
  full = ModelConfig(**{**SMALL.to_dict(), "remat": True})
  dots = ModelConfig(**{**full.to_dict(), "remat_policy": "save_dots"})
  _, bytes_none = _saved(SMALL)
  names_full, bytes_full = _saved(full)
  names_dots, bytes_dots = _saved(dots)
  assert names_full == []  # full: only each layer's input
  assert names_dots == sorted(MATMUL_OUTPUTS * SMALL.num_layers)  # the six dots of each layer
  assert bytes_full < bytes_dots < bytes_none  # and the memory sits between the two


@pytest.mark.parametrize("policy", ["full", "save_dots"])
def test_remat_policies_give_the_same_gradients(policy):
  remat = ModelConfig(**{**SMALL.to_dict(), "remat": True, "remat_policy": policy})
  _assert_same_model(SMALL, remat)  # recomputation may sum in another order


def test_hidden_states_cover_embeddings_and_every_layer():
  params = _init(SMALL, model_cls=BertModel)
  ids = jnp.full((2, 16), 7, jnp.int32)
  out = BertModel(SMALL).apply({"params": params}, ids, ids * 0, ids * 0 + 1,
                               output_hidden_states=True)
  assert len(out.hidden_states) == SMALL.num_layers + 1
  np.testing.assert_array_equal(out.hidden_states[-1], out.sequence_BxLxD)


def test_dropout_is_active_only_when_not_deterministic():
  params = _init(SMALL)
  ids = jnp.full((2, 16), 7, jnp.int32)
  args = (ids, ids * 0, ids * 0 + 1, jnp.zeros((2, 3), jnp.int32))
  model = BertForPreTraining(SMALL)
  det = model.apply({"params": params}, *args, deterministic=True)
  d1 = model.apply({"params": params}, *args, deterministic=False, rngs={"dropout": jax.random.key(1)})
  d2 = model.apply({"params": params}, *args, deterministic=False, rngs={"dropout": jax.random.key(2)})
  assert not np.allclose(d1.nsp_logits_Bx2, d2.nsp_logits_Bx2)
  np.testing.assert_array_equal(det.nsp_logits_Bx2,
                                model.apply({"params": params}, *args).nsp_logits_Bx2)


def _attention_dots(config, platform):
  """(lhs batch dims, lhs contracting dims) of every attention dot (4-D x 4-D), forward and gradient."""
  from bert_jax.model import precision
  params = _init(config)
  ids = jnp.arange(32, dtype=jnp.int32).reshape(2, 16) + 5
  pos = jnp.ones((2, 3), jnp.int32)

  def loss(p):
    out = BertForPreTraining(config).apply({"params": p}, ids, ids * 0, ids * 0 + 1, pos)
    return jnp.sum(out.mlm_logits_BxPxV[..., :300] ** 2) + jnp.sum(out.nsp_logits_Bx2)

  with precision.target_platform(platform):
    jaxpr = jax.make_jaxpr(jax.value_and_grad(loss))(params)
  return [(e.params["dimension_numbers"][1][0], e.params["dimension_numbers"][0][0])
          for e in precision.iter_eqns(jaxpr)
          if e.primitive.name == "dot_general" and all(v.aval.ndim == 4 for v in e.invars)]


def test_float32_attention_dots_are_canonical_on_cpu():
  # Batch (and head) axes first, contraction last on the lhs: the layout XLA:CPU's
  # batched dots run fast in, forward and both gradient dots.
  dots = _attention_dots(SMALL, "cpu")
  assert len(dots) == 2 * SMALL.num_layers * 3
  assert all(batch == (0, 1) and contract == (3,) for batch, contract in dots), dots


def test_float32_attention_layout_xla_and_other_platforms_keep_the_plain_einsum():
  xla = ModelConfig(**{**SMALL.to_dict(), "cpu_attention_layout": "xla"})
  for config, platform in ((xla, "cpu"), (SMALL, "tpu")):
    dots = _attention_dots(config, platform)
    assert dots and not all(batch == (0, 1) and contract == (3,) for batch, contract in dots)


def test_cpu_attention_layouts_give_the_same_outputs_and_gradients():
  xla = ModelConfig(**{**SMALL.to_dict(), "cpu_attention_layout": "xla"})
  params = _init(SMALL)
  ids = jnp.arange(32, dtype=jnp.int32).reshape(2, 16) + 5
  mask = jnp.ones((2, 16), jnp.int32).at[1, 12:].set(0)
  pos = jnp.ones((2, 3), jnp.int32)

  def run(config):
    def loss(p):
      out = BertForPreTraining(config).apply({"params": p}, ids, ids * 0, mask, pos)
      return jnp.sum(out.mlm_logits_BxPxV[..., :300] ** 2) + jnp.sum(out.nsp_logits_Bx2), out
    return jax.jit(jax.value_and_grad(loss, has_aux=True))(params)

  (la, a), ga = run(SMALL)
  (lb, b), gb = run(xla)
  np.testing.assert_allclose(a.encoder.sequence_BxLxD, b.encoder.sequence_BxLxD, atol=1e-5)
  np.testing.assert_allclose(la, lb, rtol=1e-5)
  for x, y in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
    np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)


NO_ATTENTION_DROPOUT = ModelConfig(**{**SMALL.to_dict(), "attention_dropout_rate": 0.0})


def _loss_and_grads(config, params, mask):
  ids = jnp.arange(32, dtype=jnp.int32).reshape(2, 16) + 5
  pos = jnp.ones((2, 3), jnp.int32)

  def loss(p):
    out = BertForPreTraining(config).apply({"params": p}, ids, ids * 0, mask, pos,
                                           deterministic=False,
                                           rngs={"dropout": jax.random.key(4)})
    return jnp.sum(out.mlm_logits_BxPxV[..., :300] ** 2) + jnp.sum(out.nsp_logits_Bx2), out
  return jax.jit(jax.value_and_grad(loss, has_aux=True))(params)


def _assert_same_model(config_a, config_b, atol=1e-5, rtol=1e-4):
  """Same parameters, same training-mode outputs and gradients (a padded row included)."""
  params = _init(config_a)
  mask = jnp.ones((2, 16), jnp.int32).at[1, 11:].set(0)
  (la, a), ga = _loss_and_grads(config_a, params, mask)
  (lb, b), gb = _loss_and_grads(config_b, params, mask)
  real = mask[..., None] > 0  # padded positions' outputs are never read
  np.testing.assert_allclose(np.where(real, a.encoder.sequence_BxLxD, 0),
                             np.where(real, b.encoder.sequence_BxLxD, 0), atol=atol)
  np.testing.assert_allclose(la, lb, rtol=rtol)
  for x, y in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
    np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype, atol, rtol", [("float32", 1e-5, 1e-4), ("bfloat16", 2e-2, 5e-2)])
def test_attention_kernel_jax_computes_what_einsum_does(dtype, atol, rtol):
  einsum = ModelConfig(**{**NO_ATTENTION_DROPOUT.to_dict(), "dtype": dtype})
  fused = ModelConfig(**{**einsum.to_dict(), "attention_kernel": "jax"}).validate()
  _assert_same_model(einsum, fused, atol, rtol)


@pytest.mark.parametrize("dtype, atol, rtol", [("float32", 1e-5, 1e-4), ("bfloat16", 2e-2, 5e-2)])
def test_deferred_softmax_computes_what_the_standard_order_does(dtype, atol, rtol):
  # SMALL has attention dropout: its mask must fall on the same positions either way.
  standard = ModelConfig(**{**SMALL.to_dict(), "dtype": dtype, "attention_softmax": "standard"})
  deferred = ModelConfig(**{**standard.to_dict(), "attention_softmax": "deferred"})
  _assert_same_model(standard, deferred, atol, rtol)


GPU = jax.default_backend() == "gpu"


@pytest.mark.skipif(not GPU, reason="needs an NVIDIA GPU (run with JAX_PLATFORMS=cuda)")
def test_attention_kernel_cudnn_on_a_gpu_computes_what_einsum_does():
  einsum = ModelConfig(**{**NO_ATTENTION_DROPOUT.to_dict(), "dtype": "bfloat16"})
  cudnn = ModelConfig(**{**einsum.to_dict(), "attention_kernel": "cudnn"}).validate()
  _assert_same_model(einsum, cudnn, atol=2e-2, rtol=5e-2)


def test_attention_kernel_cudnn_passes_padding_as_key_lengths(monkeypatch):
  # No GPU here: run the model's cuDNN call through the XLA implementation, which takes
  # the same arguments, to check what the model passes (key lengths, scale 1).
  from bert_jax.model import precision
  calls = []
  real = jax.nn.dot_product_attention

  def as_xla(*args, implementation=None, **kwargs):
    calls.append((implementation, sorted(kwargs)))
    return real(*args, implementation="xla", **kwargs)

  monkeypatch.setattr(jax.nn, "dot_product_attention", as_xla)
  monkeypatch.setattr(precision, "target_backend", lambda: "gpu")
  # float32, which cuDNN refuses (ModelConfig.validate) but the XLA stand-in runs: the
  # bf16 dots of a GPU program do not run on XLA:CPU, and the arguments are the same.
  cudnn = ModelConfig(**{**NO_ATTENTION_DROPOUT.to_dict(), "attention_kernel": "cudnn"})
  _assert_same_model(NO_ATTENTION_DROPOUT, cudnn)
  assert calls and all(c == ("cudnn", ["key_value_seq_lengths", "scale"]) for c in calls), calls


def test_attention_kernel_cudnn_off_a_gpu_is_one_config_error():
  cudnn = ModelConfig(**{**NO_ATTENTION_DROPOUT.to_dict(), "attention_kernel": "cudnn",
                        "dtype": "bfloat16"})
  with pytest.raises(ConfigError, match="attention_kernel='cudnn' needs an NVIDIA GPU"):
    _init(cudnn)


@pytest.mark.parametrize("change, field", [
    ({"hidden_size": 30}, "num_heads"),
    ({"num_layers": 0}, "num_layers"),
    ({"dropout_rate": 1.5}, "dropout_rate"),
    ({"dtype": "float64"}, "dtype"),
    ({"dropout_rng": "philox"}, "dropout_rng"),
    ({"cpu_attention_layout": "nhwc"}, "cpu_attention_layout"),
    ({"attention_kernel": "flash"}, "attention_kernel"),
    ({"remat_policy": "minimal"}, "remat_policy"),
    ({"cpu_forward_dots": "mkl"}, "cpu_forward_dots"),
    ({"attention_softmax": "late"}, "attention_softmax"),
    ({"attention_kernel": "jax"}, "attention_dropout_rate"),  # it has no attention dropout
    ({"attention_kernel": "cudnn", "attention_dropout_rate": 0.0}, "bfloat16 or float16"),
    ({"attention_kernel": "cudnn", "attention_dropout_rate": 0.0, "dtype": "bfloat16",
      "num_heads": 8}, "multiple of 8"),  # head size 32 / 8 = 4
])
def test_impossible_model_config_names_the_field(change, field):
  with pytest.raises(ConfigError, match=field):
    ModelConfig(**{**SMALL.to_dict(), **change}).validate()


@pytest.mark.parametrize("rng", ["hash", "threefry", "rbg", "unsafe_rbg"])
def test_dropout_keeps_one_minus_rate_and_preserves_the_mean(rng):
  from bert_jax.model.bert import Dropout
  x = jnp.ones((64, 16, 256), jnp.float32)  # ~262k draws: std of the kept fraction ~6e-4
  y = Dropout(0.1, rng).apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(3)})
  assert abs(float((y > 0).mean()) - 0.9) < 3e-3
  assert abs(float(y.mean()) - 1.0) < 4e-3


def _hash_words(key, shape=(256, 1024)):
  from bert_jax.model.bert import hash_bits
  return np.asarray(jax.jit(hash_bits, static_argnums=1)(key, shape))


def test_hash_bits_are_fair_in_every_bit_position():
  words = _hash_words(jax.random.key(0)).ravel()  # 262k words: std per bit ~1e-3
  ones = ((words[:, None] >> np.arange(32, dtype=np.uint32)) & 1).mean(0)
  assert np.all(np.abs(ones - 0.5) < 0.006), ones


def test_hash_bits_neighbours_and_other_keys_are_uncorrelated():
  a = _hash_words(jax.random.key(0)).astype(np.float64)
  b = _hash_words(jax.random.key(1)).astype(np.float64)
  c = _hash_words(jax.random.fold_in(jax.random.key(0), 1)).astype(np.float64)
  corr = lambda u, v: abs(np.corrcoef(u.ravel(), v.ravel())[0, 1])
  assert corr(a[:, :-1], a[:, 1:]) < 0.01  # next element along a row
  assert corr(a[:-1], a[1:]) < 0.01  # next row
  assert corr(a, b) < 0.01 and corr(a, c) < 0.01
  np.testing.assert_array_equal(a, _hash_words(jax.random.key(0)))  # a function of the key


def test_hash_bits_do_not_depend_on_sharding():
  from jax.sharding import NamedSharding, PartitionSpec as P
  from bert_jax.model.bert import hash_bits
  mesh = jax.make_mesh((8,), ("data",))
  sharded = jax.jit(hash_bits, static_argnums=1,
                    out_shardings=NamedSharding(mesh, P("data", None)))(jax.random.key(5), (64, 96))
  assert len(sharded.sharding.device_set) == 8
  np.testing.assert_array_equal(np.asarray(sharded), _hash_words(jax.random.key(5), (64, 96)))


@pytest.mark.parametrize("dots, dtype, platform, off", [
    ("auto", "float32", "cpu", True),  # faster there: XLA's own dots
    ("auto", "bfloat16", "cpu", False),  # YNNPACK's bf16 dots
    ("eigen", "bfloat16", "cpu", True),
    ("ynnpack", "float32", "cpu", False),
    ("eigen", "float32", "tpu", False),  # XLA:CPU's option only
    ("auto", "float32", "gpu", False),
])
def test_forward_compiler_options_turn_ynnpack_fusions_off_as_chosen(dots, dtype, platform, off):
  with precision.target_platform(platform):
    options = precision.forward_compiler_options(dots, dtype)
  assert options == ({"xla_cpu_experimental_ynn_fusion_type": ""} if off else {})


def test_the_eigen_option_compiles_dots_without_ynnpack_fusions():
  # Guards the option's name and meaning against a jaxlib that changes them.
  x = jnp.ones((64, 64))
  lowered = jax.jit(lambda a, b: jax.nn.gelu(a @ b)).lower(x, x)
  assert "__ynn_fusion" in lowered.compile().as_text()
  with precision.target_platform("cpu"):
    options = precision.forward_compiler_options("eigen", "float32")
  compiled = lowered.compile(options)
  assert "__ynn_fusion" not in compiled.as_text()
  np.testing.assert_allclose(compiled(x, x), jax.nn.gelu(x @ x), rtol=1e-6)


@pytest.mark.parametrize("dtype, tol", [(jnp.float32, 1e-6), (jnp.bfloat16, 1e-2)])
def test_exact_gelu_is_jax_s_exact_gelu_in_value_and_gradient(dtype, tol):
  # The model writes it in the reference BERT's erf form; the tails (x = -12: 1 + erf
  # cancels) and the gradient must still be jax.nn.gelu's, to rounding.
  x = jnp.linspace(-12.0, 12.0, 4001).astype(dtype)
  config = ModelConfig(vocab_size=8, gelu_approximate=False)
  ours, ref = (lambda v: gelu(config, v)), (lambda v: jax.nn.gelu(v, approximate=False))
  for f in (lambda g: g, jax.grad):
    a, b = (np.asarray(jax.vmap(f(g))(x), np.float32) for g in (ours, ref))
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol)
