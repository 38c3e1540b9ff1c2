"""Train-step compile time of the tiny model, cold vs warm persistent cache.

Runs two fresh processes against one new cache folder: the first compiles
and writes the cache (cold), the second reads it (warm). Prints both.

  python tools/bench_compile_cache.py [--dtype float32|bfloat16] [--cache DIR]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_CHILD = r"""
import json, sys, time
t_start = time.perf_counter()
sys.path.insert(0, sys.argv[1])
import jax, jax.numpy as jnp, numpy as np
from bert_jax import settings
from bert_jax.data.pretraining_data import Batch
from bert_jax.data.tokenizer import SpecialIds
from bert_jax.parallel import sharding
from bert_jax.train import compile_cache
from bert_jax.train.steps import make_steps
from configs import tiny
hits = []
jax.monitoring.register_event_listener(
    lambda name, **kw: hits.append(name) if name == '/jax/compilation_cache/cache_hits' else None)
compile_cache.enable(sys.argv[2])
c = tiny.get_config()
c.model.dtype = sys.argv[3]
mesh = sharding.make_mesh(1, devices=jax.devices()[:1])
L, B, V = c.train.seq_lens[0], c.train.batch_size, 1000
t = make_steps(settings.from_config(c), V, SpecialIds(0, 1, 2, 3, 4), mesh=mesh)
params, opt = t.init_state()
rs = np.random.RandomState(0)
ids = rs.randint(5, V, (B, L)).astype(np.int32)
batch = sharding.global_batch(Batch.from_features({"input_ids": ids,
    "segment_ids": np.zeros_like(ids), "input_mask": np.ones_like(ids),
    "next_sentence_label": np.zeros(B, np.int32)}), mesh)
step = t.train_step_fn(t.phases[0])
t0 = time.perf_counter()
compiled = step.lower(params, opt, jnp.int32(0), batch).compile()
t1 = time.perf_counter()
print(json.dumps({"compile_s": t1 - t0, "process_s": t1 - t_start, "cache_hits": len(hits)}))
"""


def _run(cache_dir, dtype):
  env = dict(os.environ)
  env.setdefault("JAX_PLATFORMS", "cpu")
  out = subprocess.run([sys.executable, "-c", _CHILD, ROOT, cache_dir, dtype], env=env,
                       capture_output=True, text=True, check=True).stdout
  return json.loads(out.strip().splitlines()[-1])


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--dtype", default="float32")
  ap.add_argument("--cache", default="", help="cache folder (default: a new temporary one)")
  args = ap.parse_args()
  cache = args.cache or tempfile.mkdtemp(prefix="bert_jax_xla_cache_")
  cold = _run(cache, args.dtype)
  warm = _run(cache, args.dtype)
  print(f"tiny train step ({args.dtype}), cache {cache}")
  print(f"  cold cache: compile {cold['compile_s']:.2f} s  (process to compiled {cold['process_s']:.2f} s, "
        f"cache hits {cold['cache_hits']})")
  print(f"  warm cache: compile {warm['compile_s']:.2f} s  (process to compiled {warm['process_s']:.2f} s, "
        f"cache hits {warm['cache_hits']})")
  print(f"  speed-up of the compile: {cold['compile_s'] / max(warm['compile_s'], 1e-9):.1f}x")


if __name__ == "__main__":
  main()
