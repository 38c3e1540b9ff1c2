"""BERT-Base: L=12 H=768 A=12 (110M params), the reference pre-training recipe."""

from bert_jax import default_config


def get_config():
  return default_config.get_config()
