"""Benchmark: train step, feature extraction and data preparation, ours vs HF.

  python -m tools.bench                 # every case, ours + HF Flax + HF PyTorch
  python -m tools.bench --quick         # 2-layer models, small batches: plumbing only
  python -m tools.bench --cases train_base_128,features_base_128 --readme

Every (case, implementation) runs in its own worker process, one after the
other, on the same machine, with the same batch (generated from a fixed seed),
so compile caches, thread pools and peak memory do not leak between them.
Results go to tools/results/results.json and tools/results/results.md;
`--readme` also replaces the block between the bench markers in
docs/performance.md (`--readme-path` names another file).

Per case and implementation it reports the median step time of `--steps` timed
steps after `--warmup` untimed ones (with min and max), sequences/s, tokens/s,
analytic model FLOP/s (formula in `model_flops`) and its ratio to a matmul
peak measured for the same dtype and framework in the same worker just before
the case (MFU), compile time, and peak memory.

Run from the repository root. What is measured (sizes, cases, the FLOP
formula, the batch) is in `tools.cases`; our step comes from
`tools.step_builder`, the peers' from `tools.peers`; timing and memory helpers
are in `tools.measure`; data preparation is `tools.bench_prepare`.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import time
from typing import Callable, Optional, Sequence

import jax

from bert_jax.parallel import host_malloc
from bert_jax.errors import BertJaxError, ConfigError
from tools import bench_prepare, measure, peers, readme_block, step_builder
from tools.cases import CASES, Case, ModelSize, model_flops, model_sizes

README_BLOCK = "bench"  # the benchmark table's block (tools/readme_block.py)
README_PATH = "docs/performance.md"
_RESULT_TAG = "BENCH_RESULT "  # a worker's one JSON line on stdout starts with this
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
# "_masked": the peer's train step with its MLM head on the masked positions only (what a
# skilled user writes; `tools.peers`); train cases only.
IMPLS = ("ours", "hf_flax", "hf_torch", "hf_flax_masked", "hf_torch_masked", "hf_torch_compiled")
# torch.compile's first step compiles for minutes on 2 CPU cores: asked for by name
# (--impls), as on a GPU, where it is the second PyTorch row.
DEFAULT_IMPLS = IMPLS[:-1]
PEERS = IMPLS[1:]
DTYPES = ("float32", "bfloat16")
IMPL_NAMES = {"ours": "bert-jax", "hf_flax": "HF Flax", "hf_torch": "HF PyTorch",
              "hf_flax_masked": "HF Flax, masked head", "hf_torch_masked": "HF PyTorch, masked head",
              "hf_torch_compiled": "HF PyTorch, torch.compile"}


def _quick(case: Case) -> Case:
  return dataclasses.replace(case, batch=min(case.batch, 4)) if case.batch else case


def _size(case: Case, quick: bool) -> ModelSize:
  size = model_sizes()[case.model]
  return dataclasses.replace(size, num_layers=min(size.num_layers, 2)) if quick else size


# ----------------------------------------------------------------------------
# Our implementation and data preparation (the peers are in tools.peers). Each
# returns {median_s, min_s, max_s, compile_s, peak_mem_bytes, ...}.


def _run_ours(case: Case, size: ModelSize, dtype: str, warmup: int, steps: int) -> dict:
  mem = measure.Memory("jax")
  built = step_builder.build(case, size, dtype)
  return {**measure.time_steps(built.run, warmup, steps), "compile_s": built.compile_s,
          "peak_mem_bytes": mem.peak(), "mem_kind": mem.kind,
          "compile_note": "jit lower + compile"}


def _run_prepare(quick: bool) -> dict:
  """Raw text to stored examples.

  `tools.bench_prepare.benchmark_prepare` times `dataset.prepare` on a synthetic
  corpus (50 MiB; 5 MiB when quick) with a vocabulary trained beforehand, and
  returns the keys this module reads (tokens_per_s = corpus word pieces/s).
  """
  return dict(bench_prepare.benchmark_prepare(quick=quick))


# ----------------------------------------------------------------------------
# Worker (one measurement per process) and driver


@dataclasses.dataclass(frozen=True)
class Job:
  case: str  # a Case name
  impl: str  # one of IMPLS
  dtype: str
  batch: int = 0  # 0: the case's own batch size (else --batch gave one)


def _case(job: Job) -> Case:
  case = {c.name: c for c in CASES}[job.case]
  return dataclasses.replace(case, batch=job.batch) if job.batch else case


def run_job(job: Job, quick: bool, warmup: int, steps: int, peak_n: int = 0) -> dict:
  """One measurement, in this process.

  The matmul peak is timed here, right before the case, by the framework the
  case runs on: it then sees the same machine load as the case itself.
  """
  case = _case(job)
  if case.kind == "prepare":
    return _run_prepare(quick)
  if quick:
    case = _quick(case)
  size = _size(case, quick)
  framework = "torch" if job.impl.startswith("hf_torch") else "jax"
  peak = measure.matmul_peak(framework, job.dtype, peak_n)
  if job.impl == "ours":
    raw = _run_ours(case, size, job.dtype, warmup, steps)
  else:
    run = peers.run_hf_torch if framework == "torch" else peers.run_hf_flax
    compiled = {"compiled": True} if job.impl == "hf_torch_compiled" else {}  # masked head too
    raw = run(case, size, job.dtype, warmup, steps,
              masked=job.impl.endswith(("_masked", "_compiled")), **compiled)
  return {**raw, "matmul_peak": {
      k: peak[k] for k in ("framework", "dtype", "n", "flops_per_s", "min_s", "max_s")}}


# --malloc: the host allocator of every worker, ours and peers alike.
MALLOCS = ("huge-pages", "system", "retain", "jemalloc", "tcmalloc")
# glibc keeping what it frees: one arena, no mmap'd chunks, no trimming (what a
# PyTorch-on-CPU tuning guide gets from jemalloc or tcmalloc, without a library).
RETAIN = ("glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:"
          "glibc.malloc.trim_threshold=4294967296")
_PRELOADS = {"jemalloc": "libjemalloc.so.2", "tcmalloc": "libtcmalloc_minimal.so.4"}
_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
             "/usr/lib", "/usr/local/lib")


def worker_malloc(malloc: str, environ=os.environ) -> dict[str, str]:
  """The environment variables that give every worker the `--malloc` allocator.

  'huge-pages' is what bert-jax's own commands run with on a CPU-only host
  (`bert_jax.parallel.host_malloc`; {} where it does not apply), 'system' leaves
  glibc as it is, 'retain' makes glibc keep freed memory (RETAIN), 'jemalloc' and
  'tcmalloc' preload that library. Ours and the peers get the same, so a
  comparison is of the steps, not of page faults; run the bench once per
  allocator to give each implementation its best."""
  if malloc == "system":
    return {}
  if malloc == "huge-pages":
    env = host_malloc.tuned_here(environ)
    return {"GLIBC_TUNABLES": env["GLIBC_TUNABLES"]} if env else {}
  if malloc == "retain":
    return {"GLIBC_TUNABLES": ":".join(filter(None, [environ.get("GLIBC_TUNABLES", ""), RETAIN]))}
  lib = _PRELOADS.get(malloc)
  if lib is None:
    raise ConfigError(f"--malloc={malloc!r}: expected one of {list(MALLOCS)}")
  for d in _LIB_DIRS:
    if os.path.exists(os.path.join(d, lib)):
      return {"LD_PRELOAD": os.path.join(d, lib)}
  package = {"jemalloc": "libjemalloc2", "tcmalloc": "libtcmalloc-minimal4"}[malloc]
  raise ConfigError(f"--malloc={malloc}: no {lib} in {', '.join(_LIB_DIRS)}; install it "
                    f"(Debian/Ubuntu: apt install {package})")


def _describe(env: dict[str, str]) -> str:
  return ", ".join(f"{k}={v}" for k, v in env.items()) or "glibc's defaults"


# The bench process itself asks JAX what the machine is (native_bf16, machine_info). On a
# GPU, JAX would then take 75% of its memory for good, away from the workers that
# measure: the parent runs without preallocation, and its workers as they would alone.
_PARENT_ONLY_ENV = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
_parent_set: set = set()


def _parent_env() -> None:
  """Sets the parent-only variables the user has not set (before JAX opens a device)."""
  for name, value in _PARENT_ONLY_ENV.items():
    if name not in os.environ:
      os.environ[name] = value
      _parent_set.add(name)


def _worker_env(malloc: str = "huge-pages") -> dict:
  env = {k: v for k, v in os.environ.items() if k not in _parent_set}
  env.update(worker_malloc(malloc, env))
  # One real device per worker: drop the tests' simulated-device flag.
  flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "", env.get("XLA_FLAGS", ""))
  env["XLA_FLAGS"] = flags.strip()
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  env["TOKENIZERS_PARALLELISM"] = env.get("TOKENIZERS_PARALLELISM", "true")
  # Workers run `-m tools.bench` from the repository root, with it on the path.
  env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH", "")) if p)
  return env


def _run_in_worker(job: Job, quick: bool, warmup: int, steps: int, timeout: float,
                   peak_n: int = 0, malloc: str = "huge-pages") -> dict:
  cmd = [sys.executable, "-m", "tools.bench", "--worker",
         json.dumps(dataclasses.asdict(job)), "--warmup", str(warmup), "--steps", str(steps),
         "--peak-n", str(peak_n)]
  if quick:
    cmd.append("--quick")
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_worker_env(malloc),
                          timeout=timeout, cwd=ROOT)
  except subprocess.TimeoutExpired:
    return {"error": f"timed out after {timeout:.0f} s"}
  for line in proc.stdout.splitlines():
    if line.startswith(_RESULT_TAG):
      return json.loads(line[len(_RESULT_TAG):])
  tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
  return {"error": f"worker exited {proc.returncode}: {tail[:300]}"}


def peers_available() -> dict[str, Optional[str]]:
  """impl -> None if importable, else why not (peers are optional)."""
  out: dict[str, Optional[str]] = {"ours": None}
  if importlib.util.find_spec("transformers") is None:
    out["hf_flax"] = out["hf_torch"] = "transformers is not installed"
  else:
    version = importlib.metadata.version("transformers")
    out["hf_flax"] = (None if int(version.split(".")[0]) < 5 else  # v5 dropped the Flax models
                      f"transformers {version} has no Flax models (requirements-peers.txt "
                      "pins 4.57.6)")
    out["hf_torch"] = (None if importlib.util.find_spec("torch") is not None
                       else "torch is not installed")
  out["hf_flax_masked"] = out["hf_flax"]
  out["hf_torch_masked"] = out["hf_torch_compiled"] = out["hf_torch"]
  return out


def native_bf16() -> bool:
  """Whether this machine's dots run bf16 natively: a GPU/TPU, or a CPU with AMX or AVX-512 BF16."""
  from bert_jax.model import precision  # the one reader of /proc/cpuinfo
  return jax.devices()[0].platform != "cpu" or bool(
      {"amx_bf16", "avx512_bf16"} & precision.cpu_flags())


