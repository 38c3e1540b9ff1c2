"""BERT encoder and pre-training heads as Flax Linen modules.

The model knows nothing of optimizers or meshes: parameters carry logical axis
names ('vocab', 'embed', 'mlp', 'heads', 'kv', 'length') that
`bert_jax.parallel.sharding` maps onto a device mesh.

Shape legend: B batch, L sequence length, D hidden size, H attention heads,
K head size (D / H), F feed-forward size, P masked positions, V padded vocab, Q query
rows of an attention bias (1: padding alone, broadcast over the queries; L: packed rows,
whose documents differ per query).
"""

import functools
from typing import Optional

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from bert_jax.errors import ConfigError
from bert_jax.model import precision, splash
from bert_jax.settings.model import ModelConfig

@flax.struct.dataclass
class BertOutput:
  sequence_BxLxD: jax.Array  # last layer
  pooled_BxD: jax.Array  # tanh(dense([CLS]))
  hidden_states: Optional[tuple] = None  # embeddings + every layer, if asked


@flax.struct.dataclass
class AttentionMask:
  """What a layer's attention may see: an additive bias [B, 1, 1 or L, L] for the
  'einsum', 'jax' and 'cudnn' cores (padding, and packed rows' documents), or segment
  ids [B, L] for 'splash' (model/splash.py), with a window for sliding-window layers."""
  bias: Optional[jax.Array] = None  # bias_Bx1xQxL
  segments_BxL: Optional[jax.Array] = None
  window: Optional[int] = flax.struct.field(pytree_node=False, default=None)


@flax.struct.dataclass
class PreTrainingOutput:
  mlm_logits_BxPxV: jax.Array  # float32; padded vocab ids get -inf-like logits
  nsp_logits_Bx2: jax.Array  # float32; 0 = IsNext, 1 = NotNext
  encoder: BertOutput


def normal_init(config: ModelConfig, names: tuple):
  # The reference initialises every weight from a normal truncated at 2 stddev.
  return nn.with_logical_partitioning(
      nn.initializers.truncated_normal(config.initializer_range), names)


def zeros_init(names: tuple):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), names)


def ones_init(names: tuple):
  return nn.with_logical_partitioning(nn.initializers.ones_init(), names)


# The six weight-matmul outputs of a layer, named for remat_policy='save_dots'.
MATMUL_OUTPUTS = ("query", "key", "value", "attention_output", "intermediate", "output")


def remat_policy(config: ModelConfig):
  """jax.checkpoint's policy for config.remat_policy (None: save nothing but the inputs)."""
  if config.remat_policy == "save_dots":
    return jax.checkpoint_policies.save_only_these_names(*MATMUL_OUTPUTS)
  return None


def dense_kw(config: ModelConfig, dtype=None) -> dict:
  """dtype/dot_general for nn.Dense and nn.DenseGeneral.

  float32 mode: flax's own dot, unchanged (bit-for-bit the reference path).
  Mixed mode: the layer computes in float32 (the float32 kernel and bias are
  not rounded by flax) while its one dot is bert_jax.model.precision's custom-VJP
  bf16 x bf16 -> f32 dot, so the kernel gradient stays float32; the bias is
  added in float32 and the caller casts the result with `_out`.
  """
  if not config.mixed:
    return {"dtype": config.compute_dtype if dtype is None else dtype}
  return {"dtype": jnp.float32, "dot_general": precision.dot_general_fn(config.compute_dtype)}


def activation_einsum(config: ModelConfig, spec: str, a, b, out_dtype):
  """The model's activation x activation matmuls (attention scores and context)."""
  if config.mixed:
    return precision.einsum(spec, a, b, op_dtype=config.compute_dtype, out_dtype=out_dtype)
  if config.cpu_attention_layout == "canonical" and precision.cpu_layout():
    # XLA:CPU left to itself fuses these [B, L, H, K] dots, with the softmax between
    # them, into one slow library call; in the canonical layout BERT-Base features
    # run 3-5% faster (docs/performance.md, levers). float32 x float32 -> float32.
    return precision.einsum(spec, a, b, op_dtype=jnp.float32, out_dtype=out_dtype)
  return jnp.einsum(spec, a, b, preferred_element_type=out_dtype)


