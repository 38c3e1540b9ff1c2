"""Benchmark: train step, feature extraction and data preparation, ours vs HF.

  python -m bert_jax.bench                 # every case, ours + HF Flax + HF PyTorch
  python -m bert_jax.bench --quick         # 2-layer models, small batches: plumbing only
  python -m bert_jax.bench --cases train_base_128,features_base_128 --readme

Every (case, implementation) runs in its own worker process, one after the
other, on the same machine, with the same batch (generated from a fixed seed),
so compile caches, thread pools and peak memory do not leak between them.
Results go to bench/results.json and bench/results.md; `--readme` also
replaces the block between the bench markers in README.md.

Per case and implementation it reports the median step time of `--steps` timed
steps after `--warmup` untimed ones (with min and max), sequences/s, tokens/s,
analytic model FLOP/s (formula in `model_flops`) and its ratio to a matmul
peak measured for the same dtype and framework in the same worker just before
the case (MFU), compile time, and peak memory.

Shape legend: B batch, L sequence length, P masked positions (max predictions),
D hidden size, F feed-forward size, V vocabulary size, N layers.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np

from bert_jax.errors import BertJaxError, ConfigError

README_START, README_END = "<!-- bench:start -->", "<!-- bench:end -->"
_RESULT_TAG = "BENCH_RESULT "  # a worker's one JSON line on stdout starts with this
SPECIAL_IDS = [0, 1, 2, 3, 4]  # [PAD] [UNK] [CLS] [SEP] [MASK], as bert_jax.tokenizer
PAD, CLS, SEP, MASK = 0, 2, 3, 4


# ----------------------------------------------------------------------------
# What is measured


@dataclasses.dataclass(frozen=True)
class ModelSize:
  num_layers: int
  hidden_size: int
  num_heads: int
  intermediate_size: int
  vocab_size: int
  default_dtype: str  # the compute dtype our config for this size uses


def model_sizes() -> dict[str, ModelSize]:
  """tiny = configs/tiny.py, base = configs/base.py; small = L4 H256 in between."""
  from configs import base, tiny
  out = {}
  for name, c in (("tiny", tiny.get_config()), ("base", base.get_config())):
    m = c.model
    out[name] = ModelSize(m.num_layers, m.hidden_size, m.num_heads, m.intermediate_size,
                          c.data.vocab_size, m.dtype)
  out["small"] = ModelSize(4, 256, 4, 1024, 30522, tiny.get_config().model.dtype)
  return out


@dataclasses.dataclass(frozen=True)
class Case:
  name: str
  kind: str  # 'train' | 'features' | 'prepare'
  model: str = ""  # key of model_sizes()
  batch: int = 0
  seq_len: int = 0
  predictions: int = 0  # masked positions per sequence (train)


CASES = (
    Case("train_tiny_128", "train", "tiny", 32, 128, 20),
    Case("train_tiny_512", "train", "tiny", 8, 512, 80),
    Case("train_small_128", "train", "small", 16, 128, 20),
    Case("train_base_128", "train", "base", 8, 128, 20),
    Case("train_base_512", "train", "base", 2, 512, 80),
    Case("features_base_128", "features", "base", 32, 128),
    Case("prepare", "prepare"),
)
IMPLS = ("ours", "hf_flax", "hf_torch")
IMPL_NAMES = {"ours": "bert-jax", "hf_flax": "HF Flax", "hf_torch": "HF PyTorch"}


def _quick(case: Case) -> Case:
  return dataclasses.replace(case, batch=min(case.batch, 4)) if case.batch else case


def _size(case: Case, quick: bool) -> ModelSize:
  size = model_sizes()[case.model]
  return dataclasses.replace(size, num_layers=min(size.num_layers, 2)) if quick else size


def model_flops(size: ModelSize, kind: str, batch: int, seq_len: int,
                predictions: int = 0) -> float:
  """Analytic model FLOPs of one step; the same formula for every implementation.

  Matmuls only, 2 FLOPs per multiply-add. Per token and layer the projections
  cost 2 * (4*D*D + 2*D*F) and attention scores plus the weighted sum 4*L*D.
  The pooler is 2*D*D per sequence. The MLM head (dense + vocabulary
  projection, 2*D*D + 2*D*V) is counted on the P masked positions only: that
  is all a pre-training step needs, whether an implementation computes it on
  all L positions (HF) or not (ours). NSP, embeddings, LayerNorm, softmax and
  GELU are left out. A train step counts 3x the forward (backward = 2x).
  """
  d, f, v, n = size.hidden_size, size.intermediate_size, size.vocab_size, size.num_layers
  per_token = n * (2 * (4 * d * d + 2 * d * f) + 4 * seq_len * d)
  forward = batch * (seq_len * per_token + 2 * d * d)
  if kind == "features":
    return float(forward)
  forward += batch * predictions * (2 * d * d + 2 * d * v)
  return 3.0 * forward


# ----------------------------------------------------------------------------
# Inputs: one batch for everybody


def make_batch(case: Case, vocab_size: int, seed: int = 0) -> dict[str, np.ndarray]:
  """[CLS] A [SEP] B [SEP] with random word-piece ids, no padding, fixed seed.

  Masking is drawn once here (15% of the non-special tokens, capped at P,
  80/10/10) for the peers; ours masks inside its jitted step, as in training.
  """
  rs = np.random.RandomState(seed)
  B, L = case.batch, case.seq_len
  ids_BxL = rs.randint(len(SPECIAL_IDS), vocab_size, size=(B, L)).astype(np.int32)
  sep = L // 2
  ids_BxL[:, 0], ids_BxL[:, sep], ids_BxL[:, -1] = CLS, SEP, SEP
  seg_BxL = np.zeros_like(ids_BxL)
  seg_BxL[:, sep + 1:] = 1
  batch = {"input_ids": ids_BxL, "segment_ids": seg_BxL,
           "input_mask": np.ones_like(ids_BxL),
           "next_sentence_label": rs.randint(0, 2, size=B).astype(np.int32)}
  if case.predictions:
    labels_BxL = np.full_like(ids_BxL, -100)  # -100 = not predicted (HF's convention)
    masked_BxL = ids_BxL.copy()
    n = min(case.predictions, max(1, round(0.15 * (L - 3))))
    for b in range(B):
      candidates = np.setdiff1d(np.arange(L), [0, sep, L - 1])
      pos = np.sort(rs.choice(candidates, n, replace=False))
      labels_BxL[b, pos] = ids_BxL[b, pos]
      action = rs.rand(n)
      masked_BxL[b, pos] = np.where(action < 0.8, MASK, np.where(
          action < 0.9, rs.randint(len(SPECIAL_IDS), vocab_size, size=n), ids_BxL[b, pos]))
    batch["masked_ids"], batch["mlm_labels"] = masked_BxL, labels_BxL
  return batch


# ----------------------------------------------------------------------------
# Memory and timing helpers (run inside a worker)


def _rss_bytes() -> int:
  import psutil
  return psutil.Process().memory_info().rss


def _peak_rss_bytes() -> int:
  import resource
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


class _Memory:
  """Peak memory during a measurement: XLA/CUDA allocator stats on GPU, else RSS."""

  def __init__(self, framework: str):
    self.framework = framework
    self.kind = "cpu_peak_rss_delta"
    if framework == "jax":
      import jax
      stats = jax.devices()[0].memory_stats() if jax.devices()[0].platform == "gpu" else None
      if stats and "peak_bytes_in_use" in stats:
        self.kind = "xla_peak_bytes_in_use"
    elif framework == "torch":
      import torch
      if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
        self.kind = "torch_cuda_max_memory_allocated"
    self.base = _rss_bytes()

  def peak(self) -> int:
    if self.kind == "xla_peak_bytes_in_use":
      import jax
      return int(jax.devices()[0].memory_stats()["peak_bytes_in_use"])
    if self.kind == "torch_cuda_max_memory_allocated":
      import torch
      return int(torch.cuda.max_memory_allocated())
    # The worker's high-water mark minus its RSS after imports, before the
    # model existed: parameters, optimizer state, activations and compiler.
    return max(0, _peak_rss_bytes() - self.base)


def _time_steps(step: Callable[[int], Any], warmup: int, steps: int) -> dict:
  """Runs `step(i)` warmup + steps times; median, min and max of the timed ones."""
  for i in range(warmup):
    step(i)
  wall, cpu = [], []
  for i in range(warmup, warmup + steps):
    t, c = time.perf_counter(), time.process_time()
    step(i)
    wall.append(time.perf_counter() - t)
    cpu.append(time.process_time() - c)
  # Process CPU seconds too: on a shared machine they move less than wall time.
  return {"median_s": statistics.median(wall), "min_s": min(wall), "max_s": max(wall),
          "timed_steps": len(wall), "median_cpu_s": statistics.median(cpu)}


# ----------------------------------------------------------------------------
# Implementations. Each returns {median_s, min_s, max_s, compile_s, peak_mem_bytes, ...}.


def ours_config(size: ModelSize, case: Case, dtype: str):
  """Our config for one case: the default config at this size, batch and length."""
  from configs import default
  c = default.get_config()
  m = c.model
  m.num_layers, m.hidden_size, m.num_heads = size.num_layers, size.hidden_size, size.num_heads
  m.intermediate_size, m.dtype = size.intermediate_size, dtype
  c.train.batch_size = case.batch
  c.train.phase_fractions, c.train.seq_lens = (1.0,), (case.seq_len,)
  c.train.max_predictions = (max(1, case.predictions),)
  c.train.warmup_steps = 10  # the schedule's shape costs nothing; keep lr non-zero
  return c


def _run_ours(case: Case, size: ModelSize, dtype: str, warmup: int, steps: int) -> dict:
  import jax
  import jax.numpy as jnp
  from bert_jax import sharding
  from bert_jax.model import BertModel
  from bert_jax.trainer import Trainer, model_config

  config = ours_config(size, case, dtype)
  mem = _Memory("jax")
  mesh = sharding.make_mesh(1, devices=jax.devices()[:1])
  batch = make_batch(case, size.vocab_size)
  if case.kind == "train":
    # The real training step of bert_jax.trainer: masking, forward, backward,
    # clipping, AdamW, all in one jitted function with donated state.
    trainer = Trainer(config, model_config(config, size.vocab_size), SPECIAL_IDS, MASK, mesh=mesh)
    params, opt_state = trainer.init_state()
    fn = trainer.train_step_fn(case.predictions)
    gb = sharding.global_batch({k: batch[k] for k in (
        "input_ids", "segment_ids", "input_mask", "next_sentence_label")}, mesh)
    t = time.perf_counter()
    compiled = fn.lower(params, opt_state, jnp.int32(0), gb).compile()
    compile_s = time.perf_counter() - t
    state = [params, opt_state]

    def step(i):
      state[0], state[1], metrics = compiled(state[0], state[1], jnp.int32(i), gb)
      jax.block_until_ready((state, metrics))
  else:
    bert_config = model_config(config, size.vocab_size)
    model = BertModel(bert_config)
    ids, seg, msk = (jax.device_put(batch[k]) for k in ("input_ids", "segment_ids", "input_mask"))
    params = jax.jit(lambda k: model.init(k, ids[:1, :8], seg[:1, :8], msk[:1, :8]))(
        jax.random.key(0))["params"]
    params = jax.tree.map(lambda x: getattr(x, "value", x), params,
                          is_leaf=lambda x: hasattr(x, "value"))

    def extract(p, ids_BxL, seg_BxL, mask_BxL):
      out = model.apply({"params": p}, ids_BxL, seg_BxL, mask_BxL)
      return out.sequence_BxLxD, out.pooled_BxD

    t = time.perf_counter()
    compiled = jax.jit(extract).lower(params, ids, seg, msk).compile()
    compile_s = time.perf_counter() - t

    def step(i):
      jax.block_until_ready(compiled(params, ids, seg, msk))
  return {**_time_steps(step, warmup, steps), "compile_s": compile_s,
          "peak_mem_bytes": mem.peak(), "mem_kind": mem.kind,
          "compile_note": "jit lower + compile"}


def _hf_config(size: ModelSize, dropout: bool = True):
  from transformers import BertConfig as HFBertConfig
  return HFBertConfig(
      vocab_size=size.vocab_size, hidden_size=size.hidden_size,
      num_hidden_layers=size.num_layers, num_attention_heads=size.num_heads,
      intermediate_size=size.intermediate_size, max_position_embeddings=512,
      hidden_dropout_prob=0.1 if dropout else 0.0,
      attention_probs_dropout_prob=0.1 if dropout else 0.0,
      layer_norm_eps=1e-12, hidden_act="gelu")


def _run_hf_flax(case: Case, size: ModelSize, dtype: str, warmup: int, steps: int) -> dict:
  import jax
  import jax.numpy as jnp
  import optax
  from transformers import FlaxBertForPreTraining, FlaxBertModel
  from bert_jax import optim

  jdtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[dtype]
  mem = _Memory("jax")
  batch = {k: jax.device_put(v) for k, v in make_batch(case, size.vocab_size).items()}
  cls = FlaxBertForPreTraining if case.kind == "train" else FlaxBertModel
  # _do_init=False + a jitted init: HF's eager init takes minutes for BERT-Base.
  model = cls(_hf_config(size), seed=0, dtype=jdtype, _do_init=False)
  params = jax.jit(lambda k: model.init_weights(k, (1, 8)))(jax.random.key(0))
  if case.kind == "train":
    tx = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(1e-4, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01,
                    mask=optim.decay_mask))
    opt_state = jax.jit(tx.init)(params)

    def train_step(params, opt_state, key, b):
      def loss_fn(p):
        out = model(b["masked_ids"], attention_mask=b["input_mask"],
                    token_type_ids=b["segment_ids"], params=p, train=True, dropout_rng=key)
        labels_BxL = b["mlm_labels"]
        w_BxL = (labels_BxL >= 0).astype(jnp.float32)
        nll_BxL = optax.softmax_cross_entropy_with_integer_labels(
            out.prediction_logits.astype(jnp.float32), jnp.maximum(labels_BxL, 0))
        mlm = (nll_BxL * w_BxL).sum() / jnp.maximum(w_BxL.sum(), 1.0)
        nsp = optax.softmax_cross_entropy_with_integer_labels(
            out.seq_relationship_logits.astype(jnp.float32), b["next_sentence_label"]).mean()
        return mlm + nsp
      loss, grads = jax.value_and_grad(loss_fn)(params)
      updates, opt_state = tx.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state, loss

    key = jax.random.key(1)
    t = time.perf_counter()
    compiled = jax.jit(train_step, donate_argnums=(0, 1)).lower(
        params, opt_state, key, batch).compile()
    compile_s = time.perf_counter() - t
    state = [params, opt_state]

    def step(i):
      state[0], state[1], loss = compiled(state[0], state[1], jax.random.fold_in(key, i), batch)
      jax.block_until_ready((state, loss))
  else:
    def extract(p, b):
      out = model(b["input_ids"], attention_mask=b["input_mask"],
                  token_type_ids=b["segment_ids"], params=p, train=False)
      return out.last_hidden_state, out.pooler_output

    t = time.perf_counter()
    compiled = jax.jit(extract).lower(params, batch).compile()
    compile_s = time.perf_counter() - t

    def step(i):
      jax.block_until_ready(compiled(params, batch))
  return {**_time_steps(step, warmup, steps), "compile_s": compile_s,
          "peak_mem_bytes": mem.peak(), "mem_kind": mem.kind,
          "compile_note": "jit lower + compile"}


def _run_hf_torch(case: Case, size: ModelSize, dtype: str, warmup: int, steps: int) -> dict:
  import torch
  from transformers import BertForPreTraining as TorchBertForPreTraining
  from transformers import BertModel as TorchBertModel

  torch.set_num_threads(os.cpu_count() or 1)
  torch.manual_seed(0)
  device = "cuda" if torch.cuda.is_available() else "cpu"
  tdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
  mem = _Memory("torch")
  b = {k: torch.from_numpy(v.astype(np.int64)).to(device)
       for k, v in make_batch(case, size.vocab_size).items()}
  if case.kind == "train":
    model = TorchBertForPreTraining(_hf_config(size)).to(device).train()
    no_decay = [p for n, p in model.named_parameters() if "bias" in n or "LayerNorm" in n]
    decay = [p for n, p in model.named_parameters() if not ("bias" in n or "LayerNorm" in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.999), eps=1e-6)

    def step(i):
      with torch.autocast(device, dtype=tdtype, enabled=tdtype != torch.float32):
        out = model(b["masked_ids"], attention_mask=b["input_mask"],
                    token_type_ids=b["segment_ids"], labels=b["mlm_labels"],
                    next_sentence_label=b["next_sentence_label"])
      out.loss.backward()
      torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
      opt.step()
      opt.zero_grad(set_to_none=True)
      if device == "cuda":
        torch.cuda.synchronize()
  else:
    model = TorchBertModel(_hf_config(size)).to(device).eval()

    def step(i):
      with torch.inference_mode(), torch.autocast(device, dtype=tdtype,
                                                 enabled=tdtype != torch.float32):
        model(b["input_ids"], attention_mask=b["input_mask"], token_type_ids=b["segment_ids"])
      if device == "cuda":
        torch.cuda.synchronize()
  # Eager: no compile. The first step's extra time over the median is reported.
  t = time.perf_counter()
  step(-1)
  first = time.perf_counter() - t
  timing = _time_steps(step, max(0, warmup - 1), steps)
  return {**timing, "compile_s": max(0.0, first - timing["median_s"]),
          "peak_mem_bytes": mem.peak(), "mem_kind": mem.kind,
          "compile_note": "eager (first step minus median)"}


def _run_prepare(quick: bool) -> dict:
  """Raw text to stored examples: the data module's own measurement.

  `bert_jax.dataset.benchmark_prepare` times `dataset.prepare` on a synthetic
  corpus (50 MiB; 5 MiB when quick) with a vocabulary trained beforehand, and
  returns the keys this module reads (tokens_per_s = corpus word pieces/s).
  """
  from bert_jax import dataset
  return dict(dataset.benchmark_prepare(quick=quick))


def matmul_peak(framework: str, dtype: str, n: int = 0, repeats: int = 10) -> dict:
  """FLOP/s of one large square matmul in `dtype`, median of `repeats`."""
  if framework == "jax":
    import jax
    import jax.numpy as jnp
    n = n or (8192 if jax.devices()[0].platform != "cpu" else 2048)
    jd = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[dtype]
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(jd)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32).astype(jd)
    f = jax.jit(jnp.dot).lower(a, b).compile()
    run = lambda _: f(a, b).block_until_ready()
  else:
    import torch
    torch.set_num_threads(os.cpu_count() or 1)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    n = n or (8192 if device == "cuda" else 2048)
    td = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    a, b = (torch.randn(n, n, device=device).to(td) for _ in range(2))

    def run(_):
      torch.mm(a, b)
      if device == "cuda":
        torch.cuda.synchronize()
  timing = _time_steps(run, 2, repeats)
  return {"framework": framework, "dtype": dtype, "n": n,
          "flops_per_s": 2.0 * n ** 3 / timing["median_s"], **timing}


# ----------------------------------------------------------------------------
# Worker (one measurement per process) and driver


@dataclasses.dataclass(frozen=True)
class Job:
  case: str  # a Case name
  impl: str  # 'ours' | 'hf_flax' | 'hf_torch'
  dtype: str


def run_job(job: Job, quick: bool, warmup: int, steps: int, peak_n: int = 0) -> dict:
  """One measurement, in this process.

  The matmul peak is timed here, right before the case, by the framework the
  case runs on: it then sees the same machine load as the case itself.
  """
  case = {c.name: c for c in CASES}[job.case]
  if case.kind == "prepare":
    return _run_prepare(quick)
  if quick:
    case = _quick(case)
  size = _size(case, quick)
  framework = "torch" if job.impl == "hf_torch" else "jax"
  peak = matmul_peak(framework, job.dtype, peak_n)
  run = {"ours": _run_ours, "hf_flax": _run_hf_flax, "hf_torch": _run_hf_torch}[job.impl]
  return {**run(case, size, job.dtype, warmup, steps), "matmul_peak": {
      k: peak[k] for k in ("framework", "dtype", "n", "flops_per_s", "min_s", "max_s")}}


def _worker_env() -> dict:
  env = dict(os.environ)
  # One real device per worker: drop the tests' simulated-device flag.
  flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "", env.get("XLA_FLAGS", ""))
  env["XLA_FLAGS"] = flags.strip()
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  env["TOKENIZERS_PARALLELISM"] = env.get("TOKENIZERS_PARALLELISM", "true")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
  return env


def _run_in_worker(job: Job, quick: bool, warmup: int, steps: int, timeout: float,
                   peak_n: int = 0) -> dict:
  cmd = [sys.executable, "-m", "bert_jax.bench", "--worker",
         json.dumps(dataclasses.asdict(job)), "--warmup", str(warmup), "--steps", str(steps),
         "--peak-n", str(peak_n)]
  if quick:
    cmd.append("--quick")
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_worker_env(),
                          timeout=timeout)
  except subprocess.TimeoutExpired:
    return {"error": f"timed out after {timeout:.0f} s"}
  for line in proc.stdout.splitlines():
    if line.startswith(_RESULT_TAG):
      return json.loads(line[len(_RESULT_TAG):])
  tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
  return {"error": f"worker exited {proc.returncode}: {tail[:300]}"}


def peers_available() -> dict[str, Optional[str]]:
  """impl -> None if importable, else why not (peers are optional)."""
  import importlib.util
  out: dict[str, Optional[str]] = {"ours": None}
  has_tf = importlib.util.find_spec("transformers") is not None
  out["hf_flax"] = None if has_tf else "transformers is not installed"
  if not has_tf:
    out["hf_torch"] = "transformers is not installed"
  else:
    out["hf_torch"] = (None if importlib.util.find_spec("torch") is not None
                       else "torch is not installed")
  return out


def plan(cases: Sequence[Case], impls: Sequence[str], all_dtypes: bool = False) -> list[Job]:
  """Every (case, impl, dtype) to run.

  Everybody runs in float32 (the peers' default). Ours also runs in its
  config's dtype where that differs (BERT-Base: bfloat16) on the mixed
  precision case, train_base_128, or on every case with `all_dtypes`; the
  full run must fit in 25 minutes on 2 cores.
  """
  jobs = []
  sizes = model_sizes()
  for case in cases:
    if case.kind == "prepare":
      jobs.append(Job(case.name, "ours", ""))
      continue
    default = sizes[case.model].default_dtype
    for impl in impls:
      if impl == "ours" and default != "float32" and (
          all_dtypes or case.name == "train_base_128"):
        jobs.append(Job(case.name, impl, default))
      jobs.append(Job(case.name, impl, "float32"))
  return jobs


def derive(job: Job, raw: dict, quick: bool) -> dict:
  """Adds throughput, FLOP/s and MFU to a worker's raw timing."""
  row = {"case": job.case, "impl": job.impl, "dtype": job.dtype, **raw}
  if "error" in raw:
    return row
  case = {c.name: c for c in CASES}[job.case]
  if case.kind == "prepare":
    return row
  case = _quick(case) if quick else case
  size = _size(case, quick)
  row.update(batch=case.batch, seq_len=case.seq_len, predictions=case.predictions,
             model=dataclasses.asdict(size), model_name=case.model,
             default_dtype=job.dtype == size.default_dtype)
  t = raw["median_s"]
  flops = model_flops(size, case.kind, case.batch, case.seq_len, case.predictions)
  row.update(sequences_per_s=case.batch / t, tokens_per_s=case.batch * case.seq_len / t,
             model_flops_per_step=flops, model_flops_per_s=flops / t)
  row["mfu"] = row["model_flops_per_s"] / raw["matmul_peak"]["flops_per_s"]
  return row


def add_ratios(rows: list[dict]) -> None:
  """ours/peer throughput ratios (same case, same batch) on every 'ours' row."""
  for row in rows:
    if row["impl"] != "ours" or "tokens_per_s" not in row:
      continue
    for peer in ("hf_flax", "hf_torch"):
      other = [r for r in rows if r["case"] == row["case"] and r["impl"] == peer
               and "tokens_per_s" in r]
      if other:
        row[f"ratio_vs_{peer}"] = row["tokens_per_s"] / other[0]["tokens_per_s"]


# ----------------------------------------------------------------------------
# Reporting


def machine_info() -> dict:
  cpu = platform.processor() or "unknown"
  try:
    with open("/proc/cpuinfo") as f:
      names = [l.split(":", 1)[1].strip() for l in f if l.startswith("model name")]
    cpu = names[0] if names else cpu
  except OSError:
    pass
  info = {"cpu": cpu, "cores": os.cpu_count(), "gpu": None, "python": platform.python_version()}
  versions = {}
  for mod in ("jax", "jaxlib", "flax", "optax", "transformers", "torch"):
    try:
      versions[mod] = __import__(mod).__version__
    except Exception:  # optional peers may be absent or broken
      versions[mod] = None
  info["versions"] = versions
  try:
    import jax
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
  lines = ["| case | implementation | dtype | B×L | step ms: median (min–max) | seq/s | "
           "tokens/s | model FLOP/s | matmul peak FLOP/s | MFU | compile s | peak mem MiB | "
           "ours ÷ HF Flax | ours ÷ HF PyTorch |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
  for r in rows:
    if r["case"] == "prepare":
      continue
    name = IMPL_NAMES.get(r["impl"], r["impl"])
    if r["impl"] == "ours" and r.get("default_dtype"):
      name += " (config default)"
    bxl = f"{r.get('batch', '')}×{r.get('seq_len', '')}"
    if "error" in r:
      lines.append(f"| {r['case']} | {name} | {r['dtype']} | {bxl} | error: {r['error']} "
                   "| | | | | | | | | |")
      continue
    lines.append(
        f"| {r['case']} | {name} | {r['dtype']} | {bxl} | "
        f"{r['median_s'] * 1e3:.1f} ({r['min_s'] * 1e3:.1f}–{r['max_s'] * 1e3:.1f}) | "
        f"{r['sequences_per_s']:.1f} | {r['tokens_per_s']:.0f} | "
        f"{_si(r['model_flops_per_s'])} | {_si(r['matmul_peak']['flops_per_s'])} "
        f"({r['matmul_peak']['framework']}) | {100 * r['mfu']:.0f}% | "
        f"{r['compile_s']:.1f} | {r['peak_mem_bytes'] / 2**20:.0f} | "
        f"{_fmt(r.get('ratio_vs_hf_flax'), '.2f')} | {_fmt(r.get('ratio_vs_hf_torch'), '.2f')} |")
  for r in rows:
    if r["case"] == "prepare":
      if "error" in r:
        lines.append(f"\nData preparation: error: {r['error']}")
      else:
        lines.append(
            f"\nData preparation ({r.get('what', 'bert_jax.dataset')}): "
            f"{r['median_s']:.1f} s, {r['tokens_per_s']:.0f} corpus tokens/s"
            + (f", {r['example_tokens_per_s']:.0f} example tokens/s"
               if "example_tokens_per_s" in r else "")
            + f", peak mem {r['peak_mem_bytes'] / 2**20:.0f} MiB.")
  v = m["versions"]
  mem_kinds = sorted({r.get("mem_kind") for r in rows if r.get("mem_kind")})
  lines += [
      "",
      f"Machine: {m['cpu']}, {m['cores']} cores, GPU: {m['gpu'] or 'none'}. "
      "Matmul peak: a jitted `jnp.dot` (jax rows) or `torch.mm` (PyTorch rows) of two "
      f"{result['peak_n']}² matrices in the row's dtype, median of 10, timed in the row's "
      "worker just before it; MFU = model FLOP/s ÷ that peak.",
      "Versions: " + ", ".join(f"{k} {v[k]}" for k in v if v[k]) + ". "
      f"Date: {result['date']}. Memory: {', '.join(mem_kinds)}. "
      f"Median of {result['steps']} timed steps after {result['warmup']} warm-up steps"
      + (" (QUICK run: 2-layer models, batch ≤ 4; plumbing check, not a measurement)"
         if result["quick"] else "") + ".",
      f"Command: `{result['command']}`",
  ]
  for impl, why in result.get("skipped", {}).items():
    lines.append(f"Skipped {IMPL_NAMES.get(impl, impl)}: {why}.")
  return "\n".join(lines) + "\n"


def replace_readme_block(text: str, block: str, path: str = "README.md") -> str:
  """`text` with everything between the bench markers replaced by `block`."""
  start, end = text.find(README_START), text.find(README_END)
  if start < 0 or end < start:
    raise ConfigError(f"{path}: expected a '{README_START}' line followed by a "
                      f"'{README_END}' line to put the benchmark table between")
  return text[:start + len(README_START)] + "\n" + block + text[end:]


def _write_atomic(path: str, text: str) -> None:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".tmp")
  try:
    with os.fdopen(fd, "w") as f:
      f.write(text)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def run_benchmark(cases: Sequence[Case], impls: Sequence[str], quick: bool, warmup: int,
                  steps: int, in_process: bool = False, timeout: float = 1800,
                  command: str = "", log: Callable[[str], None] = print,
                  peak_n: int = 0, all_dtypes: bool = False) -> dict:
  """Runs every job (each in a worker process unless `in_process`) and derives metrics."""
  available = peers_available()
  skipped = {i: available[i] for i in impls if available.get(i)}
  impls = [i for i in impls if not available.get(i)]
  for impl, why in skipped.items():
    log(f"skipping {IMPL_NAMES[impl]}: {why}")
  jobs = plan(cases, impls, all_dtypes)

  def run(job):
    if in_process:
      try:
        return run_job(job, quick, warmup, steps, peak_n)
      except BertJaxError as e:
        return {"error": str(e)}
    return _run_in_worker(job, quick, warmup, steps, timeout, peak_n)

  rows = []
  for job in jobs:
    t = time.perf_counter()
    row = derive(job, run(job), quick)
    rows.append(row)
    what = row.get("error") or (f"{row['median_s'] * 1e3:.1f} ms/step" + (
        f", {row['tokens_per_s']:.0f} tokens/s, MFU {100 * row['mfu']:.0f}%"
        if "mfu" in row else ""))
    log(f"{job.case:18s} {IMPL_NAMES[job.impl]:11s} {job.dtype or '-':9s} {what} "
        f"[{time.perf_counter() - t:.0f} s]")
  add_ratios(rows)
  peak_n = next((r["matmul_peak"]["n"] for r in rows if "matmul_peak" in r), None)
  return {"rows": rows, "peak_n": peak_n,
          "machine": machine_info(), "quick": quick, "steps": steps, "warmup": warmup,
          "skipped": skipped, "command": command,
          "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")}


