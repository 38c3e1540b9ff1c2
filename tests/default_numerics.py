"""The default model's numbers, for the test that refactors keep them (test_default_numerics).

`python tests/default_numerics.py` prints them as JSON: three training steps of BERT's
default config (dropout on, shrunk to 2 layers of width 32 so it compiles in seconds)
and of ModernBERT's, from fixed weights and batches, with the losses and parameter
sums written as float hex, so a commit before a refactor and one after can be compared
bit for bit on one machine. tests/golden/default_numerics.json holds the numbers of the
commit before architecture round 5 (issue 55).
"""

import inspect
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from bert_jax import default_config, settings  # noqa: E402
from bert_jax.data.pretraining_data import Batch  # noqa: E402
from bert_jax.parallel import sharding  # noqa: E402
from bert_jax.train import steps as steps_lib  # noqa: E402

VOCAB, L, B, P = 200, 32, 8, 5


def _config(family: str):
  c = default_config.get_config()
  c.model.update(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                 max_position_embeddings=L)
  c.train.update(batch_size=B, warmup_steps=1, num_train_steps=10, seq_lens=(L,),
                 phase_fractions=(1.0,),
                 max_predictions=(P,))
  if family == "modernbert":
    c.model.update(family="modernbert", layer_norm_eps=1e-5, local_attention=8)
    c.objective = "mlm"
  return c


def _batch(seed: int) -> Batch:
  rs = np.random.RandomState(seed)
  ids = rs.randint(5, VOCAB, size=(B, L)).astype(np.int32)
  ids[:, 0], ids[:, 10], ids[:, 25], ids[:, 26:] = 2, 3, 3, 0
  seg = np.zeros_like(ids)
  seg[:, 11:26] = 1
  return Batch.from_features({
      "input_ids": ids, "segment_ids": seg, "input_mask": (ids != 0).astype(np.int32),
      "next_sentence_label": rs.randint(0, 2, size=B).astype(np.int32)})


def _make_steps(s, mesh):
  if "mask_id" in inspect.signature(steps_lib.make_steps).parameters:  # before issue 55
    return steps_lib.make_steps(s, VOCAB, [0, 1, 2, 3, 4], 4, mesh=mesh)
  from bert_jax.data.tokenizer import SpecialIds  # pylint: disable=import-outside-toplevel
  return steps_lib.make_steps(s, VOCAB, SpecialIds(0, 1, 2, 3, 4), mesh=mesh)


def numbers(family: str) -> dict:
  """Losses, learning rates and parameter sums of 3 steps, and an evaluation after them."""
  mesh = sharding.make_mesh(1, devices=jax.devices()[:1])
  t = _make_steps(settings.from_config(_config(family)), mesh)
  params, opt = t.init_state()
  phase = getattr(t, "phases", [P])[0]  # the step functions took the predictions before 55
  step_fn = t.train_step_fn(phase)
  out = {"loss": [], "mlm_loss": [], "learning_rate": []}
  for i in range(3):
    params, opt, m = step_fn(params, opt, jnp.int32(i), sharding.global_batch(_batch(i), mesh))
    for k in out:
      out[k].append(float(m[k]).hex())
  leaves = [np.asarray(x, np.float64) for x in jax.tree.leaves(jax.device_get(params))]
  out["param_abs_sum"] = float(sum(np.abs(x).sum() for x in leaves)).hex()
  out["param_square_sum"] = float(sum((x * x).sum() for x in leaves)).hex()
  ev = t.evaluate(params, [_batch(7)], phase)
  out["eval_mlm_loss"] = float(ev["mlm_loss"]).hex()
  return out


if __name__ == "__main__":
  print(json.dumps({f: numbers(f) for f in ("bert", "modernbert")}, indent=1))
