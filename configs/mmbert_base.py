"""mmBERT-Base (arXiv 2509.06888): ModernBERT-Base's shape (22 layers, hidden 768, 12
heads, GeGLU 1152) with a 256k vocabulary (Gemma 2's tokenizer: pass its tokenizer.json
as `data.vocab_file`), trained in three stages that add languages, as the issue's stage
table gives them:

  stage      tokens  length  masking  languages  temperature  RoPE theta  learning rate
  pre-train  2.0T    1024    30%      60         0.7          10,000      8e-4, constant
  extension  600B    8192    15%      110        0.5          160,000     8e-4, constant
  decay      100B    8192    5%       1833       0.3          160,000     1-sqrt to 0.02x

  Evaluated at 15% (eval.mask_prob); MLM only, packed rows with document masks;
  StableAdamW; the optimizer state carries over between stages.

Languages join as sources: `data.sources` names three groups in the order they join (the
60 languages of pre-training, the 50 the extension adds, the rest the decay adds), and
`data.phase_weights` gives a group weight 0 until its stage. Each stage samples the
groups with p_i ∝ weight_i x tokens_i ** temperature (data/mixture.py: mmBERT's τ):
  --config.data.sources="('first60=gs://b/l60/*.parquet', 'next50=gs://b/l50/*.parquet',
                          'rest=gs://b/rest/*.parquet')"
A run without three sources stops with one `error:` line naming data.phase_weights.

Deviations (docs/deviations.md): the temperature applies across the three groups, not
to each language inside a group (give more sources, and weights, for finer control);
the batch (ModernBERT-Base's 768 -> 4608 sequences, then 576) and the peak rate are
ModernBERT-Base's, not published with the table.
"""

from configs import modernbert_base


def get_config():
  c = modernbert_base.get_config()
  c.data.vocab_size = 256000  # Gemma 2's tokenizer (data.vocab_file), as mmBERT
  d = c.data
  d.phase_weights = ((1.0, 0.0, 0.0), (1.0, 1.0, 0.0), (1.0, 1.0, 1.0))  # languages join
  d.phase_temperatures = (0.7, 0.5, 0.3)
  t = c.train
  t.phase_tokens = ("2.0T", "600B", "100B")
  t.phase_mask_probs = (0.3, 0.15, 0.05)
  # Room for the training rate and for evaluation's 15% (the 5% stage evaluates at 15%).
  t.max_predictions = tuple(int(max(r, 0.15) * n) + 8
                            for r, n in zip((0.3, 0.15, 0.05), t.seq_lens))
  t.phase_rope_thetas = (10000.0, 160000.0, 160000.0)
  t.phase_lr = ("constant", "constant", "sqrt->0.02")
  return c