def config_dtype(size: ModelSize, bf16: bool) -> str:
  """The dtype our config for `size` computes in on this machine: 'auto' resolved as the
  trainer resolves it (bfloat16 where bf16 dots are native, else float32)."""
  if size.default_dtype != "auto":
    return size.default_dtype
  return "bfloat16" if bf16 else "float32"


def plan(cases: Sequence[Case], impls: Sequence[str], all_dtypes: bool = False,
         bf16: Optional[bool] = None, dtypes: Sequence[str] = DTYPES) -> list[Job]:
  """Every (case, impl, dtype) to run.

  Everybody runs in float32 (the peers' default); masked-head peers only on
  train cases. Ours also runs in its config's dtype where that differs
  (BERT-Base: bfloat16) on the mixed precision case, train_base_128, or on
  every case with `all_dtypes`. Where bf16 dots are native (`bf16`, default:
  `native_bf16()`), ours and every peer also run in bfloat16 on every case
  (PyTorch under `torch.autocast`, HF Flax with `dtype=bfloat16`): the peer a
  skilled user would pick there. Without it the full run must fit in 25
  minutes on 2 cores. `dtypes` keeps the jobs of those dtypes only (a GPU run:
  bfloat16, to fit a short lease).
  """
  return [j for j in _plan_all(cases, impls, all_dtypes, bf16)
          if j.dtype in dtypes or not j.dtype]


