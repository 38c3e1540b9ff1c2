"""How a command starts: the process settings first, then the command's module.

Each command's module imports JAX when it is imported, and
`host_malloc.reexec_with_huge_pages` may run the command again: called from here,
before that import, a command starts JAX once instead of twice (about a second).
The installed commands (pyproject's [project.scripts]), `python -m bert_jax.<name>`
and train.py all come here (`start`); importing bert_jax changes nothing in the
process. Imports no JAX.
"""

import importlib
import os
import pkgutil
import signal
import sys
from typing import Optional, Sequence

import bert_jax
from bert_jax import errors
from bert_jax.parallel import host_malloc


def start() -> None:
  """What a command sets for its process before JAX is imported: the CPU pinned where
  libtpu is installed on a host without a TPU (JAX would try the TPU first and libtpu
  print errors about TPU workers; such a host runs on the CPU, quietly), then the host
  allocator's huge pages (which may run the command again, with both in place)."""
  bert_jax.cpu_only_without_accelerator()
  host_malloc.reexec_with_huge_pages()


def note_sigterm() -> None:
  """From here until train installs its own handler, a SIGTERM is noted for the run's
  first safe point rather than killing the process: the imports in between take seconds
  on a loaded host, and a stop there must still end in one `interrupted:` line."""
  signal.signal(signal.SIGTERM, note_stop)


def note_stop(signum, frame) -> None:
  """Notes a SIGTERM for the next safe point: never raises (Python drops an exception
  raised while a garbage-collection callback runs, and the stop with it)."""
  del frame
  first = errors.stop_requested() is None
  errors.request_stop(signum)
  if first:
    os.write(2, f"{signal.Signals(signum).name} received: stopping at the next safe point\n"
             .encode())


# Modules of bert_jax/commands that are not commands: what the commands share.
_HELPERS = frozenset({"common", "config_args", "launch"})


def commands(path: Optional[Sequence[str]] = None) -> list[str]:
  """The command names: every module of bert_jax/commands but the helpers (a new command
  is one module there, with a `cli()`)."""
  if path is None:
    from bert_jax import commands as package  # pylint: disable=import-outside-toplevel
    path = package.__path__
  return sorted(m.name for m in pkgutil.iter_modules(path)
                if not m.ispkg and m.name not in _HELPERS and not m.name.startswith("_"))


def main(argv: Optional[Sequence[str]] = None) -> None:
  """`python -m bert_jax <command> [its arguments]` and the installed `bert-jax`."""
  argv = list(sys.argv[1:] if argv is None else argv)
  names = commands()
  usage = (f"usage: python -m bert_jax <command> [arguments]\ncommands: {', '.join(names)}"
           "\n(`python -m bert_jax <command> --help` for one)")
  if not argv or argv[0] in ("-h", "--help"):
    print(usage, file=sys.stdout if argv else sys.stderr)
    raise SystemExit(0 if argv else 2)
  if argv[0] not in names:
    print(f"error: unknown command {argv[0]!r}; expected one of {', '.join(names)}",
          file=sys.stderr)
    raise SystemExit(2)
  sys.argv = [f"python -m bert_jax {argv[0]}", *argv[1:]]
  run(argv[0])


def run(name: str) -> None:
  """Runs command `name` (a module of bert_jax.commands, its `cli()`)."""
  start()  # first: it may run this command again
  if name == "train":  # a stop during the imports below is the run's to serve
    note_sigterm()
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


def merge() -> None:
  """`bert-jax-merge`."""
  run("merge")
