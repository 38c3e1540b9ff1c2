"""The persistent compilation cache: a second process reads what the first wrote."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_CHILD = r"""
import json, os, sys
sys.path.insert(0, sys.argv[2])
import jax, jax.numpy as jnp
from bert_jax.train import compile_cache
hits = []
jax.monitoring.register_event_listener(
    lambda name, **kw: hits.append(name) if name == '/jax/compilation_cache/cache_hits' else None)
compile_cache.enable(sys.argv[1], min_compile_time_secs=0.0)
compile_cache.enable(sys.argv[1], min_compile_time_secs=0.0)  # a second call is a no-op

@jax.jit
def f(x):
  for _ in range(8):
    x = jnp.tanh(x @ x.T + 1.0)
  return x.sum()

f(jnp.ones((64, 64))).block_until_ready()
print(json.dumps({"hits": len(hits), "entries": len(os.listdir(sys.argv[1]))}))
"""


def _child(cache_dir):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-c", _CHILD, str(cache_dir), ROOT], env=env,
                       capture_output=True, text=True, timeout=120, check=True).stdout
  return json.loads(out.strip().splitlines()[-1])


def test_second_process_reads_the_compilation_from_the_cache(tmp_path):
  cache = tmp_path / "xla"
  first = _child(cache)
  assert first["hits"] == 0 and first["entries"] > 0
  second = _child(cache)
  assert second["hits"] >= 1
  assert second["entries"] == first["entries"]  # nothing recompiled


def test_empty_cache_dir_leaves_the_cache_off(tmp_path, monkeypatch):
  import jax
  from bert_jax.train import compile_cache
  before = jax.config.jax_compilation_cache_dir
  compile_cache.enable("")
  assert jax.config.jax_compilation_cache_dir == before
  assert compile_cache.enabled_dir() is None or compile_cache.enabled_dir() != ""


def test_the_tests_caches_are_their_own_not_the_users():
  """Tests shared ~/.cache/bert_jax/xla with the user and with every earlier run on the
  machine: conftest gives the run a cache home of its own (XDG_CACHE_HOME)."""
  from bert_jax import default_config
  from bert_jax.storage import fs
  home = os.path.expanduser("~/.cache")
  for path in (default_config.get_config().compile_cache_dir, fs.mirror_root()):
    assert not os.path.expanduser(path).startswith(home), path
    assert os.path.expanduser(path).startswith(os.environ["XDG_CACHE_HOME"]), path
