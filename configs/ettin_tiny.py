"""configs/ettin_150m.py's three stages at the size of configs/modernbert_tiny.py, on the
built-in corpus, in minutes on 2 CPU cores:

  stage      steps  length  batch  masking  global RoPE theta  learning rate
  pre-train  800    64      64     30%      10,000             1e-3 after 200 warm-up steps
  extension  300    128     16     30%      160,000            1-sqrt to 0.5x
  decay      50     128     16     15%      160,000            1-sqrt from 0.5x to 0

Evaluated at 15%. The decay's new data mix needs `data.sources` (see ettin_150m.py).
"""

from configs import modernbert_tiny_staged


def get_config():
  c = modernbert_tiny_staged.get_config()
  t = c.train
  t.phase_mask_probs = (0.3, 0.3, 0.15)
  t.max_predictions = (20, 40, 20)
  t.phase_lr = ("constant", "sqrt->0.5", "sqrt->0")
  return c
