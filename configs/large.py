"""BERT-Large: L=24 H=1024 A=16 (340M params).

Phase 2 (length 512) at the reference batch 256, compiled for TPU slices with
`python -m bert_jax.plan --config configs/large.py --topology <slice>`:
- it fits v5p-8 and v6e-8 as is;
- on v4-8, add `--config.mesh.param_sharding=fsdp`;
- on v5e-8 with libtpu 0.0.42.1 (jax 0.10.2, Python 3.11), add
  `--config.train.grad_accum_steps=2`; with libtpu 0.0.50.1 (jax 0.12, Python 3.12+)
  it fits as is (14.46 of 16 GiB a device).
Numbers: docs/multi-host-and-tpu.md, "The reference recipe on four slices".
On v6e-8, `--config.model.remat_policy=save_dots` compiled to the same memory as full
remat with 22% fewer XLA FLOPs per step (step time not measured; libtpu crashed
compiling it at the default stack limit here): "Remat policies" in that file.
"""

from bert_jax import default_config


def get_config():
  c = default_config.get_config()
  c.model.hidden_size = 1024
  c.model.num_layers = 24
  c.model.num_heads = 16
  c.model.intermediate_size = 4096
  c.model.remat = True
  return c