def _plan_all(cases: Sequence[Case], impls: Sequence[str], all_dtypes: bool,
              bf16: Optional[bool]) -> list[Job]:
  bf16 = native_bf16() if bf16 is None else bf16
  jobs = []
  sizes = model_sizes()
  for case in cases:
    if case.kind == "prepare":
      jobs.append(Job(case.name, "ours", ""))
      continue
    default = config_dtype(sizes[case.model], bf16)
    for impl in impls:
      if impl.endswith("_masked") and case.kind != "train":
        continue  # no MLM head in feature extraction
      if impl == "ours" and (bf16 or default != "float32" and (
          all_dtypes or case.name == "train_base_128")):
        jobs.append(Job(case.name, impl, "bfloat16" if bf16 else default, case.batch))
      elif bf16 and impl != "ours":
        jobs.append(Job(case.name, impl, "bfloat16", case.batch))
      jobs.append(Job(case.name, impl, "float32", case.batch))
  return jobs


def derive(job: Job, raw: dict, quick: bool) -> dict:
  """Adds throughput, FLOP/s and MFU to a worker's raw timing."""
  row = {"case": job.case, "impl": job.impl, "dtype": job.dtype, **raw}
  if "error" in raw:
    return row
  case = _case(job)
  if case.kind == "prepare":
    return row
  case = _quick(case) if quick else case
  size = _size(case, quick)
  row.update(batch=case.batch, seq_len=case.seq_len, predictions=case.predictions,
             model=dataclasses.asdict(size), model_name=case.model,
             default_dtype=job.dtype == config_dtype(size, native_bf16()))
  t = raw["median_s"]
  flops = model_flops(size, case.kind, case.batch, case.seq_len, case.predictions)
  row.update(sequences_per_s=case.batch / t, tokens_per_s=case.batch * case.seq_len / t,
             model_flops_per_step=flops, model_flops_per_s=flops / t)
  row["mfu"] = row["model_flops_per_s"] / raw["matmul_peak"]["flops_per_s"]
  return row


