"""Feature extraction from a checkpoint (`python -m bert_jax.features`)."""
