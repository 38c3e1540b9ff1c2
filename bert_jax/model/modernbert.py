"""ModernBERT (answerdotai/ModernBERT, arXiv 2412.13663) as Flax Linen modules, numerically transformers' `ModernBertModel` and `ModernBertForMaskedLM` (eager attention).

`config.model.family='modernbert'`. What differs from BERT (model/bert.py):

- embeddings: token embeddings, LayerNorm, dropout; no position or segment tables;
- pre-norm layers (the first layer's attention norm is the identity), a final norm;
- a fused QKV projection, rotary position embeddings on queries and keys
  (`global_rope_theta` on global layers, `local_rope_theta` on local ones);
- every `global_attn_every_n_layers`-th layer (0, n, 2n, ...) attends globally; the
  others within a sliding window: |query - key| <= local_attention // 2, as
  transformers' eager path defines it;
- a GeGLU MLP: Wi to 2 x intermediate, act(input) * gate, Wo;
- biases only where asked (`attention_bias`, `mlp_bias`, `norm_bias`);
- the MLM head: dense (`classifier_bias`), GELU, LayerNorm, then the decoder tied to
  the token embeddings with its own bias (`decoder_bias`). No NSP head: the family
  trains with objective 'mlm', and its `nsp_logits_Bx2` are zeros.

Packed rows (`documents_BxL`) keep attention inside each document and restart the
rotary positions at its first token, so a document sees what it sees alone (no window
crosses a document). The parameter tree keeps BERT's top-level names: the encoder is
params["bert"] in both families, so features, probes and fine-tuning read either.

Shape legend: B batch, L length, D hidden, H heads, K head size, F intermediate,
P masked positions, V padded vocabulary.
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from bert_jax.model import bert, splash
from bert_jax.model.bert import AttentionMask, BertOutput, Dropout, PreTrainingOutput, dense_kw
from bert_jax.settings.model import ModelConfig

# The weight-matmul outputs of a layer, named for remat_policy='save_dots'.
MATMUL_OUTPUTS = ("qkv", "attention_output", "intermediate", "output")


def _init(std: float, names: tuple):
  # transformers' ModernBERT: normals truncated at initializer_cutoff_factor (2) stds.
  return nn.with_logical_partitioning(nn.initializers.truncated_normal(std), names)


def _stds(c: ModelConfig) -> dict:
  return {"in": c.initializer_range,
          "out": c.initializer_range / math.sqrt(2.0 * c.num_layers),
          "embedding": c.initializer_range}


def Norm(c: ModelConfig, **kwargs) -> nn.Module:  # pylint: disable=invalid-name
  """The family's LayerNorm (model/bert.py), with a bias only when `config.norm_bias`."""
  return bert.LayerNorm(c, bias=c.norm_bias, **kwargs)


def is_global(config: ModelConfig, layer: int) -> bool:
  """Layer `layer` attends globally (transformers: layer_id % every_n == 0)."""
  return layer % config.global_attn_every_n_layers == 0


def rope_cos_sin(positions_BxL, head_dim: int, theta: float):
  """cos and sin [B, L, K] of rotary embeddings at `positions_BxL`, in float32
  (transformers' default rope: inverse frequencies theta^(-2i/K), the angles repeated
  for both halves)."""
  inv_freq_K2 = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  angles_BxLxK2 = positions_BxL.astype(jnp.float32)[..., None] * inv_freq_K2
  angles_BxLxK = jnp.concatenate([angles_BxLxK2, angles_BxLxK2], axis=-1)
  return jnp.cos(angles_BxLxK), jnp.sin(angles_BxLxK)


def apply_rope(x_BxLxHxK, cos_BxLxK, sin_BxLxK):
  """x cos + rotate_half(x) sin, in float32, back in x's dtype."""
  x = x_BxLxHxK.astype(jnp.float32)
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  return (x * cos_BxLxK[:, :, None] + rotated * sin_BxLxK[:, :, None]).astype(x_BxLxHxK.dtype)


