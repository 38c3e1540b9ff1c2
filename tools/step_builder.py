"""Our compiled step for a benchmark case: the one builder `bench`, `profile_step`
and `ab_step` share.

A train case builds the real training step of the library (`make_steps(...)
.train_step_fn`: masking, forward, backward, clipping, AdamW in one jitted
function with donated state) from the default config at the case's size; a
features case builds the encoder forward (`BertModel`, sequence and pooled
outputs). Both run on one device, with the case's fixed-seed batch.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import ml_collections

from bert_jax.model import build as model_build
from bert_jax.model import precision
from bert_jax import settings as settings_lib
from bert_jax.parallel import sharding
from bert_jax.settings.model import ModelConfig
from bert_jax.model.bert import BertModel
from bert_jax.data.pretraining_data import Batch
from bert_jax.trainer import make_steps
from configs import default
from tools import cases
from tools.cases import Case, ModelSize


@dataclasses.dataclass
class BuiltStep:
  """A compiled step with its state and batch bound: `run(i)` runs step i and blocks."""
  run: Callable[[int], None]
  compiled: Any  # jax.stages.Compiled: `.as_text()` is the optimized HLO
  compile_s: float  # jit lower + compile
  bert_config: ModelConfig


def ours_config(size: ModelSize, case: Case, dtype: str,
                overrides: Optional[dict] = None) -> ml_collections.ConfigDict:
  """The default config at this size, batch and length, then `overrides`.

  `overrides` sets config fields by dotted name, e.g. {"model.dropout_rng": "threefry"}.
  """
  c = default.get_config()
  m = c.model
  m.num_layers, m.hidden_size, m.num_heads = size.num_layers, size.hidden_size, size.num_heads
  m.intermediate_size, m.dtype = size.intermediate_size, dtype
  c.train.batch_size = case.batch
  c.train.phase_fractions, c.train.seq_lens = (1.0,), (case.seq_len,)
  c.train.max_predictions = (max(1, case.predictions),)
  c.train.warmup_steps = 10  # the schedule's shape costs nothing; keep lr non-zero
  for name, value in (overrides or {}).items():
    *path, field = name.split(".")
    node = c
    for p in path:
      node = node[p]
    if field not in node:
      raise KeyError(f"config has no field {name!r}")
    node[field] = value
  return c


def build(case: Case, size: ModelSize, dtype: str,
          overrides: Optional[dict] = None) -> BuiltStep:
  """Our train step (train cases) or feature forward (features cases), compiled."""
  s = settings_lib.from_config(ours_config(size, case, dtype, overrides))
  mesh = sharding.make_mesh(1, devices=jax.devices()[:1])
  batch = Batch.from_features(cases.make_batch(case, size.vocab_size))
  if case.kind == "train":
    return _build_train(s, case, size, mesh, batch)
  if case.kind == "features":
    return _build_features(s.model_config(size.vocab_size), batch)
  raise ValueError(f"case {case.name!r} of kind {case.kind!r} has no model step")


def build_case(name: str, dtype: str, batch_size: int = 0,
               overrides: Optional[dict] = None) -> BuiltStep:
  """`build` for a case by name at its full size, optionally with another batch size."""
  case = cases.find(name)
  if batch_size:
    case = dataclasses.replace(case, batch=batch_size)
  return build(case, cases.model_sizes()[case.model], dtype, overrides)


def _build_train(s: settings_lib.Settings, case: Case, size: ModelSize, mesh,
                 batch: Batch) -> BuiltStep:
  steps = make_steps(s, size.vocab_size, cases.SPECIAL_IDS, mesh=mesh)
  state = list(steps.init_state())
  gb = sharding.global_batch(batch, mesh)
  t = time.perf_counter()
  phase = dataclasses.replace(steps.phases[0], max_predictions=case.predictions)
  compiled = steps.train_step_fn(phase).lower(
      state[0], state[1], jnp.int32(0), gb).compile()
  compile_s = time.perf_counter() - t

  def run(i: int) -> None:
    state[0], state[1], metrics = compiled(state[0], state[1], jnp.int32(i), gb)
    jax.block_until_ready((state, metrics))
  return BuiltStep(run, compiled, compile_s, steps.bert_config)


def _build_features(bert_config: ModelConfig, batch: Batch) -> BuiltStep:
  model = BertModel(bert_config)
  # The encoder of a fresh pre-training tree; XLA drops the heads' init.
  params = jax.jit(lambda k: model_build.init_params(bert_config, k)["bert"])(jax.random.key(0))
  ids, seg, msk = (jax.device_put(x) for x in (
      batch.input_ids_BxL, batch.segment_ids_BxL, batch.input_mask_BxL))

  def extract(p, ids_BxL, seg_BxL, mask_BxL):
    out = model.apply({"params": p}, ids_BxL, seg_BxL, mask_BxL)
    return out.sequence_BxLxD, out.pooled_BxD

  t = time.perf_counter()
  compiled = jax.jit(extract).lower(params, ids, seg, msk).compile(
      precision.forward_compiler_options(bert_config.cpu_forward_dots, bert_config.dtype))
  compile_s = time.perf_counter() - t

  def run(i: int) -> None:
    jax.block_until_ready(compiled(params, ids, seg, msk))
  return BuiltStep(run, compiled, compile_s, bert_config)
