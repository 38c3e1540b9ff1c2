"""The settings' model section: the encoder's shape and numerics as plain data, no JAX or Flax.

Settings, data and checkpoint code read and check it without importing the model. The
family-specific checks are the family's own (model/family.py, plain data too).
"""

import dataclasses
import numbers
from typing import Any

from bert_jax.errors import ConfigError
from bert_jax.model import family as family_registry

# Compute dtypes by name (jax.numpy is imported only when a dtype object is asked for).
_DTYPES = ("float32", "bfloat16", "float16")
_DROPOUT_RNGS = ("hash", "threefry", "rbg", "unsafe_rbg")
_CPU_ATTENTION_LAYOUTS = ("canonical", "xla")
ATTENTION_KERNELS = ("einsum", "jax", "cudnn", "splash")
# Splash's blocks are TPU tiles of this many tokens, so every phase's length must be a
# multiple of it (model/splash.py): the one statement of the rule, which the settings'
# check, 'auto' (model/precision) and the planner's splash fix ask.
SPLASH_TILE = 128
REMAT_POLICIES = ("full", "save_dots")
CPU_FORWARD_DOTS = ("auto", "ynnpack", "eigen")
ATTENTION_SOFTMAX = ("standard", "deferred")


def splash_tiles_fit(seq_lens) -> bool:
  """Whether every length is a positive multiple of SPLASH_TILE (splash's blocks)."""
  return bool(seq_lens) and all(isinstance(n, numbers.Integral) and n > 0
                                and n % SPLASH_TILE == 0 for n in seq_lens)


