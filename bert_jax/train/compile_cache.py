"""JAX's persistent compilation cache: compile once per machine.

`enable(cache_dir)` makes every jit compilation of this process look up its
executable in `cache_dir` first and store new ones there, so a resumed or
repeated run skips XLA compilation (10-30 s for a train step on CPU, minutes
on TPU pods). JAX's defaults only store compilations that took >= 1 s; here
every compilation that takes >= `min_compile_time_secs` (0.5 s by default) is
stored, whatever its size.

The folder is trusted code: do not share it with users you do not trust
(see jax.experimental.compilation_cache.compilation_cache.set_cache_dir).
"""

import os
from typing import Optional

import jax

_enabled_dir: Optional[str] = None


def enable(cache_dir: str, min_compile_time_secs: float = 0.5) -> None:
  """Turns on the persistent compilation cache in `cache_dir` ('' or None: do nothing).

  Call it once per process, before the first jit compilation you want cached
  (calling it again with the same folder is a no-op). `~` is expanded and the
  folder is created.
  """
  global _enabled_dir
  if not cache_dir:
    return
  path = os.path.abspath(os.path.expanduser(cache_dir))
  if path == _enabled_dir:
    return
  os.makedirs(path, exist_ok=True)
  if _enabled_dir is not None:  # a different folder: JAX initialises its cache once
    from jax.experimental.compilation_cache import compilation_cache as cc
    cc.reset_cache()
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time_secs))
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)  # any size
  _enabled_dir = path


def enabled_dir() -> Optional[str]:
  """The folder `enable` turned on in this process, or None."""
  return _enabled_dir
