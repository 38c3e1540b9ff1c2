"""The BERT model: config (no Flax), encoder and heads, masking, losses, precision, FLOPs.

Knows no optimizer and no mesh."""
