"""XLA CPU dot throughput per dtype variant, and the model in float32 vs mixed precision.

Prints the CPU model and its bf16-relevant flags, then measured GFLOP/s of
jitted dots for each variant

  f32 x f32 -> f32            (the float32 model)
  bf16 x bf16 -> bf16         (what nn.Dense(dtype=bfloat16) emits)
  bf16 x bf16 -> f32          (preferred_element_type=f32: bert_jax mixed mode)
  f32 x bf16 -> f32           (what JAX derives for the backward of a bf16->f32 dot)

at 2048^2 and at BERT-Base layer shapes, each in the forward layout (NN:
X @ W) and the two layouts the backward uses (NT: G @ W^T, TN: X^T @ G),
plus the batched attention einsums. Then forward and train-step timings of a
small BERT (L4 H256, B32 x 128) and a BERT-Base forward (B8 x 128) in
float32 vs mixed mode (ModelConfig.dtype='bfloat16'), all in one process.

  python tools/bench_matmul.py [--quick] [--out FILE]
"""

import argparse
import os
import platform
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

F32, BF16 = jnp.float32, jnp.bfloat16
VARIANTS = [  # name, lhs dtype, rhs dtype, preferred_element_type
    ("f32xf32->f32", F32, F32, None),
    ("bf16xbf16->bf16", BF16, BF16, None),
    ("bf16xbf16->f32", BF16, BF16, F32),
    ("f32xbf16->f32", F32, BF16, F32),
]
INTERESTING_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile",
                     "amx_bf16", "amx_int8", "avx_vnni")


def cpu_description() -> tuple[str, list]:
  from bert_jax.model import precision  # the one reader of /proc/cpuinfo
  model = precision.cpu_model() or platform.processor() or "unknown CPU"
  flags = precision.cpu_flags()
  return model, [f for f in INTERESTING_FLAGS if f in flags]


def _time(fn, *args, reps: int) -> float:
  """Median seconds of `reps` calls after one warm-up (compile) call."""
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def _dot_fn(dims, pref):
  return jax.jit(lambda a, b: jax.lax.dot_general(a, b, dims, preferred_element_type=pref))


def matmul_cases(quick: bool):
  """(label, lhs shape, rhs shape, dimension_numbers, flops)."""
  nn_ = (((1,), (0,)), ((), ()))
  nt = (((1,), (1,)), ((), ()))
  tn = (((0,), (0,)), ((), ()))
  cases = []
  mats = [(2048, 2048, 2048), (4096, 768, 768), (4096, 768, 3072), (4096, 3072, 768)]
  if quick:
    mats = [(2048, 2048, 2048), (4096, 768, 3072)]
  for m, k, n in mats:
    flops = 2.0 * m * k * n
    cases.append((f"NN {m}x{k} @ {k}x{n}", (m, k), (k, n), nn_, flops))
    if (m, k, n) != (2048, 2048, 2048) or not quick:
      cases.append((f"NT {m}x{n} @ ({k}x{n})^T [dX]", (m, n), (k, n), nt, flops))
      cases.append((f"TN ({m}x{k})^T @ {m}x{n} [dW]", (m, k), (m, n), tn, flops))
  bh = 96 if quick else 384  # B8 or B32 x 12 heads
  bmm = (((2,), (1,)), ((0,), (0,)))
  cases.append((f"attn scores {bh}x128x64 @ {bh}x64x128", (bh, 128, 64), (bh, 64, 128), bmm,
                 2.0 * bh * 128 * 64 * 128))
  cases.append((f"attn context {bh}x128x128 @ {bh}x128x64", (bh, 128, 128), (bh, 128, 64), bmm,
                 2.0 * bh * 128 * 128 * 64))
  if not quick:
    cases.append((f"attn TN ({bh}x128x128)^T @ {bh}x128x64 [dV]", (bh, 128, 128), (bh, 128, 64),
                  (((1,), (1,)), ((0,), (0,))), 2.0 * bh * 128 * 128 * 64))
  return cases


def bench_matmuls(quick: bool, out):
  reps = 2 if quick else 4
  key = jax.random.key(0)
  out(f"\n== XLA CPU dots, GFLOP/s (median of {reps} after a warm-up) ==")
  out(f"{'shape':48s}" + "".join(f"{v[0]:>17s}" for v in VARIANTS))
  rows = []
  for label, sa, sb, dims, flops in matmul_cases(quick):
    a32 = jax.random.normal(key, sa, F32)
    b32 = jax.random.normal(jax.random.fold_in(key, 1), sb, F32)
    cells = []
    for name, da, db, pref in VARIANTS:
      try:
        s = _time(_dot_fn(dims, pref), a32.astype(da), b32.astype(db), reps=reps)
        cells.append(flops / s / 1e9)
      except Exception as e:  # an XLA CPU runtime without this variant
        cells.append(float("nan"))
        out(f"  {label} {name}: {type(e).__name__}: {str(e)[-120:]}")
    rows.append((label, cells))
    out(f"{label:48s}" + "".join(f"{c:17.1f}" for c in cells))
  return rows