# Fields that change how the model is computed (precision, kernels, dropout, memory), never
# its parameters: a checkpoint resumes, and checkpoints merge, across them.
RUNTIME_FIELDS = ("dropout_rate", "attention_dropout_rate", "dtype", "remat", "dropout_rng",
                  "cpu_attention_layout", "attention_kernel", "remat_policy",
                  "cpu_forward_dots", "attention_softmax")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """The encoder's shape and numerics, for either family (`family`)."""
  vocab_size: int  # real vocabulary size (tokenizer)
  # 'bert' (the 2018 model, the default) or 'modernbert' (transformers' ModernBertModel).
  # The ModernBERT fields below mean nothing to BERT; BERT's type_vocab_size and
  # max_position_embeddings table mean nothing to ModernBERT (rotary positions).
  family: str = "bert"
  hidden_size: int = 768
  num_layers: int = 12
  num_heads: int = 12
  intermediate_size: int = 3072
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  layer_norm_eps: float = 1e-12
  initializer_range: float = 0.02
  gelu_approximate: bool = False
  vocab_pad_multiple: int = 1
  # Compute dtype; parameters, LayerNorm, softmax and losses are always float32.
  # 'float32': every matmul in float32 (the reference numerics).
  # 'bfloat16' / 'float16': mixed mode: activations in that dtype, and every
  # matmul (forward and both gradient dots) takes operands in that dtype and
  # accumulates in float32 (bert_jax.model.precision). 'auto' is not a model dtype:
  # resolve it first with bert_jax.model.precision.resolve_dtype.
  dtype: str = "float32"
  remat: bool = False
  # What remat keeps of a layer for the backward pass: 'full' only its input (everything
  # recomputed); 'save_dots' also the outputs of its six weight matmuls, so only the
  # attention scores and softmax, GELU, LayerNorm and dropout are recomputed.
  remat_policy: str = "full"
  # How dropout draws its random bits: 'hash' | 'threefry' | 'rbg' | 'unsafe_rbg'.
  dropout_rng: str = "hash"
  # Layout of the float32 attention dots (scores, context) compiled for XLA:CPU:
  # 'canonical' moves batch and head axes first and the contraction last
  # (bert_jax.model.precision, as the mixed-precision dots always are); 'xla' leaves
  # the layout to XLA. Same values; TPU and GPU always leave it to the compiler.
  cpu_attention_layout: str = "canonical"
  # The attention core (scores, softmax, context): 'einsum', the model's own dots
  # with dropout on the probabilities (the reference); 'jax', jax.nn.dot_product_attention
  # as XLA compiles it; 'cudnn', the same with cuDNN's fused kernel (NVIDIA GPUs; padding
  # as key lengths, so masks must be right-padded, as every bert-jax input is; packed
  # documents and sliding windows as a mask it reads). Neither of the last two has
  # attention dropout: they need attention_dropout_rate=0.
  attention_kernel: str = "einsum"
  # Where the 'einsum' core divides by the softmax's row sums: 'standard' normalizes the
  # probabilities before the context dot (the reference order); 'deferred' takes the dot
  # of the unnormalized exponentials (dropped out as the probabilities would be) with the
  # values and divides the [L, K] context instead of the [L, L] probabilities, as fused
  # attention kernels do. Same values up to float rounding; on XLA:CPU (float32) no
  # faster in the model, though the core alone is (docs/performance.md, levers).
  attention_softmax: str = "standard"
  # How forward-only programs (feature extraction, probes) compiled for XLA:CPU run
  # their dots: 'ynnpack', in XLA's YNNPACK library fusions (XLA's default); 'eigen',
  # without library fusions, as XLA's own (Eigen) dots; 'auto', 'eigen' in float32
  # (faster there) and 'ynnpack' in mixed precision. Same values; training steps,
  # TPU and GPU are not affected (bert_jax.model.precision.forward_compiler_options).
  cpu_forward_dots: str = "auto"

  # ModernBERT (family='modernbert'), as transformers' ModernBertConfig names them. Its
  # norm_eps is layer_norm_eps (1e-5 there); embedding and MLP dropout are dropout_rate,
  # attention dropout attention_dropout_rate; hidden and head activations are GELU
  # (gelu_approximate: its tanh form).
  global_rope_theta: float = 160000.0
  local_rope_theta: float = 10000.0
  local_attention: int = 128  # a local layer's window: keys within local_attention // 2
  global_attn_every_n_layers: int = 3  # layers 0, n, 2n, ... attend globally
  attention_bias: bool = False
  mlp_bias: bool = False
  norm_bias: bool = False
  decoder_bias: bool = True
  classifier_bias: bool = False  # the MLM head's dense layer

  @property
  def padded_vocab_size(self) -> int:
    m = max(1, self.vocab_pad_multiple)
    return -(-self.vocab_size // m) * m

  @property
  def compute_dtype(self) -> Any:
    import jax.numpy as jnp  # here: the config itself is plain data, importable without JAX
    return jnp.dtype(self.dtype)

  @property
  def mixed(self) -> bool:
    """True when matmuls take compute-dtype operands and accumulate in float32."""
    return self.dtype != "float32"

  def validate(self) -> "ModelConfig":
    """Raises ConfigError for a config that cannot work."""
    positive = ("vocab_size", "hidden_size", "num_layers", "num_heads",
                "intermediate_size", "max_position_embeddings", "type_vocab_size")
    for name in positive:
      value = getattr(self, name)
      if not isinstance(value, int) or value <= 0:
        raise ConfigError(f"config.model.{name}={value!r}: expected a positive integer")
    if self.hidden_size % self.num_heads:
      raise ConfigError(
          f"config.model.hidden_size={self.hidden_size} is not divisible by "
          f"config.model.num_heads={self.num_heads}; expected heads of equal size")
    for name in ("dropout_rate", "attention_dropout_rate"):
      if not 0.0 <= getattr(self, name) < 1.0:
        raise ConfigError(f"config.model.{name}={getattr(self, name)!r}: expected 0 <= rate < 1")
    family = family_registry.named(self.family)
    if family.check:
      family.check(self)
    for name, choices in (("dropout_rng", _DROPOUT_RNGS),
                          ("cpu_attention_layout", _CPU_ATTENTION_LAYOUTS),
                          ("remat_policy", REMAT_POLICIES),
                          ("attention_kernel", ATTENTION_KERNELS),
                          ("attention_softmax", ATTENTION_SOFTMAX),
                          ("cpu_forward_dots", CPU_FORWARD_DOTS)):
      if getattr(self, name) not in choices:
        raise ConfigError(f"config.model.{name}={getattr(self, name)!r}: expected one of "
                          f"{sorted(choices)}")
    if self.attention_kernel != "einsum" and self.attention_dropout_rate:
      raise ConfigError(
          f"config.model.attention_kernel={self.attention_kernel!r} applies no dropout to "
          f"attention probabilities, but config.model.attention_dropout_rate="
          f"{self.attention_dropout_rate}; expected attention_dropout_rate=0 with it, or "
          "attention_kernel='einsum'")
    if self.attention_kernel == "cudnn" and self.dtype not in ("bfloat16", "float16"):
      raise ConfigError(f"config.model.attention_kernel='cudnn' takes bfloat16 or float16 "
                        f"inputs (cuDNN's fused attention), but config.model.dtype="
                        f"{self.dtype!r}; expected dtype bfloat16 (or 'auto' on a GPU)")
    if self.attention_kernel == "cudnn" and (self.hidden_size // self.num_heads) % 8:
      raise ConfigError(f"config.model.attention_kernel='cudnn' needs a head size that is a "
                        f"multiple of 8, but hidden_size/num_heads = "
                        f"{self.hidden_size}/{self.num_heads}")
    if self.dtype not in _DTYPES:
      hint = (" ('auto' must be resolved first: bert_jax.model.precision.resolve_dtype)"
              if self.dtype == "auto" else "")
      raise ConfigError(f"config.model.dtype={self.dtype!r}: expected one of "
                        f"{sorted(_DTYPES)}{hint}")
    return self

  @classmethod
  def from_dict(cls, d: dict) -> "ModelConfig":
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names})

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)
