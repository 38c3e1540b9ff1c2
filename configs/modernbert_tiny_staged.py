"""configs/modernbert_base.py's three stages at the size of configs/modernbert_tiny.py:
a recipe that trains in minutes on 2 CPU cores and has every stage boundary a staged run
has (a longer row, a smaller batch, a larger RoPE base, a new learning-rate segment).

  stage      tokens  length  batch  global RoPE theta  learning rate
  pre-train  3.3M    64      64     10,000             1e-3 after 200 warm-up steps
  extension  0.6M    128     16     160,000            3.75e-4, constant
  decay      0.1M    128     16     160,000            1-sqrt to 0.001x

The rates keep the base recipe's ratio (3e-4 / 8e-4) between the pre-training and the
extension; 30% masking throughout, evaluated at 15%.
"""

from configs import modernbert_tiny


def get_config():
  c = modernbert_tiny.get_config()
  t = c.train
  t.seq_lens = (64, 128, 128)
  t.max_predictions = (20, 40, 40)
  t.phase_batch_sizes = (64, 16, 16)
  t.phase_tokens = (64 * 64 * 800, 128 * 16 * 300, 128 * 16 * 50)  # 800, 300, 50 steps
  t.phase_fractions = (0.7, 0.25, 0.05)  # not read: the token budgets decide
  t.phase_rope_thetas = (10000.0, 160000.0, 160000.0)
  t.schedule = "phases"
  t.phase_lr = ("constant", f"constant@{t.learning_rate * 3 / 8:g}", "sqrt->0.001")
  c.model.global_rope_theta = 160000.0  # what the model ends with
  return c
