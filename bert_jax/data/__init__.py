"""Text -> ids -> pre-training examples -> per-host batches. No JAX in this package."""