class LayerNorm(nn.Module):
  """LayerNorm computed in float32 (as both references), output in compute dtype; with a
  bias unless `bias=False` (ModernBERT's `norm_bias`). Every family's norm."""
  config: ModelConfig
  bias: bool = True

  @nn.compact
  def __call__(self, x):
    c = self.config
    return nn.LayerNorm(
        epsilon=c.layer_norm_eps, use_bias=self.bias, dtype=c.compute_dtype,
        param_dtype=jnp.float32, scale_init=ones_init(("embed",)), bias_init=zeros_init(("embed",)),
        name="norm")(x.astype(jnp.float32)).astype(c.compute_dtype)


_SQRT_HALF = 0.7071067811865476


def gelu(config: ModelConfig, x):
  if config.gelu_approximate:
    return nn.gelu(x, approximate=True)
  # Exact GELU in the reference BERT's form, x/2 (1 + erf(x/sqrt 2)). jax.nn.gelu's
  # x/2 erfc(-x/sqrt 2) is the same function, but its erfc ran slower on XLA:CPU:
  # BERT-Base features 3.6% slower, training within noise (docs/performance.md, levers).
  return x * 0.5 * (1.0 + jax.lax.erf(x * _SQRT_HALF))


def _mix32(x_u32: jax.Array) -> jax.Array:
  # lowbias32 (C. Wellons): a bijection on uint32 whose output bits each flip
  # with probability ~1/2 when any input bit flips.
  x_u32 = x_u32 ^ (x_u32 >> 16)
  x_u32 = x_u32 * jnp.uint32(0x7FEB352D)
  x_u32 = x_u32 ^ (x_u32 >> 15)
  x_u32 = x_u32 * jnp.uint32(0x846CA68B)
  return x_u32 ^ (x_u32 >> 16)


def hash_bits(key: jax.Array, shape: tuple) -> jax.Array:
  """uint32 words from a counter hash: two lowbias32 rounds keyed by threefry.

  Threefry (20 rounds over two words) costs ~15x the integer work per word,
  and on CPU dropout's random bits were 8-20% of a small model's train step.
  A dropout mask needs independent fair bits, not cryptographic strength.
  Each call draws two 32-bit seeds from `key` with threefry, so masks stay a
  pure function of (key, shape), differ between layers and steps, and do not
  depend on how the array is sharded (the counter is the global element index).
  """
  size = 1
  for d in shape:
    size *= d
  if size >= 2**32:
    raise ValueError(f"hash_bits: {size} elements do not fit a 32-bit counter")
  seed_2 = jax.random.bits(key, (2,), jnp.uint32)
  index = jax.lax.broadcasted_iota(jnp.uint32, shape, len(shape) - 1) if shape else jnp.uint32(0)
  stride = 1
  for axis in range(len(shape) - 2, -1, -1):  # row-major flat index, built per axis
    stride *= shape[axis + 1]
    index = index + jax.lax.broadcasted_iota(jnp.uint32, shape, axis) * jnp.uint32(stride)
  return _mix32(_mix32(index ^ seed_2[0]) ^ seed_2[1])


def impl_bits(impl: str, key: jax.Array, shape: tuple) -> jax.Array:
  """uint32 words from JAX's `impl` generator ('rbg', 'unsafe_rbg': XLA's RngBitGenerator,
  the TPU's hardware generator), keyed by four threefry words of `key`."""
  k = jax.random.wrap_key_data(jax.random.bits(key, (4,), jnp.uint32), impl=impl)
  return jax.random.bits(k, shape, jnp.uint32)


