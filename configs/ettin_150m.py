"""Ettin-150M's encoder (arXiv 2507.11412): ModernBERT-Base's shape (22 layers, hidden
768, 12 heads, GeGLU 1152, ModernBERT's 50k vocabulary) with Ettin's three stages, as the
issue's stage table gives them, in one bert-jax run of three phases:

  stage      tokens  length  masking  RoPE theta (global)  learning rate
  pre-train  1.7T    1024    30%      10,000               WSD: warm-up, then constant
  extension  250B    8192    30%      160,000              1-sqrt to 0.5x
  decay      50B     8192    15%      160,000              1-sqrt from 0.5x to 0

  Evaluated at 15% (eval.mask_prob); MLM only, packed rows with document masks;
  StableAdamW; the optimizer state carries over between stages.

The decay stage trains on a new data mix: give the corpus as `data.sources` and the
decay's weights in `data.phase_weights`, e.g.
  --config.data.sources="('web=gs://b/web/*.parquet', 'books=gs://b/books/*.jsonl.zst')"
  --config.data.phase_weights="((0.9, 0.1), (0.9, 0.1), (0.5, 0.5))"

Not published with the stage table, so ModernBERT-Base's values are kept (listed in
docs/deviations.md): the peak learning rate (8e-4 after a 3B-token warm-up), betas,
weight decay, the batch (768 -> 4608 sequences at 1024 tokens, 576 at 8192) and the
extension's masking rate. Ettin's data card gives its decay phase 100B tokens where the
issue's table says 50B; `--config.train.phase_tokens="('1.7T', '250B', '100B')"` gives
the card's.
"""

from configs import modernbert_base


def get_config():
  c = modernbert_base.get_config()
  t = c.train
  t.phase_tokens = ("1.7T", "250B", "50B")
  t.phase_mask_probs = (0.3, 0.3, 0.15)
  t.max_predictions = tuple(int(r * n) + 8 for r, n in zip((0.3, 0.3, 0.15), t.seq_lens))
  t.phase_rope_thetas = (10000.0, 160000.0, 160000.0)
  # The decay starts where the extension ended (0.5x) and ends at 0.
  t.phase_lr = ("constant", "sqrt->0.5", "sqrt->0")
  return c
