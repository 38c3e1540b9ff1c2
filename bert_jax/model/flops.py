"""Analytic model FLOPs of BERT and ModernBERT pre-training and the peak FLOP/s of known accelerators.

One formula per family (each family's record, model/family.py, names its own) for the
run report (`loop`), the planner and the benchmark (`tools/cases.py`).
Shape legend: B batch, L sequence length, P masked positions (max predictions),
D hidden size, F feed-forward size, V vocabulary size, N layers.
"""

from typing import Optional


def model_flops(num_layers: int, hidden_size: int, intermediate_size: int, vocab_size: int,
                kind: str, batch: int, seq_len: int, predictions: int = 0) -> float:
  """Analytic model FLOPs of one step ('train') or one forward pass ('features').

  Matmuls only, 2 FLOPs per multiply-add. Per token and layer the projections
  cost 2 * (4*D*D + 2*D*F) and attention scores plus the weighted sum 4*L*D.
  The pooler is 2*D*D per sequence. The MLM head (dense + vocabulary
  projection, 2*D*D + 2*D*V) is counted on the P masked positions only: that
  is all a pre-training step needs, whether an implementation computes it on
  all L positions (HF) or not (ours). NSP, embeddings, LayerNorm, softmax and
  GELU are left out. A train step counts 3x the forward (backward = 2x).
  Padding positions count: the device computes them.
  """
  d, f, v, n = hidden_size, intermediate_size, vocab_size, num_layers
  per_token = n * (2 * (4 * d * d + 2 * d * f) + 4 * seq_len * d)
  forward = batch * (seq_len * per_token + 2 * d * d)
  if kind == "features":
    return float(forward)
  forward += batch * predictions * (2 * d * d + 2 * d * v)
  return 3.0 * forward


def bert_flops(config, kind: str, batch: int, seq_len: int, predictions: int = 0) -> float:
  """`model_flops` of a BERT config (settings/model.ModelConfig)."""
  c = config
  return model_flops(c.num_layers, c.hidden_size, c.intermediate_size, c.vocab_size, kind,
                     batch, seq_len, predictions)


def modernbert_flops(config, kind: str, batch: int, seq_len: int,
                     predictions: int = 0) -> float:
  """Analytic FLOPs of a ModernBERT config, counted as `model_flops` counts BERT's.

  Per token and layer the projections cost 2 * (4*D*D + 3*D*F) (fused QKV and Wo;
  GeGLU's Wi is 2F wide, Wo F), and attention 4*W*D where W is L on global layers and
  min(L, local_attention + 1) on local ones (the keys a windowed kernel needs; the
  'einsum' core computes all L and masks). The MLM head (dense + decoder) on the P
  masked positions; no pooler.
  """
  c = config
  d, f, v = c.hidden_size, c.intermediate_size, c.vocab_size
  keys = [seq_len if i % c.global_attn_every_n_layers == 0
          else min(seq_len, c.local_attention + 1) for i in range(c.num_layers)]
  per_token = sum(2 * (4 * d * d + 3 * d * f) + 4 * w * d for w in keys)
  forward = batch * seq_len * per_token
  if kind == "features":
    return float(forward)
  forward += batch * predictions * (2 * d * d + 2 * d * v)
  return 3.0 * forward


# Dense bfloat16 peak FLOP/s of one JAX device, by `device_kind` (first match wins,
# so the more specific names come first). TPU v4 and v5p devices are one chip
# (both TensorCores); v5e and v6e chips have one TensorCore. A TPU7x (Ironwood) chip's
# two TensorCores are two devices: half its 2307 TFLOP/s (Cloud TPU's TPU7x page).
_PEAKS = (
    ("TPU7x", 2307e12 / 2),
    ("TPU v6 lite", 918e12), ("TPU v6e", 918e12),
    ("TPU v5 lite", 197e12), ("TPU v5e", 197e12),
    ("TPU v5p", 459e12), ("TPU v5", 459e12),
    ("TPU v4", 275e12),
    ("H200", 989e12),
    ("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H100", 989e12),
    ("A100", 312e12),
)


def peak_flops(device_kind: str) -> Optional[float]:
  """Dense bfloat16 peak FLOP/s of one device of this kind; None if unknown (CPU)."""
  for name, peak in _PEAKS:
    if name.lower() in device_kind.lower():
      return peak
  return None
