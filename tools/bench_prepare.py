"""Benchmark of data preparation: raw text -> WordPiece -> stored examples.

  python -m tools.bench_prepare                         # synthetic 25 and 100 MiB corpora
  python -m tools.bench_prepare --megabytes 5 --seq-len 512
  python -m tools.bench_prepare --corpus /path/to/corpus.txt
  python -m tools.bench_prepare --megabytes 100 400 --workers 1 2

Each size (and worker count) runs `benchmark_prepare` in a fresh process (a
clean peak RSS) and prints one markdown row; with `--workers`, the scaling
efficiency is tokens/s over (workers x the 1-worker tokens/s of that size). `python -m tools.bench` calls `benchmark_prepare`
for its `prepare` case. Run from the repository root.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import threading
import time
from typing import Sequence

from bert_jax.data import corpus, dataset
from bert_jax.settings import DataSettings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository


def make_synthetic_corpus(path: str, megabytes: float, seed: int = 0,
                          sentences: tuple[int, int] = (3, 30)) -> str:
  """Writes `megabytes` MiB of plain-format text: documents of `sentences` (3-30)
  sentences drawn at random from the built-in corpus (real English, no download).
  Returns `path`."""
  pool = [s for d in corpus.read_documents(corpus.BUILTIN) for s in d]
  rng = random.Random(seed)
  target, written = int(megabytes * 2**20), 0
  with open(path, "w", encoding="utf-8") as f:
    while written < target:
      doc = "\n".join(rng.choices(pool, k=rng.randint(*sentences))) + "\n\n"
      f.write(doc)
      written += len(doc.encode())
  return path


def _rss_mb(field: str) -> float | None:
  try:
    with open("/proc/self/status", encoding="ascii") as f:
      for line in f:
        if line.startswith(field + ":"):
          return int(line.split()[1]) / 1024
  except OSError:
    pass
  return None


def _cpu_seconds() -> float:
  """CPU time of this process and of its children that have ended (the workers)."""
  me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
  return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _reset_peak_rss() -> bool:
  try:  # Linux: "5" resets VmHWM to the current RSS
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
      f.write("5")
    return True
  except OSError:
    return False


class _TreeRss:
  """Peak of the summed RSS of this process and its children (the workers), sampled;
  and the most threads any worker had (its tokenizer must not add a thread pool)."""

  def __init__(self, every: float = 0.1):
    self.peak_mb, self.every, self.worker_threads = 0.0, every, 0
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)

  def __enter__(self) -> "_TreeRss":
    self._thread.start()
    return self

  def __exit__(self, *exc) -> None:
    self._stop.set()
    self._thread.join()

  def _run(self) -> None:
    while not self._stop.is_set():
      tree = _tree(os.getpid())
      self.peak_mb = max(self.peak_mb, sum(_status(p, "VmRSS") for p in tree) / 1024)
      self.worker_threads = max([self.worker_threads] + [_status(p, "Threads")
                                                         for p in tree[1:]])
      self._stop.wait(self.every)


def _tree(pid: int) -> list[int]:
  try:
    with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as f:
      children = [int(c) for c in f.read().split()]
  except OSError:
    children = []
  return [pid] + [p for c in children for p in _tree(c)]


def _status(pid: int, field: str) -> int:
  """A number of /proc/<pid>/status (kB for memory fields); 0 when the process is gone."""
  try:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
      for line in f:
        if line.startswith(field + ":"):
          return int(line.split()[1])
  except OSError:
    pass
  return 0


def benchmark_prepare(corpus_path: str | None = None, megabytes: float = 50.0,
                      seq_len: int = 128, dupe_factor: int = 1, vocab_size: int = 8192,
                      quick: bool = False, workdir: str | None = None,
                      workers: int = 1) -> dict:
  """Times `prepare` from raw text to stored examples, with its peak RSS.

  The corpus is `corpus_path`, or a synthetic one of `megabytes` MiB (5 MiB
  when `quick`). The WordPiece vocabulary is trained first, from at most
  10 MB of the corpus, and timed apart (`vocab_seconds`): its cost does not
  grow with the corpus. `tokens` counts the corpus's WordPiece tokens;
  `example_tokens` the used positions of the stored examples (dupe_factor
  passes, [CLS]/[SEP] included). Peak RSS is the process's high-water mark
  during `prepare` (reset before it on Linux; otherwise since process start).
  `workers` is `data.num_workers`; `tree_peak_rss_mb` is the peak of the summed
  RSS of this process and its workers (sampled every 0.1 s).
  The dict also carries the keys `tools.bench` reads.
  """
  with tempfile.TemporaryDirectory(prefix="bert_jax_prepare_bench_", dir=workdir) as tmp:
    if corpus_path is None:
      megabytes = 5.0 if quick else megabytes
      corpus_path = make_synthetic_corpus(os.path.join(tmp, "corpus.txt"), megabytes)
    c = DataSettings(corpus=corpus_path, vocab_size=vocab_size, dupe_factor=dupe_factor,
                     vocab_sample_bytes=10_000_000, num_workers=workers)
    t = time.perf_counter()
    tokenizer = dataset.make_tokenizer(c, seed=0)
    vocab_seconds = time.perf_counter() - t
    c = dataclasses.replace(c, vocab_file=tokenizer.save(os.path.join(tmp, "vocab")))
    exact_peak = _reset_peak_rss()
    start_rss = _rss_mb("VmRSS")
    t, cpu = time.perf_counter(), _cpu_seconds()
    with _TreeRss() as tree:
      prepared: dataset.Prepared = dataset.prepare(c, [seq_len], os.path.join(tmp, "cache"),
                                                   seed=0)
    seconds, cpu_seconds = time.perf_counter() - t, _cpu_seconds() - cpu
    peak = _rss_mb("VmHWM") if exact_peak else None
    if peak is None:
      peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with open(os.path.join(prepared.directory, dataset.STATS_FILE), encoding="utf-8") as f:
      stats = json.load(f)
    size_mb = os.path.getsize(corpus_path) / 2**20
  tokens, example_tokens = stats["tokens"], stats[f"example_tokens_seq{seq_len}"]
  return {
      "tokens": tokens, "seconds": seconds, "tokens_per_sec": tokens / seconds,
      "peak_rss_mb": peak, "start_rss_mb": start_rss, "cpu_seconds": cpu_seconds,
      "corpus_mb": size_mb, "documents": stats["documents"],
      "examples": sum(stats["examples"][str(seq_len)].values()),
      "example_tokens": example_tokens, "vocab_seconds": vocab_seconds,
      "seq_len": seq_len, "dupe_factor": dupe_factor, "workers": workers,
      "tree_peak_rss_mb": max(tree.peak_mb, peak), "parts": stats.get("parts", 1),
      "worker_threads": tree.worker_threads,
      # The names tools.bench reads.
      "median_s": seconds, "min_s": seconds, "max_s": seconds, "timed_steps": 1,
      "compile_s": 0.0, "compile_note": "", "corpus_tokens": tokens,
      "tokens_per_s": tokens / seconds, "example_tokens_per_s": example_tokens / seconds,
      "peak_mem_bytes": int(peak * 2**20), "mem_kind": "peak RSS",
      "what": f"dataset.prepare({size_mb:.0f} MiB of text, seq {seq_len}, "
              f"dupe_factor {dupe_factor}, vocab {tokenizer.vocab_size} fixed)",
  }


def _bench_main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(
      prog="python -m tools.bench_prepare",
      description="Benchmark data preparation (raw text -> stored examples) on synthetic "
                  "corpora of several sizes, each in a fresh process (clean peak RSS).")
  parser.add_argument("--megabytes", type=float, nargs="+", default=[25.0, 100.0])
  parser.add_argument("--seq-len", type=int, default=128)
  parser.add_argument("--dupe-factor", type=int, default=1)
  parser.add_argument("--workers", default="1",
                      help="comma-separated data.num_workers values, e.g. 1,2")
  parser.add_argument("--corpus", default=None, help="a corpus file instead of synthetic text")
  args = parser.parse_args(argv)
  sizes = [None] if args.corpus else args.megabytes
  workers = [int(w) for w in args.workers.split(",")]
  if max(workers) > 1:
    print(f"{max(workers)} busy processes get {parallel_capacity(max(workers)):.2f} cores here "
          f"(load average {os.getloadavg()[0]:.1f})", flush=True)
  print("| corpus MiB | workers | parts | tokens | seconds | tokens/s | scaling | CPU s "
        "| peak RSS MiB (all processes) | threads per worker | vocab s |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |", flush=True)
  for mb in sizes:
    single = None
    for w in workers:
      r = _run_one(args, mb, w)
      single = single or (r["tokens_per_sec"] if w == 1 else None)
      scaling = f"{r['tokens_per_sec'] / (w * single):.0%}" if single else "-"
      print(f"| {r['corpus_mb']:.0f} | {w} | {r['parts']} | {r['tokens']} | "
            f"{r['seconds']:.1f} | {r['tokens_per_sec']:.0f} | {scaling} | "
            f"{r['cpu_seconds']:.1f} | {r['tree_peak_rss_mb']:.0f} | "
            f"{r['worker_threads'] or '-'} | {r['vocab_seconds']:.1f} |", flush=True)


def parallel_capacity(n: int, loops: int = 20_000_000) -> float:
  """How many cores `n` CPU-bound processes really get here: n x (time of one / time of n
  at once). On a shared machine it says what scaling is possible at all."""
  code = f"s = 0\nfor i in range({loops}): s += i"
  t = time.perf_counter()
  subprocess.run([sys.executable, "-c", code], check=True)
  one = time.perf_counter() - t
  t = time.perf_counter()
  procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]
  for p in procs:
    p.wait()
  return n * one / (time.perf_counter() - t)


def _run_one(args: argparse.Namespace, mb: float | None, workers: int) -> dict:
  call = (f"benchmark_prepare(corpus_path={args.corpus!r}, megabytes={mb!r}, "
          f"seq_len={args.seq_len}, dupe_factor={args.dupe_factor}, workers={workers})")
  code = ("import json, sys; sys.path.insert(0, %r); from tools.bench_prepare import "
          "benchmark_prepare; r = %s; print('RESULT ' + json.dumps(r))" % (ROOT, call))
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
  line = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
  if out.returncode or not line:
    print(f"error: benchmark failed: {out.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
    sys.exit(2)
  return json.loads(line[0][len("RESULT "):])


if __name__ == "__main__":
  _bench_main()