def add_ratios(rows: list[dict]) -> None:
  """ours/peer throughput ratios (same case and batch) on every 'ours' row: against the
  peer row of the same dtype, else (ours in bf16, the peer in float32 only) its float32 row."""
  for row in rows:
    if row["impl"] != "ours" or "tokens_per_s" not in row:
      continue
    for peer in PEERS:
      other = [r for r in rows if r["case"] == row["case"] and r["impl"] == peer
               and "tokens_per_s" in r]
      other.sort(key=lambda r: r["dtype"] != row["dtype"])  # the same dtype first
      if other:
        row[f"ratio_vs_{peer}"] = row["tokens_per_s"] / other[0]["tokens_per_s"]


# ----------------------------------------------------------------------------
# Reporting


def machine_info() -> dict:
  from bert_jax.model import precision  # the one reader of /proc/cpuinfo
  cpu = precision.cpu_model() or platform.processor() or "unknown"
  info = {"cpu": cpu, "cores": os.cpu_count(), "gpu": None, "python": platform.python_version()}
  versions = {}
  for mod in ("jax", "jaxlib", "flax", "optax", "transformers", "torch"):
    try:
      versions[mod] = __import__(mod).__version__
    except Exception:  # optional peers may be absent or broken
      versions[mod] = None
  info["versions"] = versions
  try:
    dev = jax.devices()[0]
    if dev.platform != "cpu":
      info["gpu"] = getattr(dev, "device_kind", dev.platform)
  except Exception:
    pass
  return info


def _fmt(x: Optional[float], spec: str) -> str:
  return "—" if x is None else format(x, spec)


def _si(x: Optional[float]) -> str:
  if x is None:
    return "—"
  for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
    if abs(x) >= scale:
      return f"{x / scale:.3g} {unit}"
  return f"{x:.3g}"


