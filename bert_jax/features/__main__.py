"""`python -m bert_jax.features`: the feature-extraction command line (bert_jax.features.cli)."""

from bert_jax.features import cli

cli.cli()