def _parse(argv: Optional[Sequence[str]]) -> argparse.Namespace:
  p = argparse.ArgumentParser(prog="python -m bert_jax.bench", description=__doc__.split("\n")[0])
  p.add_argument("--quick", action="store_true",
                 help="2-layer models and batch <= 4: checks the plumbing, measures nothing")
  p.add_argument("--cases", default="all",
                 help="comma-separated, from: " + ", ".join(c.name for c in CASES))
  p.add_argument("--impls", default=",".join(IMPLS), help="comma-separated, from: "
                 + ", ".join(IMPLS))
  p.add_argument("--steps", type=int, default=None, help="timed steps (default 10; quick 3)")
  p.add_argument("--warmup", type=int, default=None, help="untimed steps after compiling (default 1)")
  p.add_argument("--out", default="bench/results.json", help="JSON results")
  p.add_argument("--md", default="bench/results.md", help="markdown table")
  p.add_argument("--readme", action="store_true",
                 help=f"replace the {README_START}..{README_END} block of --readme-path")
  p.add_argument("--readme-path", default="README.md")
  p.add_argument("--in-process", action="store_true",
                 help="run every measurement in this process (tests; memory is then cumulative)")
  p.add_argument("--timeout", type=float, default=1800, help="seconds per worker")
  p.add_argument("--all-dtypes", action="store_true",
                 help="ours also in its config dtype (bfloat16 for BERT-Base) on every case, "
                      "not only train_base_128")
  p.add_argument("--peak-n", type=int, default=0,
                 help="size of the square matmul timed for the peak (default 2048 on CPU, "
                      "8192 on GPU)")
  p.add_argument("--worker", help=argparse.SUPPRESS)
  return p.parse_args(argv)


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
  try:
    by_name = {c.name: c for c in CASES}
    names = list(by_name) if args.cases == "all" else [
        n.strip() for n in args.cases.split(",") if n.strip()]
    bad = [n for n in names if n not in by_name]
    if bad or not names:
      raise ConfigError(f"--cases={args.cases!r}: unknown {bad}; expected a comma-separated "
                        f"list from {list(by_name)} or 'all'")
    impls = [i.strip() for i in args.impls.split(",") if i.strip()]
    if not impls or any(i not in IMPLS for i in impls) or "ours" not in impls:
      raise ConfigError(f"--impls={args.impls!r}: expected 'ours' plus any of "
                        f"{list(IMPLS[1:])}, comma-separated")
    if steps < 1 or warmup < 0:
      raise ConfigError(f"--steps={steps} --warmup={warmup}: expected steps >= 1, warmup >= 0")
    if args.readme:  # fail before the (long) run, not after it
      with open(args.readme_path) as f:
        replace_readme_block(f.read(), "", args.readme_path)
    command = "python -m bert_jax.bench " + " ".join(
        a for a in (argv if argv is not None else sys.argv[1:]))
    result = run_benchmark([by_name[n] for n in names], impls, args.quick, warmup, steps,
                           args.in_process, args.timeout, command.strip(),
                           peak_n=args.peak_n, all_dtypes=args.all_dtypes)
    table = markdown(result)
    print("\n" + table)
    _write_atomic(args.out, json.dumps(result, indent=1, default=str) + "\n")
    _write_atomic(args.md, table)
    if args.readme:
      with open(args.readme_path) as f:
        text = replace_readme_block(f.read(), table, args.readme_path)
      _write_atomic(args.readme_path, text)
    print(f"wrote {args.out}, {args.md}" + (f", {args.readme_path}" if args.readme else ""))
  except (BertJaxError, OSError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
