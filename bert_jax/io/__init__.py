"""Weights on disk: Orbax checkpoints, HuggingFace / TF weights, conversion."""
