"""bert-jax: BERT pre-training (MLM + NSP) on JAX/Flax, and feature extraction."""

__version__ = "0.2.0"
