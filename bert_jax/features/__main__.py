"""`python -m bert_jax.features`: the command's name; its code is bert_jax.commands.features."""

from bert_jax.commands import launch

launch.features()
