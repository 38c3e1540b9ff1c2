"""Tiny BERT that pre-trains on the built-in corpus in minutes on 2 CPU cores.

The default of `python train.py`.
"""

from bert_jax import default_config


def get_config():
  c = default_config.get_config()
  c.data.vocab_size = 4096
  c.data.dupe_factor = 10
  # Eight held-out documents read up to 100 times (fresh pairs and masks each pass),
  # capped at 8192 examples, so fresh runs agree to about 0.01 (tools/measure_reruns.py).
  c.data.eval_fraction = 0.1
  c.data.eval_dupe_factor = 100
  c.data.max_eval_examples = 8192
  c.model.hidden_size = 128
  c.model.num_layers = 2
  c.model.num_heads = 2
  c.model.intermediate_size = 512
  c.model.max_position_embeddings = 128
  c.model.dtype = "float32"  # CPUs have no fast bfloat16 matmul path to gain from
  c.train.batch_size = 64
  c.train.num_steps = 1200
  c.train.learning_rate = 1e-3
  c.train.warmup_steps = 200
  c.train.phase_fractions = (1.0,)
  c.train.seq_lens = (64,)
  c.train.max_predictions = (10,)
  c.log_every = 50
  c.eval_every = 400
  c.checkpoint_every = 400
  return c
