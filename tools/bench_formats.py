"""Preparation throughput of the published formats against plain text of the same content.

  python -m tools.bench_formats                        # 48 MiB, parts of 8 MiB, 1 and 2 workers
  python -m tools.bench_formats --megabytes 200 --part-mib 16 --workers 1,2

One synthetic corpus (tools/bench_prepare's: documents of built-in sentences) is
written three ways: plain text (one file), Parquet (one file, a `text` column, row
groups of about 1 MiB, pyarrow's default compression) and JSONL compressed with zstd
(8 shards, level 3). Each is prepared by `dataset.prepare` with one fixed vocabulary
(trained once, from the plain text) for every worker count, in this process; its
workers are processes. Prints one markdown row per format and worker count: the bytes
on disk, parts, seconds, corpus tokens per second, the share of plain text's rate at
that worker count, and whether the prepared bytes equal those of 1 worker (the
promise: parts depend on the corpus alone). The machine is printed first.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import tempfile
import time

from bert_jax.data import corpus, dataset, prep_parts
from bert_jax.settings import DataSettings
from tools.bench_prepare import make_synthetic_corpus, parallel_capacity

SHARDS = 8


def _write_formats(plain: str, tmp: str) -> dict[str, str]:
  """The plain corpus as Parquet and as zstd JSONL shards: {format: corpus spec}."""
  import pyarrow as pa  # pylint: disable=import-outside-toplevel
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
  import zstandard  # pylint: disable=import-outside-toplevel
  texts = ["\n".join(d) for d in corpus.read_documents(plain)]
  mean = sum(len(t) for t in texts) / max(len(texts), 1)
  pq.write_table(pa.table({"text": texts}), os.path.join(tmp, "corpus.parquet"),
                 row_group_size=max(1, int((1 << 20) / max(mean, 1))))
  os.makedirs(os.path.join(tmp, "zst"))
  per = -(-len(texts) // SHARDS)
  for i in range(SHARDS):
    data = "".join(json.dumps({"text": t}) + "\n" for t in texts[i * per:(i + 1) * per])
    with open(os.path.join(tmp, "zst", f"shard-{i:02d}.jsonl.zst"), "wb") as f:
      f.write(zstandard.ZstdCompressor(level=3).compress(data.encode()))
  return {"plain": plain, "parquet": os.path.join(tmp, "corpus.parquet"),
          "jsonl.zst": os.path.join(tmp, "zst", "*.zst")}


def _examples_hash(directory: str) -> str:
  h = hashlib.sha256()
  for root, _, files in sorted(os.walk(directory)):
    for name in sorted(files):
      if name not in ("stats.json", "manifest.json", "settings.json"):
        h.update(name.encode())
        with open(os.path.join(root, name), "rb") as f:
          h.update(f.read())
  return h.hexdigest()[:16]


def _cpu_model() -> str:
  try:
    with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
      return next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
  except (OSError, StopIteration):
    return platform.processor() or platform.machine()


def _disk_mib(spec: str) -> float:
  return sum(os.path.getsize(p) for p in corpus.files(spec)) / 2**20


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(prog="python -m tools.bench_formats", description=__doc__.split(
      "\n\n")[0])
  ap.add_argument("--megabytes", type=float, default=48.0)
  ap.add_argument("--part-mib", type=float, default=8.0, help="the part size (all formats)")
  ap.add_argument("--seq-len", type=int, default=128)
  ap.add_argument("--workers", default="1,2")
  args = ap.parse_args(argv)
  workers = [int(w) for w in args.workers.split(",")]
  prep_parts.PART_BYTES = int(args.part_mib * 2**20)
  prep_parts.MIN_PART_BYTES = min(prep_parts.MIN_PART_BYTES, prep_parts.PART_BYTES)
  print(f"{_cpu_model()}, {os.cpu_count()} cores"
        + (f"; {max(workers)} busy processes get {parallel_capacity(max(workers)):.2f} cores"
           if max(workers) > 1 else ""), flush=True)
  with tempfile.TemporaryDirectory(prefix="bert_jax_formats_") as tmp:
    plain = make_synthetic_corpus(os.path.join(tmp, "corpus.txt"), args.megabytes)
    specs = _write_formats(plain, tmp)
    base = DataSettings(corpus=plain, vocab_size=8192, dupe_factor=1,
                        vocab_sample_bytes=10_000_000)
    vocab = dataset.make_tokenizer(base, seed=0).save(os.path.join(tmp, "vocab"))
    print("| format | MiB on disk | workers | parts | seconds | tokens/s | of plain text's | "
          "bytes as 1 worker |\n| --- | --- | --- | --- | --- | --- | --- | --- |", flush=True)
    rate_plain: dict[int, float] = {}
    for name, spec in specs.items():
      first = None
      for w in workers:
        c = DataSettings(corpus=spec, vocab_file=vocab, dupe_factor=1, num_workers=w)
        cache = os.path.join(tmp, f"cache-{name}-{w}")
        t = time.perf_counter()
        p = dataset.prepare(c, [args.seq_len], cache, seed=0)
        seconds = time.perf_counter() - t
        with open(os.path.join(p.directory, dataset.STATS_FILE), encoding="utf-8") as f:
          stats = json.load(f)
        rate = stats["tokens"] / seconds
        rate_plain.setdefault(w, rate)
        digest = _examples_hash(p.directory)
        first = first or digest
        print(f"| {name} | {_disk_mib(spec):.1f} | {w} | {stats.get('parts', 1)} | "
              f"{seconds:.1f} | {rate:.0f} | {rate / rate_plain[w]:.0%} | "
              f"{'yes' if digest == first else 'NO'} |", flush=True)


if __name__ == "__main__":
  main()