def markdown(result: dict) -> str:
  """The results table, the ratios, the machine and the command, as markdown."""
  rows, m = result["rows"], result["machine"]
  peers_shown = [p for p in PEERS if any(r["impl"] == p for r in rows)]
  lines = ["| case | implementation | dtype | B×L | step ms: median (min–max) | seq/s | "
           "tokens/s | model FLOP/s | matmul peak FLOP/s | MFU | compile s | peak mem MiB | "
           + "".join(f"ours ÷ {IMPL_NAMES[p]} | " for p in peers_shown).rstrip(),
           "| --- " * (12 + len(peers_shown)) + "|"]
  for r in rows:
    if r["case"] == "prepare":
      continue
    name = IMPL_NAMES.get(r["impl"], r["impl"])
    if r["impl"] == "ours" and r.get("default_dtype"):
      name += " (config default)"
    bxl = f"{r.get('batch', '')}×{r.get('seq_len', '')}"
    if "error" in r:
      lines.append(f"| {r['case']} | {name} | {r['dtype']} | {bxl} | error: {r['error']} "
                   + "| " * (7 + len(peers_shown)) + "|")
      continue
    lines.append(
        f"| {r['case']} | {name} | {r['dtype']} | {bxl} | "
        f"{r['median_s'] * 1e3:.1f} ({r['min_s'] * 1e3:.1f}–{r['max_s'] * 1e3:.1f}) | "
        f"{r['sequences_per_s']:.1f} | {r['tokens_per_s']:.0f} | "
        f"{_si(r['model_flops_per_s'])} | {_si(r['matmul_peak']['flops_per_s'])} "
        f"({r['matmul_peak']['framework']}) | {100 * r['mfu']:.0f}% | "
        f"{r['compile_s']:.1f} | {r['peak_mem_bytes'] / 2**20:.0f} | "
        + "".join(f"{_fmt(r.get(f'ratio_vs_{p}'), '.2f')} | " for p in peers_shown).rstrip())
  for r in rows:
    if r["case"] == "prepare":
      if "error" in r:
        lines.append(f"\nData preparation: error: {r['error']}")
      else:
        lines.append(
            f"\nData preparation ({r.get('what', 'dataset.prepare')}): "
            f"{r['median_s']:.1f} s, {r['tokens_per_s']:.0f} corpus tokens/s"
            + (f", {r['example_tokens_per_s']:.0f} example tokens/s"
               if "example_tokens_per_s" in r else "")
            + f", peak mem {r['peak_mem_bytes'] / 2**20:.0f} MiB.")
  v = m["versions"]
  mem_kinds = sorted({r.get("mem_kind") for r in rows if r.get("mem_kind")})
  lines += [
      "",
      f"Machine: {m['cpu']}, {m['cores']} cores, GPU: {m['gpu'] or 'none'}. "
      "PyTorch bfloat16 rows run under `torch.autocast`, HF Flax ones with "
      "`dtype=bfloat16`; a masked head computes the MLM "
      "logits on the masked positions only (ours always does). "
      "Matmul peak: a jitted dot accumulating and returning float32 (jax rows, "
      "`measure.jax_peak_dot`; for bf16 the bf16 × bf16 → f32 dot mixed precision runs) or "
      "`torch.mm` (PyTorch "
      f"rows) of two {result['peak_n']}² matrices in the row's dtype, median of 10, timed "
      "in the row's worker just before it; MFU = model FLOP/s ÷ that peak.",
      "Versions: " + ", ".join(f"{k} {v[k]}" for k in v if v[k]) + ". "
      f"Date: {result['date']}. Memory: {', '.join(mem_kinds)}. "
      f"Median of {result['steps']} timed steps after {result['warmup']} warm-up steps"
      + (" (QUICK run: 2-layer models, batch ≤ 4; plumbing check, not a measurement)"
         if result["quick"] else "") + ".",
      f"Command: `{result['command']}`",
  ]
  if result.get("malloc"):
    lines[-1:-1] = [
        f"Host allocator, the same for every worker (ours and peers): {result['malloc']}"
        + (", what bert-jax's commands set on a CPU-only host" if "hugetlb" in result["malloc"]
           else "") + " (`--malloc`: huge-pages, system, retain, jemalloc, tcmalloc)."]
  if result.get("replaced"):
    lines.append("Measured again in a later run, replacing the earlier run's rows: " + ", ".join(
        f"{IMPL_NAMES.get(impl, impl)} {dtype} on {case}" for case, impl, dtype in
        result["replaced"]) + ".")
  for impl, why in result.get("skipped", {}).items():
    lines.append(f"Skipped {IMPL_NAMES.get(impl, impl)}: {why}.")
  if result.get("partial"):
    lines.append(f"PARTIAL run: it stopped after these {len(rows)} rows; the rest of "
                 "the plan was not measured.")
  return "\n".join(lines) + "\n"