class Dropout(nn.Module):
  """Inverted dropout drawing 16 random bits per element instead of 32.

  Each random 32-bit word is split into two 16-bit draws, so half as many
  words are made. The words come from `hash_bits` (config.model.dropout_rng =
  'hash', the default), from JAX's threefry ('threefry'), or from XLA's
  RngBitGenerator ('rbg', 'unsafe_rbg'); docs/performance.md has the A/B of the first
  two; `python -m bert_jax.plan` compares them compiled for a TPU. The keep
  probability is round((1 - rate) * 2**16) /
  2**16, within 1e-5 of 1 - rate, and kept values are scaled by its exact
  inverse.
  """
  rate: float
  rng: str = "hash"

  @nn.compact
  def __call__(self, x, deterministic: bool):
    if deterministic or self.rate == 0.0:
      return x
    keep_n = int(round((1.0 - self.rate) * 2**16))
    if keep_n >= 2**16:
      return x
    rng = self.make_rng("dropout")
    bits = hash_bits if self.rng == "hash" else (
        lambda k, s: jax.random.bits(k, s, jnp.uint32)) if self.rng == "threefry" else (
        functools.partial(impl_bits, self.rng))
    shape = x.shape
    if shape and shape[-1] % 2 == 0:
      words = bits(rng, shape[:-1] + (shape[-1] // 2,))
      draw = jax.lax.bitcast_convert_type(words, jnp.uint16).reshape(shape)
      keep = draw < jnp.uint16(keep_n)
    else:  # an odd last axis: one word per element, same keep probability
      keep = (bits(rng, shape) >> 16) < jnp.uint32(keep_n)
    scale = jnp.asarray(2**16 / keep_n, x.dtype)
    return jnp.where(keep, x * scale, jnp.zeros((), x.dtype))


class Embeddings(nn.Module):
  config: ModelConfig

  def setup(self):
    c = self.config
    # Looked up in float32, summed and normalised in float32 (LayerNorm returns the
    # compute dtype): a table cast to bf16 before the lookup would get its gradient as a
    # bf16 scatter-add (a frequent token's rows summed in bf16), reduced across devices
    # in bf16 too.
    self.word_embeddings = nn.Embed(
        c.padded_vocab_size, c.hidden_size, dtype=jnp.float32,
        embedding_init=normal_init(c, ("vocab", "embed")))
    self.position_embeddings = nn.Embed(
        c.max_position_embeddings, c.hidden_size, dtype=jnp.float32,
        embedding_init=normal_init(c, ("length", "embed")))
    self.token_type_embeddings = nn.Embed(
        c.type_vocab_size, c.hidden_size, dtype=jnp.float32,
        embedding_init=normal_init(c, (None, "embed")))
    self.LayerNorm = LayerNorm(c)
    self.dropout = Dropout(c.dropout_rate, c.dropout_rng)

  def __call__(self, ids_BxL, segments_BxL, deterministic: bool, positions_BxL=None):
    # Positions 0..L-1 in every row, unless a packed row restarts them per document.
    pos_x = (self.position_embeddings(jnp.arange(ids_BxL.shape[1]))[None]
             if positions_BxL is None else self.position_embeddings(positions_BxL))
    x_BxLxD = (self.word_embeddings(ids_BxL) + pos_x
               + self.token_type_embeddings(segments_BxL))
    return self.dropout(self.LayerNorm(x_BxLxD), deterministic=deterministic)

  def attend(self, x_BxPxD):
    """Logits against the (tied) token embedding table (float32 in mixed mode)."""
    c = self.config
    if not c.mixed:
      return self.word_embeddings.attend(x_BxPxD)
    return precision.einsum("bpd,vd->bpv", x_BxPxD, self.word_embeddings.embedding,
                            op_dtype=c.compute_dtype)


def fused_attention(kernel: str, q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, bias_Bx1xQxL):
  """softmax(q k^T + bias) v by jax.nn.dot_product_attention (q already scaled).

  Scores and softmax in float32 there too, probabilities in v's dtype. 'cudnn' takes a
  padding-only bias [B, 1, 1, L] as key lengths (cuDNN's padding mask, which skips
  padded blocks), so the mask must be a prefix, as bert-jax's right-padded inputs are.
  A bias that varies by query ([B, 1, L, L]: packed rows' documents, a sliding window)
  goes to cuDNN as a boolean mask, which its kernel reads as an additive bias: cuDNN's
  own masks cannot say it (its window is left-only, and the per-document lengths and
  offsets of its packed layout are not in jax.nn.dot_product_attention), so no masked
  block is skipped there.
  """
  if kernel == "jax":
    return jax.nn.dot_product_attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK,
                                        bias=bias_Bx1xQxL.astype(q_BxLxHxK.dtype), scale=1.0,
                                        implementation="xla")
  backend = precision.target_backend()
  if backend != "gpu":
    raise ConfigError(f"config.model.attention_kernel='cudnn' needs an NVIDIA GPU, but this "
                      f"program is compiled for {backend}; expected 'einsum' or 'jax' there")
  if bias_Bx1xQxL.shape[2] != 1:
    return jax.nn.dot_product_attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, scale=1.0,
                                        mask=bias_Bx1xQxL == 0, implementation="cudnn")
  kv_lengths_B = (bias_Bx1xQxL[:, 0, 0, :] == 0).sum(axis=-1).astype(jnp.int32)
  return jax.nn.dot_product_attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, scale=1.0,
                                      key_value_seq_lengths=kv_lengths_B,
                                      implementation="cudnn")


