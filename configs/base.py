"""BERT-Base: L=12 H=768 A=12 (110M params), the reference pre-training recipe."""

from configs import default


def get_config():
  return default.get_config()
