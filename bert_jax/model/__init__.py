"""The models: the families' registry (no Flax), each family's encoder and heads, masking, losses, precision, FLOPs.

Knows no optimizer and no mesh."""