class SelfAttention(nn.Module):
  config: ModelConfig

  @nn.compact
  def __call__(self, x_BxLxD, mask: AttentionMask, deterministic: bool):
    c = self.config
    bias_Bx1xQxL = mask.bias
    head_dim = c.hidden_size // c.num_heads
    cd = c.compute_dtype
    proj = functools.partial(
        nn.DenseGeneral, features=(c.num_heads, head_dim), **dense_kw(c),
        kernel_init=normal_init(c, ("embed", "heads", "kv")),
        bias_init=zeros_init(("heads", "kv")))
    q_BxLxHxK = checkpoint_name(proj(name="query")(x_BxLxD).astype(cd), "query")
    k_BxLxHxK = checkpoint_name(proj(name="key")(x_BxLxD).astype(cd), "key")
    v_BxLxHxK = checkpoint_name(proj(name="value")(x_BxLxD).astype(cd), "value")
    q_BxLxHxK = q_BxLxHxK / jnp.sqrt(head_dim).astype(cd)
    o_BxLxHxK = attention_core(c, q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, mask, deterministic)
    return checkpoint_name(nn.DenseGeneral(
        c.hidden_size, axis=(-2, -1), **dense_kw(c),
        kernel_init=normal_init(c, ("heads", "kv", "embed")),
        bias_init=zeros_init(("embed",)), name="output")(o_BxLxHxK).astype(cd),
        "attention_output")


def attention_core(c: ModelConfig, q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, mask: AttentionMask,
                   deterministic: bool):
  """Every family's attention after its projections (queries already scaled): splash on a
  TPU, a fused kernel ('jax', 'cudnn'), or the einsum core with the standard or deferred
  softmax (`attention_softmax`). Called inside the family's compact attention module,
  whose dropout it is."""
  if c.attention_kernel == "splash":  # no attention dropout (ModelConfig.validate)
    return splash.attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, mask.segments_BxL,
                            mask.window).astype(c.compute_dtype)
  if c.attention_kernel != "einsum":
    return fused_attention(c.attention_kernel, q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, mask.bias)
  return _einsum_attention(c, q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, mask.bias, deterministic)


