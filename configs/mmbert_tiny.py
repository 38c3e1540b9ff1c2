"""configs/mmbert_base.py's three stages at the size of configs/modernbert_tiny.py, on
the built-in corpus, in minutes on 2 CPU cores:

  stage      steps  length  batch  masking  global RoPE theta  learning rate
  pre-train  800    64      64     30%      10,000             1e-3 after 200 warm-up steps
  extension  300    128     16     15%      160,000            1e-3, constant
  decay      50     128     16     5%       160,000            1-sqrt to 0.02x

Evaluated at 15%. The languages that join in later stages need three `data.sources`
with mmbert_base.py's `data.phase_weights` and `data.phase_temperatures`, e.g.
  --config.data.sources="('first=a.jsonl', 'next=b.jsonl', 'rest=c.jsonl')"
  --config.data.phase_weights="((1, 0, 0), (1, 1, 0), (1, 1, 1))"
  --config.data.phase_temperatures="(0.7, 0.5, 0.3)"
"""

from configs import modernbert_tiny_staged


def get_config():
  c = modernbert_tiny_staged.get_config()
  t = c.train
  t.phase_mask_probs = (0.3, 0.15, 0.05)
  t.max_predictions = (20, 20, 20)  # the 5% stage evaluates at 15% too
  t.phase_lr = ("constant", "constant", "sqrt->0.02")
  return c
