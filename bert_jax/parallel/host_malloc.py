"""Transparent huge pages for the host allocator on CPU-only hosts (glibc's `hugetlb` tunable).

XLA:CPU allocates each step's temporary and output buffers anew with malloc.
Buffers of tens of MB and more are fresh `mmap`s, so every step faults all of
them in again, 4 KiB at a time: about 100,000 page faults and 0.24 s of kernel
time per step of the small model (L4 H256, 16 x 128) on a 2-core AMD EPYC,
20% of its step. With `GLIBC_TUNABLES=glibc.malloc.hugetlb=1`, glibc asks for
transparent huge pages (2 MiB) on those mappings, and the faults drop 100-fold.
`docs/performance.md` has the A/B.

glibc reads GLIBC_TUNABLES once, when the process starts, so the command-line
entry points call `reexec_with_huge_pages()` first: it sets the tunable and
execs the same command again. Nothing changes where it would not help: hosts
with a TPU or GPU (the step's buffers live on the device), other C libraries,
glibc before 2.35 (no such tunable), transparent huge pages turned off, another
allocator preloaded (tcmalloc, jemalloc, mimalloc), or `BERT_JAX_MALLOC=system`.
Imports no JAX: it runs before JAX starts.
"""

import os
import platform
import sys
from typing import Mapping, Optional

import bert_jax
from bert_jax.storage import fs

TUNABLE = "glibc.malloc.hugetlb=1"
OPT_OUT = "BERT_JAX_MALLOC"  # =system keeps glibc's defaults
_OTHER_ALLOCATORS = ("tcmalloc", "jemalloc", "mimalloc")
_THP_MODE = "/sys/kernel/mm/transparent_hugepage/enabled"


def glibc_version() -> tuple[int, ...]:
  name, version = platform.libc_ver()
  if name != "glibc":
    return ()
  try:
    return tuple(int(x) for x in version.split("."))
  except ValueError:
    return ()


def thp_available(path: str = _THP_MODE) -> bool:
  """Transparent huge pages on for `madvise`d memory ('[always]' or '[madvise]')."""
  try:
    with fs.open(path) as f:
      return "[never]" not in f.read()
  except OSError:
    return False


def tuned_environ(environ: Mapping[str, str], glibc: tuple[int, ...],
                  thp: bool, accelerator: bool) -> Optional[dict]:
  """`environ` with the huge-page tunable added, or None where it does not apply."""
  if (environ.get(OPT_OUT, "").lower() == "system" or accelerator or not thp
      or glibc < (2, 35)
      or any(a in environ.get("LD_PRELOAD", "") for a in _OTHER_ALLOCATORS)
      or "glibc.malloc.hugetlb" in environ.get("GLIBC_TUNABLES", "")):
    return None
  tunables = ":".join(filter(None, [environ.get("GLIBC_TUNABLES", ""), TUNABLE]))
  return {**environ, "GLIBC_TUNABLES": tunables}


def tuned_here(environ: Mapping[str, str]) -> Optional[dict]:
  """`tuned_environ` with this host's glibc, THP mode and accelerators."""
  return tuned_environ(environ, glibc_version(), thp_available(), bert_jax.has_accelerator())


def reexec_with_huge_pages() -> None:
  """Execs this command again with the huge-page tunable, where it applies.

  Call it first thing in a command-line entry point (never on import, never in
  a library call): the process is replaced, so nothing before it must matter.
  """
  env = tuned_here(os.environ)
  argv = getattr(sys, "orig_argv", [])
  if env is None or len(argv) < 2 or argv[1] in ("-c", "-"):
    return  # not applicable, or not a command we can run again (python -c, stdin)
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, argv, env)