def _einsum_attention(c: ModelConfig, q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, bias_Bx1xQxL,
                      deterministic: bool):
  cd = c.compute_dtype
  # Scores and softmax in float32, as the reference does.
  s_BxHxLxL = activation_einsum(c, "bqhk,bshk->bhqs", q_BxLxHxK, k_BxLxHxK, jnp.float32)
  drop = Dropout(c.attention_dropout_rate, c.dropout_rng)
  if c.attention_softmax == "standard":
    p_BxHxLxL = jax.nn.softmax(s_BxHxLxL + bias_Bx1xQxL, axis=-1)
    p_BxHxLxL = drop(p_BxHxLxL, deterministic=deterministic).astype(cd)
    return activation_einsum(c, "bhqs,bshk->bqhk", p_BxHxLxL, v_BxLxHxK,
                             None if not c.mixed else cd)
  # 'deferred': softmax(s) @ v == (exp(s - max) @ v) / sum(exp(s - max)), and dropout,
  # a per-element scale, commutes with the per-row division. Dividing the [L, K]
  # context skips a pass over the [L, L] probabilities.
  s_BxHxLxL = s_BxHxLxL + bias_Bx1xQxL
  e_BxHxLxL = jnp.exp(s_BxHxLxL - jax.lax.stop_gradient(s_BxHxLxL.max(-1, keepdims=True)))
  sum_BxHxLx1 = e_BxHxLxL.sum(-1, keepdims=True)
  e_BxHxLxL = drop(e_BxHxLxL, deterministic=deterministic).astype(cd)
  # Divided in the dot's own [B, H, L, K] layout, then moved: on XLA:CPU the core ran
  # about twice as fast this way as divided in [B, L, H, K] (tools/bench_layer_ops.py).
  o_BxHxLxK = activation_einsum(c, "bhqs,bshk->bhqk", e_BxHxLxL, v_BxLxHxK, jnp.float32)
  return (o_BxHxLxK / sum_BxHxLx1).astype(cd).transpose(0, 2, 1, 3)