def merge(results: Sequence[dict], names: Sequence[str] = ()) -> dict:
  """Several runs' results (say, two device calls) as one: the rows in order, ratios
  over all of them. They must come from one machine."""
  machines = {(r["machine"]["cpu"], r["machine"]["gpu"]) for r in results}
  if len(machines) != 1:
    raise ConfigError(f"{', '.join(names) or 'results'}: from different machines "
                      f"{sorted(machines, key=str)}; expected one")
  # A row measured again in a later file (same case, implementation, dtype and batch)
  # replaces the earlier one in place: a run that remeasures a few rows after a fix.
  rows, where, replaced = [], {}, []
  for row in (dict(row) for r in results for row in r["rows"]):
    key = (row["case"], row["impl"], row["dtype"], row.get("batch"))
    if key in where:
      rows[where[key]] = row
      replaced.append(key)
    else:
      where[key] = len(rows)
      rows.append(row)
  add_ratios(rows)
  dates = list(dict.fromkeys(r["date"] for r in results))
  return {**results[-1], "rows": rows, "date": " and ".join(dates),
          "replaced": [list(k[:3]) for k in replaced],
          "peak_n": next((r["peak_n"] for r in results if r.get("peak_n")), None),
          "partial": any(r.get("partial") for r in results),
          "skipped": {k: v for r in results for k, v in r.get("skipped", {}).items()},
          "command": " ; ".join(r["command"] for r in results)}


def load_results(paths: Sequence[str]) -> dict:
  """The results JSON files `paths` (as `--out` wrote them), merged."""
  results = []
  for path in paths:
    try:
      with open(path) as f:
        results.append(json.load(f))
    except ValueError as e:
      raise ConfigError(f"{path}: not a results JSON written by tools.bench ({e})") from e
    if not isinstance(results[-1], dict) or "rows" not in results[-1]:
      raise ConfigError(f"{path}: expected a results JSON written by tools.bench "
                        "(an object with 'rows')")
  return merge(results, paths)


def _write_atomic(path: str, text: str) -> None:
  from bert_jax.storage import fs  # the package's one writer of whole files
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fs.write_atomic_local(path, lambda f: f.write(text.encode("utf-8")))