def attention_masks(config: ModelConfig, mask_BxL, documents_BxL=None):
  """(global, local) AttentionMasks: segment ids and the window for 'splash', else the
  additive biases of `attention_biases`."""
  if config.attention_kernel == "splash":
    segments_BxL = splash.segment_ids(mask_BxL, documents_BxL)
    return (AttentionMask(segments_BxL=segments_BxL),
            AttentionMask(segments_BxL=segments_BxL, window=config.local_attention // 2))
  global_bias, local_bias = attention_biases(config, mask_BxL, documents_BxL)
  return AttentionMask(global_bias), AttentionMask(local_bias)


def attention_biases(config: ModelConfig, mask_BxL, documents_BxL=None):
  """Additive biases [B, 1, L|1, L] for global and local layers: padded keys masked;
  with `documents_BxL`, keys of other documents masked; local layers also mask keys
  farther than local_attention // 2."""
  if documents_BxL is None:
    keep_Bx1xL = mask_BxL[:, None, :] > 0
  else:
    keep_Bx1xL = ((documents_BxL[:, :, None] == documents_BxL[:, None, :])
                  & (mask_BxL[:, None, :] > 0))
  length = mask_BxL.shape[1]
  index_L = jnp.arange(length)
  near_LxL = jnp.abs(index_L[:, None] - index_L[None, :]) <= config.local_attention // 2
  global_bias = jnp.where(keep_Bx1xL, 0.0, -1e9).astype(jnp.float32)[:, None]
  local_bias = jnp.where(keep_Bx1xL & near_LxL[None], 0.0, -1e9).astype(jnp.float32)[:, None]
  return global_bias, local_bias


class Attention(nn.Module):
  config: ModelConfig
  layer: int

  @nn.compact
  def __call__(self, x_BxLxD, mask: AttentionMask, positions_BxL, deterministic: bool):
    c = self.config
    cd = c.compute_dtype
    head_dim = c.hidden_size // c.num_heads
    std = _stds(c)
    qkv_BxLx3xHxK = nn.DenseGeneral(
        (3, c.num_heads, head_dim), use_bias=c.attention_bias, **dense_kw(c),
        kernel_init=_init(std["in"], ("embed", None, "heads", "kv")),
        bias_init=bert.zeros_init((None, "heads", "kv")), name="Wqkv")(x_BxLxD)
    qkv_BxLx3xHxK = checkpoint_name(qkv_BxLx3xHxK.astype(cd), "qkv")
    q_BxLxHxK, k_BxLxHxK, v_BxLxHxK = (qkv_BxLx3xHxK[:, :, i] for i in range(3))
    theta = c.global_rope_theta if is_global(c, self.layer) else c.local_rope_theta
    cos, sin = rope_cos_sin(positions_BxL, head_dim, theta)
    q_BxLxHxK, k_BxLxHxK = apply_rope(q_BxLxHxK, cos, sin), apply_rope(k_BxLxHxK, cos, sin)
    q_BxLxHxK = q_BxLxHxK * jnp.asarray(head_dim ** -0.5, cd)
    # BERT's core, every kernel and both softmax orders (attention_softmax='deferred'
    # was silently the standard order here before the core was shared).
    o_BxLxHxK = bert.attention_core(c, q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, mask, deterministic)
    o_BxLxD = nn.DenseGeneral(
        c.hidden_size, axis=(-2, -1), use_bias=c.attention_bias, **dense_kw(c),
        kernel_init=_init(std["out"], ("heads", "kv", "embed")),
        bias_init=bert.zeros_init(("embed",)), name="Wo")(o_BxLxHxK.astype(cd))
    o_BxLxD = checkpoint_name(o_BxLxD.astype(cd), "attention_output")
    return Dropout(c.attention_dropout_rate, c.dropout_rng)(o_BxLxD, deterministic=deterministic)


class Mlp(nn.Module):
  """GeGLU: Wo(drop(act(input) * gate)), input and gate the two halves of Wi(x)."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x_BxLxD, deterministic: bool):
    c = self.config
    std = _stds(c)
    h_BxLx2xF = nn.DenseGeneral(
        (2, c.intermediate_size), use_bias=c.mlp_bias, **dense_kw(c),
        kernel_init=_init(std["in"], ("embed", None, "mlp")),
        bias_init=bert.zeros_init((None, "mlp")), name="Wi")(x_BxLxD)
    h_BxLx2xF = checkpoint_name(h_BxLx2xF.astype(c.compute_dtype), "intermediate")
    g_BxLxF = bert.gelu(c, h_BxLx2xF[:, :, 0]) * h_BxLx2xF[:, :, 1]
    g_BxLxF = Dropout(c.dropout_rate, c.dropout_rng)(g_BxLxF, deterministic=deterministic)
    o_BxLxD = nn.Dense(c.hidden_size, use_bias=c.mlp_bias, **dense_kw(c),
                       kernel_init=_init(std["out"], ("mlp", "embed")),
                       bias_init=bert.zeros_init(("embed",)), name="Wo")(g_BxLxF)
    return checkpoint_name(o_BxLxD.astype(c.compute_dtype), "output")


class Layer(nn.Module):
  """Pre-norm block: x += Attn(norm(x)) (no norm in layer 0); x += Mlp(norm(x))."""
  config: ModelConfig
  layer: int

  @nn.compact
  def __call__(self, x_BxLxD, global_mask, local_mask, positions_BxL, deterministic: bool):
    c = self.config
    bias = global_mask if is_global(c, self.layer) else local_mask
    h_BxLxD = x_BxLxD if self.layer == 0 else Norm(c, name="attn_norm")(x_BxLxD)
    x_BxLxD = x_BxLxD + Attention(c, self.layer, name="attn")(h_BxLxD, bias, positions_BxL,
                                                             deterministic)
    return x_BxLxD + Mlp(c, name="mlp")(Norm(c, name="mlp_norm")(x_BxLxD), deterministic)


def remat_policy(config: ModelConfig):
  if config.remat_policy == "save_dots":
    return jax.checkpoint_policies.save_only_these_names(*MATMUL_OUTPUTS)
  return None


class ModernBertModel(nn.Module):
  """The encoder: embeddings and their norm, `num_layers` pre-norm blocks, the final norm.
  `pooled_BxD` is the final [CLS] state (ModernBERT has no tanh pooler)."""
  config: ModelConfig

  def setup(self):
    c = self.config
    self.tok_embeddings = nn.Embed(
        c.padded_vocab_size, c.hidden_size, dtype=jnp.float32,
        embedding_init=_init(_stds(c)["embedding"], ("vocab", "embed")))
    self.embeddings_norm = Norm(c)
    self.embeddings_dropout = Dropout(c.dropout_rate, c.dropout_rng)
    layer_cls = (nn.remat(Layer, static_argnums=(5,), policy=remat_policy(c))
                 if c.remat else Layer)
    self.layers = [layer_cls(c, i, name=f"layer_{i}") for i in range(c.num_layers)]
    self.final_norm = Norm(c)

  def __call__(self, ids_BxL, segments_BxL, mask_BxL, deterministic: bool = True,
               output_hidden_states: bool = False, documents_BxL=None) -> BertOutput:
    del segments_BxL  # no segment embeddings in this family
    global_mask, local_mask = attention_masks(self.config, mask_BxL, documents_BxL)
    if documents_BxL is None:
      positions_BxL = jnp.broadcast_to(jnp.arange(ids_BxL.shape[1]), ids_BxL.shape)
    else:
      _, positions_BxL = bert.packed_layout(documents_BxL, mask_BxL)
    x_BxLxD = self.embeddings_dropout(self.embeddings_norm(self.tok_embeddings(ids_BxL)),
                                      deterministic=deterministic)
    hidden = [x_BxLxD]
    for layer in self.layers:
      x_BxLxD = layer(x_BxLxD, global_mask, local_mask, positions_BxL, deterministic)
      hidden.append(x_BxLxD)
    # hidden_states (features' --layers): the embeddings, each layer's output, and the
    # last one after the final norm, which is the sequence output (last_hidden_state):
    # transformers 5's numbering. 4.x gave the last layer's before the norm; the others
    # are the same in both (docs/feature-extraction.md, Layer numbering).
    x_BxLxD = self.final_norm(x_BxLxD)
    hidden[-1] = x_BxLxD
    return BertOutput(x_BxLxD, x_BxLxD[:, 0], tuple(hidden) if output_hidden_states else None)

  def attend(self, x_BxPxD):
    """Logits against the (tied) token embedding table (float32 in mixed mode)."""
    c = self.config
    if not c.mixed:
      return self.tok_embeddings.attend(x_BxPxD)
    return bert.precision.einsum("bpd,vd->bpv", x_BxPxD, self.tok_embeddings.embedding,
                                 op_dtype=c.compute_dtype)


# The top-level params of the prediction head, which ModernBertForSequenceClassification
# also applies between pooling and its classifier (transformers' `head.*`).
HEAD_PARAMS = ("head_dense", "head_norm")


def prediction_head(c: ModelConfig, x_BxD):
  """transformers' ModernBertPredictionHead (dense, GELU, norm) as `head_dense` and
  `head_norm` of the calling compact module: a fine-tuning classifier's, whose values
  come from the pre-trained MLM head, as transformers loads them."""
  dense = nn.Dense(c.hidden_size, use_bias=c.classifier_bias, **dense_kw(c),
                   kernel_init=_init(_stds(c)["out"], ("embed", "mlp")),
                   bias_init=bert.zeros_init(("mlp",)), name="head_dense")
  return Norm(c, name="head_norm")(bert.gelu(c, dense(x_BxD).astype(c.compute_dtype)))


class ModernBertForPreTraining(nn.Module):
  """Encoder + MLM head (dense, GELU, norm, tied decoder with a bias), on the masked
  positions only; the same call and output as BertForPreTraining."""
  config: ModelConfig

  def setup(self):
    c = self.config
    self.bert = ModernBertModel(c)
    self.head_dense = nn.Dense(c.hidden_size, use_bias=c.classifier_bias, **dense_kw(c),
                               kernel_init=_init(_stds(c)["out"], ("embed", "mlp")),
                               bias_init=bert.zeros_init(("mlp",)))
    self.head_norm = Norm(c)
    self.decoder_bias = (self.param("decoder_bias", bert.zeros_init(("vocab",)),
                                    (c.padded_vocab_size,)) if c.decoder_bias else None)

  def __call__(self, ids_BxL, segments_BxL, mask_BxL, positions_BxP,
               deterministic: bool = True, output_hidden_states: bool = False,
               documents_BxL=None) -> PreTrainingOutput:
    c = self.config
    enc = self.bert(ids_BxL, segments_BxL, mask_BxL, deterministic, output_hidden_states,
                    documents_BxL)
    h_BxPxD = jnp.take_along_axis(enc.sequence_BxLxD, positions_BxP[..., None], axis=1)
    h_BxPxD = self.head_norm(bert.gelu(c, self.head_dense(h_BxPxD).astype(c.compute_dtype)))
    logits_BxPxV = self.bert.attend(h_BxPxD).astype(jnp.float32)
    bias_V = (self.decoder_bias if self.decoder_bias is not None
              else jnp.zeros((c.padded_vocab_size,), jnp.float32))
    if c.padded_vocab_size != c.vocab_size:  # padding ids are never predicted
      bias_V = bias_V + jnp.where(jnp.arange(c.padded_vocab_size) < c.vocab_size, 0.0, -1e9)
    nsp_Bx2 = jnp.zeros((ids_BxL.shape[0], 2), jnp.float32)  # no NSP head: objective 'mlm'
    return PreTrainingOutput(logits_BxPxV + bias_V, nsp_Bx2, enc)