class TransformerLayer(nn.Module):
  """Post-LayerNorm block: x = LN(x + Attn(x)); x = LN(x + FFN(x))."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x_BxLxD, mask: AttentionMask, deterministic: bool):
    c = self.config
    drop = Dropout(c.dropout_rate, c.dropout_rng)
    a_BxLxD = SelfAttention(c, name="attention")(x_BxLxD, mask, deterministic)
    x_BxLxD = LayerNorm(c, name="attention_LayerNorm")(
        x_BxLxD + drop(a_BxLxD, deterministic=deterministic))
    h_BxLxF = nn.Dense(c.intermediate_size, **dense_kw(c),
                       kernel_init=normal_init(c, ("embed", "mlp")),
                       bias_init=zeros_init(("mlp",)), name="intermediate")(x_BxLxD)
    h_BxLxF = gelu(c, checkpoint_name(h_BxLxF.astype(c.compute_dtype), "intermediate"))
    o_BxLxD = nn.Dense(c.hidden_size, **dense_kw(c),
                       kernel_init=normal_init(c, ("mlp", "embed")),
                       bias_init=zeros_init(("embed",)), name="output")(h_BxLxF)
    o_BxLxD = checkpoint_name(o_BxLxD.astype(c.compute_dtype), "output")
    return LayerNorm(c, name="output_LayerNorm")(
        x_BxLxD + drop(o_BxLxD, deterministic=deterministic))


def packed_layout(documents_BxL, mask_BxL):
  """(attention bias [B, 1, L, L], positions [B, L]) of packed rows: a query attends to
  the real keys of its own document only (block-diagonal), and positions count from
  each document's first token, as in the document's own unpacked row."""
  same_BxLxL = ((documents_BxL[:, :, None] == documents_BxL[:, None, :])
                & (mask_BxL[:, None, :] > 0))
  bias_Bx1xLxL = jnp.where(same_BxLxL, 0.0, -1e9).astype(jnp.float32)[:, None]
  index_L = jnp.arange(documents_BxL.shape[1])
  first_BxL = jnp.concatenate([jnp.ones_like(documents_BxL[:, :1], bool),
                               documents_BxL[:, 1:] != documents_BxL[:, :-1]], axis=1)
  start_BxL = jax.lax.cummax(jnp.where(first_BxL, index_L[None], 0), axis=1)
  return bias_Bx1xLxL, (index_L[None] - start_BxL).astype(jnp.int32)


class BertModel(nn.Module):
  """The encoder: embeddings, `num_layers` Transformer blocks, tanh pooler."""
  config: ModelConfig

  def setup(self):
    c = self.config
    self.embeddings = Embeddings(c)
    layer_cls = (nn.remat(TransformerLayer, static_argnums=(3,), policy=remat_policy(c))
                 if c.remat else TransformerLayer)
    self.layers = [layer_cls(c, name=f"layer_{i}") for i in range(c.num_layers)]
    self.pooler = nn.Dense(c.hidden_size, **dense_kw(c),
                           kernel_init=normal_init(c, ("embed", "mlp")),
                           bias_init=zeros_init(("mlp",)))

  def __call__(self, ids_BxL, segments_BxL, mask_BxL, deterministic: bool = True,
               output_hidden_states: bool = False, documents_BxL=None) -> BertOutput:
    """`documents_BxL` (packed rows, data/packing): each token's document, non-decreasing
    along a row; attention stays inside a document and positions restart at its start.
    The bias below is then [B, 1, L, L] rather than [B, 1, 1, L]; every attention path
    broadcasts it alike ('cudnn' as a mask rather than key lengths)."""
    # Additive attention bias: padded keys get a large negative score.
    bias_Bx1xQxL = jnp.where(mask_BxL[:, None, None, :] > 0, 0.0, -1e9).astype(jnp.float32)
    positions_BxL = None
    if documents_BxL is not None:
      bias_Bx1xQxL, positions_BxL = packed_layout(documents_BxL, mask_BxL)
    attention = (AttentionMask(segments_BxL=splash.segment_ids(mask_BxL, documents_BxL))
                 if self.config.attention_kernel == "splash" else AttentionMask(bias_Bx1xQxL))
    x_BxLxD = self.embeddings(ids_BxL, segments_BxL, deterministic, positions_BxL)
    hidden = [x_BxLxD]
    for layer in self.layers:
      x_BxLxD = layer(x_BxLxD, attention, deterministic)
      hidden.append(x_BxLxD)
    pooled_BxD = jnp.tanh(self.pooler(x_BxLxD[:, 0]).astype(self.config.compute_dtype))
    return BertOutput(x_BxLxD, pooled_BxD,
                      tuple(hidden) if output_hidden_states else None)


class BertForPreTraining(nn.Module):
  """Encoder + MLM head (tied to token embeddings) + NSP head."""
  config: ModelConfig

  def setup(self):
    c = self.config
    self.bert = BertModel(c)
    self.mlm_dense = nn.Dense(c.hidden_size, **dense_kw(c),
                              kernel_init=normal_init(c, ("embed", "mlp")),
                              bias_init=zeros_init(("mlp",)))
    self.mlm_LayerNorm = LayerNorm(c)
    self.mlm_bias = self.param("mlm_bias", zeros_init(("vocab",)), (c.padded_vocab_size,))
    self.nsp = nn.Dense(2, **dense_kw(c, dtype=jnp.float32),
                        kernel_init=normal_init(c, ("embed", None)),
                        bias_init=zeros_init((None,)))

  def __call__(self, ids_BxL, segments_BxL, mask_BxL, positions_BxP,
               deterministic: bool = True, output_hidden_states: bool = False,
               documents_BxL=None) -> PreTrainingOutput:
    c = self.config
    enc = self.bert(ids_BxL, segments_BxL, mask_BxL, deterministic, output_hidden_states,
                    documents_BxL)
    # Gather the masked positions first: the vocabulary projection, the
    # largest matmul, then runs on P rows per sequence instead of L.
    h_BxPxD = jnp.take_along_axis(enc.sequence_BxLxD, positions_BxP[..., None], axis=1)
    h_BxPxD = self.mlm_LayerNorm(gelu(c, self.mlm_dense(h_BxPxD).astype(c.compute_dtype)))
    logits_BxPxV = self.bert.embeddings.attend(h_BxPxD).astype(jnp.float32)
    bias_V = self.mlm_bias
    if c.padded_vocab_size != c.vocab_size:  # padding ids are never predicted
      # Folded into the bias (V values) rather than a select over B*P*V
      # logits, whose backward was a separate pass: ~3% of a small-model step.
      bias_V = bias_V + jnp.where(jnp.arange(c.padded_vocab_size) < c.vocab_size, 0.0, -1e9)
    logits_BxPxV = logits_BxPxV + bias_V
    nsp_Bx2 = self.nsp(enc.pooled_BxD.astype(jnp.float32))
    return PreTrainingOutput(logits_BxPxV, nsp_Bx2, enc)