def run_benchmark(cases: Sequence[Case], impls: Sequence[str], quick: bool, warmup: int,
                  steps: int, in_process: bool = False, timeout: float = 1800,
                  command: str = "", log: Callable[[str], None] = print,
                  peak_n: int = 0, all_dtypes: bool = False,
                  malloc: str = "huge-pages", dtypes: Sequence[str] = DTYPES,
                  on_row: Callable[[dict], None] = lambda result: None) -> dict:
  """Runs every job (each in a worker process unless `in_process`) and derives metrics.

  `on_row` gets the result so far (marked partial) after each row: a run cut
  short, as on a device lease, keeps what it measured."""
  available = peers_available()
  skipped = {i: available[i] for i in impls if available.get(i)}
  impls = [i for i in impls if not available.get(i)]
  for impl, why in skipped.items():
    log(f"skipping {IMPL_NAMES[impl]}: {why}")
  jobs = plan(cases, impls, all_dtypes, dtypes=dtypes)

  def run(job):
    if in_process:
      try:
        return run_job(job, quick, warmup, steps, peak_n)
      except BertJaxError as e:
        return {"error": str(e)}
    return _run_in_worker(job, quick, warmup, steps, timeout, peak_n, malloc)

  rows = []

  def result(partial: bool) -> dict:
    add_ratios(rows)
    peak_n = next((r["matmul_peak"]["n"] for r in rows if "matmul_peak" in r), None)
    return {"rows": rows, "peak_n": peak_n, "partial": partial,
            "machine": machine_info(), "quick": quick, "steps": steps, "warmup": warmup,
            "skipped": skipped, "command": command,
            "malloc": ("the bench process's own" if in_process
                       else f"{malloc} ({_describe(worker_malloc(malloc))})"),
            "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")}

  for job in jobs:
    t = time.perf_counter()
    row = derive(job, run(job), quick)
    rows.append(row)
    what = row.get("error") or (f"{row['median_s'] * 1e3:.1f} ms/step" + (
        f", {row['tokens_per_s']:.0f} tokens/s, MFU {100 * row['mfu']:.0f}%"
        if "mfu" in row else ""))
    log(f"{job.case:18s} {IMPL_NAMES[job.impl]:11s} {job.dtype or '-':9s} {what} "
        f"[{time.perf_counter() - t:.0f} s]")
    on_row(result(partial=True))
  return result(partial=False)


def _parse(argv: Optional[Sequence[str]]) -> argparse.Namespace:
  p = argparse.ArgumentParser(prog="python -m tools.bench", description=__doc__.split("\n")[0])
  p.add_argument("--quick", action="store_true",
                 help="2-layer models and batch <= 4: checks the plumbing, measures nothing")
  p.add_argument("--cases", default="all",
                 help="comma-separated, from: " + ", ".join(c.name for c in CASES))
  p.add_argument("--impls", default=",".join(DEFAULT_IMPLS), help="comma-separated, from: "
                 + ", ".join(IMPLS) + f" (default: all but {IMPLS[-1]})")
  p.add_argument("--steps", type=int, default=None, help="timed steps (default 10; quick 3)")
  p.add_argument("--warmup", type=int, default=None, help="untimed steps after compiling (default 1)")
  p.add_argument("--out", default="tools/results/results.json", help="JSON results")
  p.add_argument("--md", default="tools/results/results.md", help="markdown table")
  p.add_argument("--readme", action="store_true",
                 help="replace the table between the %s and %s lines of --readme-path"
                 % readme_block.markers(README_BLOCK))
  p.add_argument("--readme-path", default=README_PATH,
                 help=f"the guide holding the benchmark table (default {README_PATH})")
  p.add_argument("--in-process", action="store_true",
                 help="run every measurement in this process (tests; memory is then cumulative)")
  p.add_argument("--timeout", type=float, default=1800, help="seconds per worker")
  p.add_argument("--all-dtypes", action="store_true",
                 help="ours also in its config dtype (bfloat16 for BERT-Base) on every case, "
                      "not only train_base_128")
  p.add_argument("--dtypes", default=",".join(DTYPES),
                 help="comma-separated: run only the rows of these dtypes, from "
                      f"{', '.join(DTYPES)} (default: both; bfloat16 rows where bf16 dots "
                      "are native, or for ours' config dtype)")
  p.add_argument("--peak-n", type=int, default=0,
                 help="size of the square matmul timed for the peak (default 2048 on CPU, "
                      "8192 on GPU)")
  p.add_argument("--batch", default="", metavar="CASE=N,...",
                 help="other batch sizes for some cases, e.g. train_base_128=256,"
                      "features_base_128=512 on a GPU (the cases' own are sized for 2 CPU "
                      "cores)")
  p.add_argument("--malloc", default="huge-pages", choices=MALLOCS,
                 help="host allocator of every worker, ours and peers alike: glibc with "
                      "transparent huge pages, as bert-jax's commands run (default); glibc's "
                      "defaults; glibc keeping freed memory; or jemalloc / tcmalloc preloaded")
  p.add_argument("--from-json", default="", metavar="JSON,...",
                 help="run nothing: write --md (and --readme) from these results files, "
                      "merged (e.g. the JSON of two device calls)")
  p.add_argument("--worker", help=argparse.SUPPRESS)
  return p.parse_args(argv)


