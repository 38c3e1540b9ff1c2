"""ModernBERT-Base: 22 layers, hidden 768, 12 heads, GeGLU 1152 (149M params with its
50k vocabulary), with the published pre-training recipe (arXiv 2412.13663, Table 3 and
answerdotai/ModernBERT's yamls) as bert-jax expresses it.

  30% masking (80/10/10), MLM only, packed rows with document masks; StableAdamW's
  update clipping, lr 8e-4, betas (0.9, 0.98), eps 1e-6, decoupled weight decay 1e-5
  (no decay on norms or biases), no gradient clipping; warm-up over 3B tokens; a batch
  warm-up from 768 to 4608 sequences over 50B tokens; warmup-stable-decay with a 1-sqrt
  decay; 1024-token rows, global and local RoPE theta 10,000.

The context extension (8192 tokens, global RoPE theta 160,000) is a later phase of the
same run: `--config.train.seq_lens='(1024,8192)' --config.train.phase_rope_thetas=
'(10000,160000)' ...`, or a second run through `init_from` (docs/modernbert.md).
Differences from the published run: docs/deviations.md.
"""

from bert_jax import default_config

SEQ = 1024
BATCH = 4608
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
  m.global_rope_theta = 10000.0  # 160000 in the context-extension run
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
  t.num_steps = 1_700_000_000_000 // TOKENS_PER_STEP  # 1.7T tokens at 1024
  t.warmup_steps = 3_000_000_000 // TOKENS_PER_STEP
  t.batch_ramp.start = 768
  t.batch_ramp.steps = 50_000_000_000 // (SEQ * (768 + BATCH) // 2)
  t.batch_ramp.stages = 5
  t.schedule = "wsd"
  t.decay_fraction = 0.05
  t.decay_shape = "sqrt"
  t.phase_fractions = (1.0,)
  t.seq_lens = (SEQ,)
  t.max_predictions = (int(0.3 * SEQ) + 8,)  # 30% of a full row, with room for chance
  return c
