"""A tiny ModernBERT that pre-trains on the built-in corpus in minutes on 2 CPU cores.

The same recipe as configs/modernbert_base.py (30% masking, WSD, packing, StableAdamW's
betas, MLM only), at the size of configs/tiny.py so the two compare at equal cost
(tools/compare_families.py).
"""

from bert_jax import default_config


def get_config():
  c = default_config.get_config()
  c.objective = "mlm"
  # WordPiece, as configs/tiny.py: the family comparison (tools/compare_families.py)
  # differs in the architecture alone; --config.data.tokenizer=bpe gives ModernBERT's kind.
  c.data.vocab_size = 4096
  c.data.dupe_factor = 10
  c.data.eval_fraction = 0.1
  c.data.eval_dupe_factor = 100
  c.data.max_eval_examples = 8192
  c.data.packing = True
  m = c.model
  m.family = "modernbert"
  m.hidden_size = 128
  m.num_layers = 3  # global, local, local
  m.num_heads = 2
  m.intermediate_size = 256  # GeGLU: Wi is 2 x 256 wide, as BERT-tiny's 512
  m.max_position_embeddings = 128
  m.local_attention = 32
  m.global_rope_theta = 10000.0  # ModernBERT's 1024-token phase; 160000 once extended
  m.local_rope_theta = 10000.0
  m.layer_norm_eps = 1e-5
  m.dropout_rate = 0.0
  m.attention_dropout_rate = 0.0
  m.dtype = "float32"
  c.masking.mask_prob = 0.3
  t = c.train
  t.optimizer = "stable_adamw"
  t.b1, t.b2, t.eps = 0.9, 0.98, 1e-6
  t.weight_decay = 1e-5 / 1e-3  # ModernBERT's decoupled 1e-5, in optax's lr-scaled form
  t.max_grad_norm = 0.0  # no global clipping: StableAdamW clips each tensor's update
  t.batch_size = 64
  t.num_steps = 1200
  t.learning_rate = 1e-3
  t.warmup_steps = 200
  t.schedule = "wsd"
  t.decay_fraction = 0.2
  t.decay_shape = "sqrt"
  t.phase_fractions = (1.0,)
  t.seq_lens = (64,)
  t.max_predictions = (20,)
  c.log_every = 50
  c.eval_every = 400
  c.checkpoint_every = 400
  return c