def _with_batches(chosen: list, spec: str) -> list:
  """The chosen cases, with the batch sizes `--batch` gives (CASE=N, comma-separated)."""
  batches = {}
  for item in filter(None, (i.strip() for i in spec.split(","))):
    name, _, value = item.partition("=")
    if name not in {c.name for c in chosen} or not value.isdigit() or int(value) < 1:
      raise ConfigError(f"--batch={spec!r}: {item!r} is not CASE=N with CASE one of the "
                        f"chosen cases {[c.name for c in chosen]} and N a positive integer")
    batches[name] = int(value)
  return [dataclasses.replace(c, batch=batches[c.name]) if c.name in batches else c
          for c in chosen]


def _measure(args: argparse.Namespace, argv: Optional[Sequence[str]], steps: int,
             warmup: int) -> dict:
  """Checks the command line, runs the benchmark, and returns its result."""
  by_name = {c.name: c for c in CASES}
  names = list(by_name) if args.cases == "all" else [
      n.strip() for n in args.cases.split(",") if n.strip()]
  bad = [n for n in names if n not in by_name]
  if bad or not names:
    raise ConfigError(f"--cases={args.cases!r}: unknown {bad}; expected a comma-separated "
                      f"list from {list(by_name)} or 'all'")
  chosen = _with_batches([by_name[n] for n in names], args.batch)
  impls = [i.strip() for i in args.impls.split(",") if i.strip()]
  if not impls or any(i not in IMPLS for i in impls) or "ours" not in impls:
    raise ConfigError(f"--impls={args.impls!r}: expected 'ours' plus any of "
                      f"{list(PEERS)}, comma-separated")
  dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
  if not dtypes or any(d not in DTYPES for d in dtypes):
    raise ConfigError(f"--dtypes={args.dtypes!r}: expected any of {list(DTYPES)}, "
                      "comma-separated")
  if steps < 1 or warmup < 0:
    raise ConfigError(f"--steps={steps} --warmup={warmup}: expected steps >= 1, warmup >= 0")
  worker_malloc(args.malloc)  # fail before the (long) run: a missing allocator library
  command = "python -m tools.bench " + " ".join(
      a for a in (argv if argv is not None else sys.argv[1:]))
  return run_benchmark(chosen, impls, args.quick, warmup, steps,
                       args.in_process, args.timeout, command.strip(),
                       peak_n=args.peak_n, all_dtypes=args.all_dtypes,
                       malloc=args.malloc, dtypes=dtypes,
                       on_row=lambda partial: _write_atomic(
                           args.out, json.dumps(partial, indent=1, default=str) + "\n"))


def main(argv: Optional[Sequence[str]] = None) -> int:
  args = _parse(argv)
  steps = args.steps if args.steps is not None else (3 if args.quick else 10)
  warmup = args.warmup if args.warmup is not None else 1
  if args.worker:
    job = Job(**json.loads(args.worker))
    try:
      out = run_job(job, args.quick, warmup, steps, args.peak_n)
    except BertJaxError as e:
      out = {"error": str(e)}
    print(_RESULT_TAG + json.dumps(out), flush=True)
    return 0
  _parent_env()
  try:
    if args.readme:  # fail before the (long) run, not after it
      readme_block.check(args.readme_path, README_BLOCK)
    if args.from_json:  # render saved results: nothing runs, --out is left alone
      result = load_results([p.strip() for p in args.from_json.split(",") if p.strip()])
      written = [args.md]
    else:
      result = _measure(args, argv, steps, warmup)
      _write_atomic(args.out, json.dumps(result, indent=1, default=str) + "\n")
      written = [args.out, args.md]
    table = markdown(result)
    print("\n" + table)
    _write_atomic(args.md, table)
    if args.readme:
      readme_block.rewrite(args.readme_path, README_BLOCK, table)
      written.append(args.readme_path)
    print(f"wrote {', '.join(written)}")
  except (BertJaxError, OSError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
