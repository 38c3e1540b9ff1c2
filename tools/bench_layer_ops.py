"""One BERT-Base layer's float32 ops at the features shape (B32 x 128), jax against torch.

Times, in one process, each piece of a BERT-Base layer alone:

  the projection dots (4096x768 by 768x768), the feed-forward input and output dots,
  the feed-forward output dot with its GELU input and LayerNorm (as the model fuses it),
  GELU on the feed-forward activations, as jax.nn.gelu writes it and as the model does,
  the attention core (scores, mask, softmax, context) in the [B, L, H, K] layout XLA
  picks by itself and in the canonical layout bert_jax uses on XLA:CPU
  (`config.model.cpu_attention_layout`), there also with the softmax's division after
  the context dot (`config.model.attention_softmax='deferred'`), and torch's
  `scaled_dot_product_attention`, `torch.mm` and GELU for the same shapes. `--rows S`
  runs only the rows whose name contains S.

These are the numbers docs/performance.md ("Where the time goes") sets the model's
per-layer timeline against. Run it on an idle machine, under the allocator our
commands use:

  GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python tools/bench_layer_ops.py [--repeats N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from bert_jax.model import precision  # noqa: E402
from bert_jax.model.bert import gelu  # noqa: E402
from bert_jax.settings.model import ModelConfig  # noqa: E402

B, L, H, K = 32, 128, 12, 64
D, F = H * K, 4 * H * K


def median_ms(fn, repeats: int) -> float:
  fn()
  fn()
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t)
  return statistics.median(times) * 1e3


def _layer_norm(y_BxLxD):
  m = y_BxLxD.mean(-1, keepdims=True)
  v = ((y_BxLxD - m) ** 2).mean(-1, keepdims=True)
  return (y_BxLxD - m) * jax.lax.rsqrt(v + 1e-12)


def jax_ops(rng: np.random.Generator) -> dict:
  """name -> (callable, operands, flop)."""
  arr = lambda *shape: jnp.asarray(rng.standard_normal(shape, np.float32))
  x, wd, wi, wo = arr(B * L, D), arr(D, D), arr(D, F), arr(F, D)
  h, res = arr(B * L, F), arr(B * L, D)
  q, k, v = arr(B, L, H, K), arr(B, L, H, K), arr(B, L, H, K)
  bias = jnp.asarray(np.where(rng.random((B, 1, 1, L)) < 0.1, -1e9, 0.0).astype(np.float32))

  def core_xla(q, k, v, b):
    s = jnp.einsum("bqhk,bshk->bhqs", q, k)
    return jnp.einsum("bhqs,bshk->bqhk", jax.nn.softmax(s + b, axis=-1), v)

  def e(spec, a, c):  # a float32 dot in the canonical layout, as the model's on XLA:CPU
    return precision.einsum(spec, a, c, op_dtype=jnp.float32)

  def core_canonical(q, k, v, b):
    s = e("bqhk,bshk->bhqs", q, k)
    return e("bhqs,bshk->bqhk", jax.nn.softmax(s + b, axis=-1), v)

  def core_deferred(q, k, v, b):  # config.model.attention_softmax='deferred'
    s = e("bqhk,bshk->bhqs", q, k) + b
    p = jnp.exp(s - s.max(-1, keepdims=True))
    o = e("bhqs,bshk->bhqk", p, v) / p.sum(-1, keepdims=True)
    return o.transpose(0, 2, 1, 3)

  exact = ModelConfig(vocab_size=8)  # the model's exact GELU

  def ffn_out_gelu_ln(h, w, r):
    return _layer_norm(r + gelu(exact, h) @ w)

  core_flop = 4 * B * H * L * L * K
  return {
      "projection dot 4096x768x768": (lambda a, b: a @ b, (x, wd), 2 * B * L * D * D),
      "feed-forward input dot 4096x768x3072": (lambda a, b: a @ b, (x, wi), 2 * B * L * D * F),
      "feed-forward output dot 4096x3072x768": (lambda a, b: a @ b, (h, wo), 2 * B * L * D * F),
      "  the same with GELU input, residual, LayerNorm": (ffn_out_gelu_ln, (h, wo, res),
                                                          2 * B * L * D * F),
      "GELU 4096x3072, jax.nn.gelu (x/2 erfc(-x/sqrt 2))": (
          lambda a: jax.nn.gelu(a, approximate=False), (h,), 0),
      "GELU 4096x3072, the model's (x/2 (1 + erf(x/sqrt 2)))": (
          lambda a: gelu(exact, a), (h,), 0),
      "attention core, [B, L, H, K] layout (XLA's)": (core_xla, (q, k, v, bias), core_flop),
      "attention core, canonical layout (ours)": (core_canonical, (q, k, v, bias), core_flop),
      "  the same, softmax divided after the context dot": (core_deferred, (q, k, v, bias),
                                                            core_flop),
  }


def torch_ops(rng: np.random.Generator) -> dict:
  import torch
  t = lambda *shape: torch.from_numpy(rng.standard_normal(shape, np.float32))
  x, wd, wi, h, wo = t(B * L, D), t(D, D), t(D, F), t(B * L, F), t(F, D)
  q, k, v = t(B, H, L, K), t(B, H, L, K), t(B, H, L, K)
  mask = torch.zeros(B, 1, 1, L)
  sdpa = torch.nn.functional.scaled_dot_product_attention
  core_flop = 4 * B * H * L * L * K
  return {
      "projection dot 4096x768x768": (lambda: torch.mm(x, wd), 2 * B * L * D * D),
      "feed-forward input dot 4096x768x3072": (lambda: torch.mm(x, wi), 2 * B * L * D * F),
      "feed-forward output dot 4096x3072x768": (lambda: torch.mm(h, wo), 2 * B * L * D * F),
      "attention core, scaled_dot_product_attention": (
          lambda: sdpa(q, k, v, attn_mask=mask), core_flop),
      "GELU 4096x3072, torch.nn.functional.gelu": (
          lambda: torch.nn.functional.gelu(h), 0),
  }


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--repeats", type=int, default=15)
  p.add_argument("--no-torch", action="store_true", help="jax rows only")
  p.add_argument("--rows", default="", help="only the rows whose name contains this")
  args = p.parse_args(argv)
  rng = np.random.default_rng(0)
  print(f"BERT-Base layer ops, float32, B{B} x {L}, {jax.devices()[0].device_kind}; "
        f"median of {args.repeats}; GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '')!r}")
  rows = []
  for name, (fn, operands, flop) in jax_ops(rng).items():
    if args.rows not in name:
      continue
    jitted = jax.jit(fn)
    ms = median_ms(lambda: jax.block_until_ready(jitted(*operands)), args.repeats)
    rows.append(("jax " + jax.__version__, name, ms, flop))
  if not args.no_torch:
    import torch
    with torch.no_grad():
      for name, (fn, flop) in torch_ops(rng).items():
        if args.rows not in name:
          continue
        rows.append(("torch " + torch.__version__, name, median_ms(fn, args.repeats), flop))
  for impl, name, ms, flop in rows:
    rate = f"{flop / ms / 1e6:7.1f} GFLOP/s" if flop else ""
    print(f"  {impl:22s} {name:52s} {ms:8.1f} ms {rate}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
