"""`python -m bert_jax.features`: the feature-extraction command line (bert_jax.features.cli)."""

from bert_jax.parallel import host_malloc

host_malloc.reexec_with_huge_pages()  # before the JAX imports: it may run this command again

from bert_jax.features import cli  # noqa: E402

cli.cli()