# ----------------------------------------------------------------------------
# Model timings


def _model_timings(quick: bool, out):
  import flax.linen as nn
  import optax
  from bert_jax.model import losses
  from bert_jax.settings.model import ModelConfig
  from bert_jax.model.bert import BertForPreTraining, BertModel

  reps = 2 if quick else 5
  small = dict(vocab_size=30522, hidden_size=256, num_layers=4, num_heads=4,
               intermediate_size=1024, vocab_pad_multiple=128)
  base = dict(vocab_size=30522, vocab_pad_multiple=128)
  out(f"\n== model timings, ms (median of {reps} after compile) ==")
  out(f"{'case':44s}{'float32':>12s}{'mixed bf16':>12s}{'speed-up':>10s}")

  def data(b, length, p):
    rs = np.random.RandomState(0)
    ids = jnp.asarray(rs.randint(5, 30000, (b, length)), jnp.int32)
    pos = jnp.asarray(np.argsort(rs.rand(b, length), 1)[:, :p], jnp.int32)
    labels = jnp.take_along_axis(ids, pos, 1)
    return ids, jnp.zeros_like(ids), jnp.ones_like(ids), pos, labels

  def forward_ms(kw, b, length, dtype):
    cfg = ModelConfig(**kw, dtype=dtype, dropout_rate=0.1)
    ids, seg, mask, _, _ = data(b, length, 1)
    model = BertModel(cfg)
    params = nn.meta.unbox(jax.jit(model.init)(jax.random.key(0), ids[:1], seg[:1], mask[:1]))["params"]
    fn = jax.jit(lambda p: model.apply({"params": p}, ids, seg, mask).sequence_BxLxD)
    return 1e3 * _time(fn, params, reps=reps)

  def train_ms(kw, b, length, p, dtype):
    cfg = ModelConfig(**kw, dtype=dtype)
    ids, seg, mask, pos, labels = data(b, length, p)
    model = BertForPreTraining(cfg)
    params = nn.meta.unbox(jax.jit(model.init)(jax.random.key(0), ids[:1], seg[:1], mask[:1],
                                              pos[:1]))["params"]
    tx = optax.adamw(1e-4)
    opt = tx.init(params)

    def loss_fn(prm, key):
      o = model.apply({"params": prm}, ids, seg, mask, pos, deterministic=False,
                      rngs={"dropout": key})
      mlm = losses.mlm_sums(o.mlm_logits_BxPxV, labels, jnp.ones(labels.shape))
      nsp = losses.nsp_sums(o.nsp_logits_Bx2, jnp.zeros(b, jnp.int32), jnp.ones(b))
      return mlm.loss / mlm.count + nsp.loss / b

    @jax.jit
    def step(prm, o, key):
      g = jax.grad(loss_fn)(prm, key)
      u, o = tx.update(g, o, prm)
      return optax.apply_updates(prm, u), o

    key = jax.random.key(1)
    return 1e3 * _time(lambda: step(params, opt, key), reps=reps)

  cases = [("small L4 H256 forward B32x128", lambda d: forward_ms(small, 32, 128, d)),
           ("small L4 H256 train step B32x128 P20", lambda d: train_ms(small, 32, 128, 20, d)),
           ("BERT-Base forward B8x128", lambda d: forward_ms(base, 8, 128, d))]
  rows = []
  for label, fn in cases:
    f32 = fn("float32")
    mixed = fn("bfloat16")
    rows.append((label, f32, mixed))
    out(f"{label:44s}{f32:12.1f}{mixed:12.1f}{f32 / mixed:9.2f}x")
  return rows


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--quick", action="store_true", help="fewer shapes and repetitions")
  ap.add_argument("--skip-model", action="store_true", help="dots only")
  ap.add_argument("--out", default="", help="also write the report to this file")
  args = ap.parse_args(argv)
  lines = []

  def out(s=""):
    print(s, flush=True)
    lines.append(s)

  model, flags = cpu_description()
  out(f"bench_matmul {time.strftime('%Y-%m-%d %H:%M:%S %Z')}  quick={args.quick}")
  out(f"CPU: {model}; {os.cpu_count()} logical cores; load average {os.getloadavg()[0]:.2f}")
  out(f"flags: {' '.join(flags) or '(none of ' + ' '.join(INTERESTING_FLAGS) + ')'}")
  native = any(f in flags for f in ("amx_bf16", "avx512_bf16"))
  out(f"native bf16 dot instructions: {'yes' if native else 'no (bf16 dots are emulated)'}")
  out(f"jax {jax.__version__}, backend {jax.default_backend()}, devices {len(jax.devices())}")
  bench_matmuls(args.quick, out)
  if not args.skip_model:
    _model_timings(args.quick, out)
  out(f"\nload average at the end {os.getloadavg()[0]:.2f}")
  if args.out:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
      f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
  main()
