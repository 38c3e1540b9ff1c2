"""The installed commands (pyproject's [project.scripts]): the host allocator first, then the command.

Each command's module imports JAX when it is imported, and
`host_malloc.reexec_with_huge_pages` may run the command again: called from here,
before that import, a command starts JAX once instead of twice (about a second).
Imports no JAX.
"""

import importlib

from bert_jax.parallel import host_malloc


def _command(module: str, function: str) -> None:
  host_malloc.reexec_with_huge_pages()  # first: it may run this command again
  getattr(importlib.import_module(module), function)()


def train() -> None:
  """`bert-jax-train`."""
  _command("bert_jax.train_cli", "main")


def features() -> None:
  """`bert-jax-features`."""
  _command("bert_jax.features.cli", "cli")


def finetune() -> None:
  """`bert-jax-finetune`."""
  _command("bert_jax.finetune", "cli")


def probe() -> None:
  """`bert-jax-probe`."""
  _command("bert_jax.probe", "cli")
