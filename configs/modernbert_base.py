"""ModernBERT-Base: 22 layers, hidden 768, 12 heads, GeGLU 1152 (149M params with its
50k vocabulary), with the published three-stage recipe (arXiv 2412.13663, Table 3 and
answerdotai/ModernBERT's yamls) as one bert-jax run of three phases:

  stage      tokens  length  batch         RoPE theta (global)  learning rate
  pre-train  1.7T    1024    768 -> 4608   10,000               8e-4 after a 3B-token warm-up
  extension  250B    8192    576           160,000              3e-4, constant
  decay      50B     8192    576           160,000              1-sqrt from 3e-4 to 0.001x

  30% masking (80/10/10) in every stage, evaluated at 15% (eval.mask_prob); MLM only,
  packed rows with document masks; StableAdamW's update clipping, betas (0.9, 0.98),
  eps 1e-6, decoupled weight decay 1e-5 (no decay on norms or biases), no gradient
  clipping; the batch warm-up from 768 to 4608 sequences over 50B tokens; local RoPE
  theta 10,000 throughout. The optimizer state carries over between stages.

docs/modernbert.md has the stage table; docs/deviations.md what differs from the
published runs.
"""

from bert_jax import default_config

SEQ, LONG = 1024, 8192  # the pre-training length; the extension's and the decay's
BATCH, LONG_BATCH = 4608, 576  # sequences per step
TOKENS = ("1.7T", "250B", "50B")  # pre-train, extension, decay
TOKENS_PER_STEP = SEQ * BATCH


def get_config():
  c = default_config.get_config()
  c.objective = "mlm"
  c.data.tokenizer = "bpe"  # byte-level BPE, trained on the corpus; or data.vocab_file =
  # a published ModernBERT's tokenizer.json (its OLMo-derived BPE)
  c.data.vocab_size = 50368  # ModernBERT's vocabulary size
  c.data.lowercase = False  # cased, as ModernBERT
  c.data.packing = True
  m = c.model
  m.family = "modernbert"
  m.hidden_size, m.num_layers, m.num_heads, m.intermediate_size = 768, 22, 12, 1152
  m.max_position_embeddings = 8192
  m.local_attention = 128
  m.global_attn_every_n_layers = 3
  m.global_rope_theta = 160000.0  # what the model ends with (the phases set each stage's)
  m.local_rope_theta = 10000.0
  m.layer_norm_eps = 1e-5
  m.initializer_range = 0.02
  m.dropout_rate = 0.0
  m.attention_dropout_rate = 0.0
  m.attention_kernel = "auto"  # splash on a TPU (no attention dropout), einsum elsewhere
  m.attention_bias = m.mlp_bias = m.norm_bias = False
  m.decoder_bias = True
  c.masking.mask_prob = 0.3
  t = c.train
  t.optimizer = "stable_adamw"
  t.learning_rate = 8e-4
  t.b1, t.b2, t.eps = 0.9, 0.98, 1e-6
  t.weight_decay = 1e-5 / t.learning_rate  # Composer's decoupled 1e-5 in optax's lr-scaled form
  t.max_grad_norm = 0.0
  t.batch_size = BATCH
  t.phase_batch_sizes = (BATCH, LONG_BATCH, LONG_BATCH)
  t.phase_tokens = TOKENS  # num_steps follows: each stage's tokens / (batch x length)
  t.phase_fractions = (0.85, 0.125, 0.025)  # not read: the token budgets decide
  t.seq_lens = (SEQ, LONG, LONG)
  # 30% of a full row, with room for chance.
  t.max_predictions = tuple(int(0.3 * n) + 8 for n in (SEQ, LONG, LONG))
  t.phase_rope_thetas = (10000.0, 160000.0, 160000.0)
  t.warmup_steps = 3_000_000_000 // TOKENS_PER_STEP
  t.batch_ramp.start = 768
  t.batch_ramp.steps = 50_000_000_000 // (SEQ * (768 + BATCH) // 2)
  t.batch_ramp.stages = 5
  t.schedule = "phases"
  t.phase_lr = ("constant", "constant@3e-4", "sqrt->0.001")
  return c
