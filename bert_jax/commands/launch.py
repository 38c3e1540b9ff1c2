"""How a command starts: the host allocator first, then the command's module.

Each command's module imports JAX when it is imported, and
`host_malloc.reexec_with_huge_pages` may run the command again: called from here,
before that import, a command starts JAX once instead of twice (about a second).
The installed commands (pyproject's [project.scripts]) and `python -m bert_jax.<name>`
both come here. Imports no JAX.
"""

import importlib

from bert_jax.parallel import host_malloc


def run(name: str) -> None:
  """Runs command `name` (a module of bert_jax.commands, its `cli()`)."""
  host_malloc.reexec_with_huge_pages()  # first: it may run this command again
  importlib.import_module(f"bert_jax.commands.{name}").cli()


def train() -> None:
  """`bert-jax-train`."""
  run("train")


def features() -> None:
  """`bert-jax-features`."""
  run("features")


def convert() -> None:
  """`bert-jax-convert`."""
  run("convert")


def finetune() -> None:
  """`bert-jax-finetune`."""
  run("finetune")


def probe() -> None:
  """`bert-jax-probe`."""
  run("probe")


def plan() -> None:
  """`bert-jax-plan`."""
  run("plan")
