"""tools/bench_layer_ops.py times equal computations: its layouts differ, not its results."""

import jax
import numpy as np

from tools import bench_layer_ops


def test_both_attention_core_layouts_compute_the_same_values():
  ops = bench_layer_ops.jax_ops(np.random.default_rng(0))
  xla_fn, operands, _ = ops["attention core, [B, L, H, K] layout (XLA's)"]
  ours_fn, ours_operands, _ = ops["attention core, canonical layout (ours)"]
  assert all(a is b for a, b in zip(ours_operands, operands))
  np.testing.assert_allclose(jax.jit(ours_fn)(*operands), jax.jit(xla_fn)(*operands),
                             rtol=1e-5, atol=1e-5)


def test_the_fused_feed_forward_output_is_layer_normalised():
  ops = bench_layer_ops.jax_ops(np.random.default_rng(0))
  fn, operands, _ = ops["  the same with GELU input, residual, LayerNorm"]
  y = np.asarray(jax.jit(fn)(*operands))
  assert y.shape == (bench_layer_ops.B * bench_layer_ops.L, bench_layer_ops.D)
  np.testing.assert_allclose(y.mean(-1), 0, atol=1e-4)
  np.testing.assert_allclose(y.std(-1), 1, atol=1e-3)


def test_both_gelu_rows_compute_the_same_values():
  ops = bench_layer_ops.jax_ops(np.random.default_rng(0))
  (jax_fn, operands, _), (model_fn, model_operands, _) = (
      ops[name] for name in ops if name.startswith("GELU"))
  assert all(a is b for a, b in zip(model_operands, operands))
  np.testing.assert_allclose(jax.jit(model_fn)(*operands), jax.jit(jax_fn)(*operands),
                             rtol=1e-6, atol=1e-6)
