"""ModernBERT-Large: 28 layers, hidden 1024, 16 heads, GeGLU 2624 (395M params with its
50k vocabulary); configs/modernbert_base.py's recipe at the published large lr (5e-4)."""

from configs import modernbert_base


def get_config():
  c = modernbert_base.get_config()
  m = c.model
  m.hidden_size, m.num_layers, m.num_heads, m.intermediate_size = 1024, 28, 16, 2624
  c.train.learning_rate = 5e-4
  c.train.weight_decay = 1e-5 / c.train.learning_rate
  return c
