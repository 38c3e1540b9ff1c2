"""BERT-Large: L=24 H=1024 A=16 (340M params)."""

from bert_jax import default_config


def get_config():
  c = default_config.get_config()
  c.model.hidden_size = 1024
  c.model.num_layers = 24
  c.model.num_heads = 16
  c.model.intermediate_size = 4096
  c.model.remat = True
  return c
