"""Ahead-of-time plans: a run's steps, built as the trainer builds them, compiled for some devices, and what they need.

`make_plan(settings, devices)` builds the steps exactly as train.py does
(`train.steps.make_steps`: same settings, mesh, shardings, dtype, remat, gradient
accumulation, objective) and compiles every phase's train step and the eval
step from abstract values (`jax.ShapeDtypeStruct`s carrying `NamedSharding`s),
so nothing is allocated and the devices may be a TPU slice that this host
only describes (`bert_jax.planner.topology`). Per device it reports the
parameters, optimizer state and batch (from the shardings), the compiler's
temporaries and total (`compiled.memory_analysis()`) against the device's
memory, the FLOPs of one step (analytic, `bert_jax.model.flops`, and XLA's
`cost_analysis()`), and the step's collectives (`bert_jax.planner.hlo`).

When a train step does not fit, `make_plan` has `bert_jax.planner.fit_search`
find the largest per-device batch that does and which changes of the config make
the requested batch fit, each verified by a compile.

Shape legend: B global batch, L sequence length, P max predictions.
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.train.steps import make_steps, planned_bytes
from bert_jax.parallel import sharding
from bert_jax.model import family, flops, precision
from bert_jax.planner import hlo
from bert_jax.planner.fit_search import search_fixes
from bert_jax.data.pretraining_data import Batch
from bert_jax.data.tokenizer import SPECIAL_TOKENS, SpecialIds
from bert_jax.settings import Phase, Settings
from bert_jax.storage import fs

GIB = 1024**3
# The ids a trained vocabulary gives [PAD], [UNK], [CLS], [SEP], [MASK] (first, in that
# order): constants of the step, not its cost.
_SPECIAL_IDS = SpecialIds(*range(len(SPECIAL_TOKENS)))


@dataclasses.dataclass
class StepPlan:
  """One compiled step (per device unless said otherwise)."""
  kind: str  # 'train' | 'eval'
  phase: int
  seq_len: int
  max_predictions: int
  batch: int  # global
  per_device_batch: int
  params_bytes: int
  opt_state_bytes: int  # 0 for eval
  batch_bytes: int
  compiled: bool
  error: str = ""  # one line, when the compiler refused (e.g. out of HBM)
  temp_bytes: int = 0
  argument_bytes: int = 0
  output_bytes: int = 0
  alias_bytes: int = 0
  code_bytes: int = 0
  total_bytes: int = 0  # arguments + outputs - aliased + temporaries + program
  memory_bytes: Optional[int] = None  # the device's memory (HBM), None if unknown
  model_flops: float = 0.0  # analytic, per device
  xla_flops: float = 0.0  # cost_analysis, per device
  collectives: list = dataclasses.field(default_factory=list)
  dot_dtypes: dict = dataclasses.field(default_factory=dict)  # 'bf16 x bf16 -> f32': count
  narrow_output_dots: list = dataclasses.field(default_factory=list)  # op names, not -> f32
  optimization_barriers: int = 0  # opt-barrier ops left in the compiled program
  host_transfers: list = dataclasses.field(default_factory=list)
  custom_calls: dict = dataclasses.field(default_factory=dict)  # target: count
  compile_seconds: float = 0.0

  @property
  def name(self) -> str:
    return f"{self.kind} phase {self.phase} (L={self.seq_len}, P={self.max_predictions})"

  @property
  def fits(self) -> bool:
    return self.compiled and (self.memory_bytes is None or self.total_bytes <= self.memory_bytes)

  @property
  def headroom_bytes(self) -> Optional[int]:
    return None if self.memory_bytes is None else self.memory_bytes - self.total_bytes

  def to_dict(self) -> dict:
    d = dataclasses.asdict(self)
    d.update(name=self.name, fits=self.fits, headroom_bytes=self.headroom_bytes,
             collectives=[c.to_dict() if hasattr(c, "to_dict") else c for c in self.collectives])
    return d


@dataclasses.dataclass
class Plan:
  target: str  # what was compiled for, in words
  platform: str
  num_devices: int
  device_kind: str
  memory_bytes: Optional[int]
  memory_label: str  # 'HBM' | 'host RAM share'
  mesh: dict
  model: dict  # layers, hidden, vocab, params, dtype, remat, param_sharding, grad_accum
  steps: list  # [StepPlan]
  peak_flops: Optional[float] = None
  max_per_device_batch: Optional[int] = None  # when a train step does not fit
  max_batch_exact: bool = True  # False: the search ran out of compiles; a larger batch may fit
  fixes: list = dataclasses.field(default_factory=list)  # [fit_search.Fix]
  versions: dict = dataclasses.field(default_factory=dict)

  @property
  def fits(self) -> bool:
    return all(s.fits for s in self.steps)

  def to_dict(self) -> dict:
    d = {k: v for k, v in dataclasses.asdict(self).items() if k not in ("steps", "fixes")}
    d.update(fits=self.fits, steps=[s.to_dict() for s in self.steps],
             fixes=[f.to_dict() for f in self.fixes])
    return d


# ----------------------------------------------------------------------------
# Building and compiling the steps


def for_platform(s: Settings, platform: str) -> Settings:
  """`s` with config.model.dtype and attention_kernel 'auto' resolved for the devices
  compiled for, not this host."""
  model = s.model
  if s.requested_dtype == "auto":
    model = dataclasses.replace(model, dtype=precision.resolve_dtype("auto", platform))
  if s.requested_attention_kernel == "auto":
    model = dataclasses.replace(model, attention_kernel=precision.resolve_attention_kernel(
        "auto", model.attention_dropout_rate, [ph.seq_len for ph in s.train.phases], platform))
  return s if model is s.model else dataclasses.replace(s, model=model)


def planned_vocab_size(s: Settings) -> int:
  """The vocabulary the run will have: data.vocab_file's lines, else data.vocab_size (an upper
  bound: a trained vocabulary has at most that many tokens)."""
  if s.data.vocab_file:
    with fs.open(s.data.vocab_file, encoding="utf-8") as f:
      return sum(1 for line in f if line.rstrip("\n"))
  return s.data.vocab_size


def per_device_bytes(tree: Any) -> int:
  """Bytes on the most loaded device of a tree of sharded ShapeDtypeStructs."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    shape = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape
    total += int(np.prod(shape, dtype=np.int64)) * jnp.dtype(leaf.dtype).itemsize
  return total


def abstract_batch(mesh, batch_size: int, seq_len: int) -> Batch:
  """A global batch of B x L as ShapeDtypeStructs split over the data axis."""
  bs = sharding.batch_sharding(mesh)
  sd = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=bs)
  BxL = (batch_size, seq_len)
  return Batch(sd(BxL, jnp.int32), sd(BxL, jnp.int32), sd(BxL, jnp.int32),
               sd((batch_size,), jnp.int32), sd((batch_size,), jnp.float32))


def _one_line(e: BaseException) -> str:
  text = " ".join(str(e).split())
  m = re.search(r"(RESOURCE_EXHAUSTED:.*?)(?: \(|$|; )", text)
  return (m.group(1) if m else text)[:400]


def _required_bytes(error: str) -> int:
  """What an out-of-memory compile error says the step needs (0 if it does not say)."""
  units = {"K": 1024, "M": 1024**2, "G": GIB, "T": 1024**4}
  for pattern in (r"Used ([\d.]+)([KMGT]) of", r"required for HLO temporaries \(([\d.]+)([KMGT])\)",
                  r"total memory required[^(]*\(([\d.]+)([KMGT])\)"):
    m = re.search(pattern, error)
    if m:
      return int(float(m.group(1)) * units[m.group(2)])
  return 0


def _cost(compiled) -> dict:
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else {}
  return cost or {}


class Planner:
  """Compiles the steps of one settings on one set of devices."""

  def __init__(self, s: Settings, devices: list, vocab_size: int,
               memory_bytes: Optional[int] = None, log: Callable[[str], None] = lambda _: None):
    self.devices = list(devices)
    self.platform = self.devices[0].platform
    self.s = for_platform(s, self.platform)
    self.vocab_size = vocab_size
    self.memory_bytes = memory_bytes
    self.log = log
    self.mesh = sharding.make_mesh(self.s.mesh.model_parallel, self.devices)
    self.steps = make_steps(
        self.s, vocab_size, _SPECIAL_IDS,
        np.zeros(vocab_size, bool) if self.s.masking.whole_word else None, mesh=self.mesh)

  def variant(self, s: Settings) -> "Planner":
    """A planner of other settings on the same devices."""
    return Planner(s, self.devices, self.vocab_size, self.memory_bytes, self.log)

  def check_batch(self, batch_size: Optional[int] = None) -> None:
    """The batch given, or every phase's, against the mesh."""
    sizes = ([(batch_size, "train.batch_size")] if batch_size is not None
             else self.s.train.batch_fields())
    for size, field in sizes:
      sharding.check_batch(size, self.mesh, self.s.train.grad_accum_steps, field)

  def _flops(self, kind: str, B: int, ph: Phase) -> float:
    c = self.steps.bert_config
    f = family.of(c).flops(c, "train", B, ph.seq_len, ph.max_predictions)
    return (f if kind == "train" else f / 3.0) / len(self.devices)  # eval: the forward only

  def compile_step(self, kind: str, ph: Phase, batch_size: Optional[int] = None) -> StepPlan:
    B = self.s.train.batch_of(ph) if batch_size is None else batch_size
    st, mesh = self.steps, self.mesh
    batch = abstract_batch(mesh, B, ph.seq_len)
    data = mesh.shape[sharding.DATA]
    plan = StepPlan(kind, ph.index, ph.seq_len, ph.max_predictions, B, B // data,
                    per_device_bytes(st.abstract_params),
                    per_device_bytes(st.abstract_opt_state) if kind == "train" else 0,
                    per_device_bytes(batch), compiled=False, memory_bytes=self.memory_bytes,
                    model_flops=self._flops(kind, B, ph))
    rep = sharding.replicated(mesh)
    scalar = jax.ShapeDtypeStruct((), jnp.int32, sharding=rep)
    t = time.perf_counter()
    try:
      if kind == "train":
        lowered = st.train_step_fn(ph).lower(
            st.abstract_params, st.abstract_opt_state, scalar, batch)
      else:
        lowered = st.eval_step_fn(ph).lower(
            st.abstract_params, scalar, batch)
      compiled = lowered.compile()
    except Exception as e:  # XlaRuntimeError: RESOURCE_EXHAUSTED and the like
      plan.compile_seconds = time.perf_counter() - t
      plan.error = _one_line(e)
      plan.total_bytes = _required_bytes(" ".join(str(e).split()))  # the number is past a '('
      self.log(f"  {plan.name}, B={B}: does not compile ({plan.compile_seconds:.0f} s): "
               f"{plan.error[:160]}")
      return plan
    plan.compile_seconds = time.perf_counter() - t
    plan.compiled = True
    mem = compiled.memory_analysis()
    if mem is not None:
      plan.temp_bytes = int(mem.temp_size_in_bytes)
      plan.argument_bytes = int(mem.argument_size_in_bytes)
      plan.output_bytes = int(mem.output_size_in_bytes)
      plan.alias_bytes = int(mem.alias_size_in_bytes)
      plan.code_bytes = int(mem.generated_code_size_in_bytes)
      plan.total_bytes = planned_bytes(compiled)  # as every training run logs it
    plan.xla_flops = float(_cost(compiled).get("flops", 0.0))
    module = hlo.parse(compiled.as_text())
    plan.collectives = hlo.collectives(module)
    for lhs, rhs, out, where in hlo.dots(module):
      key = f"{lhs} x {rhs} -> {out}"
      plan.dot_dtypes[key] = plan.dot_dtypes.get(key, 0) + 1
      if out not in ("f32", "f64"):
        plan.narrow_output_dots.append(where)
    plan.optimization_barriers = hlo.opcode_counts(module, ("opt-barrier",))["opt-barrier"]
    plan.host_transfers = hlo.host_transfers(module)
    plan.custom_calls = dict(hlo.custom_call_targets(module))
    self.log(f"  {plan.name}, B={B}: {plan.total_bytes / GIB:.2f} GiB per device "
             f"({plan.compile_seconds:.0f} s)")
    return plan

  def model_summary(self) -> dict:
    c = self.steps.bert_config
    n = sum(int(np.prod(a.shape)) for a in jax.tree.leaves(self.steps.abstract_params))
    return {"layers": c.num_layers, "hidden_size": c.hidden_size, "heads": c.num_heads,
            "intermediate_size": c.intermediate_size, "vocab_size": c.vocab_size,
            "padded_vocab_size": c.padded_vocab_size, "params": n, "dtype": c.dtype,
            "remat": c.remat, "remat_policy": c.remat_policy, "dropout_rng": c.dropout_rng,
            "param_sharding": self.s.mesh.param_sharding,
            "grad_accum_steps": self.s.train.grad_accum_steps,
            "batch_size": self.s.train.batch_size, "objective": self.s.objective}


def make_plan(s: Settings, devices: list, target: str, memory_bytes: Optional[int],
              memory_label: str = "HBM", vocab_size: Optional[int] = None,
              include_eval: bool = True, search: bool = True, max_search_compiles: int = 12,
              log: Callable[[str], None] = lambda _: None) -> Plan:
  """Compiles every phase's train step (and eval step) of `s` for `devices`; see the module doc."""
  vocab = planned_vocab_size(s) if vocab_size is None else vocab_size
  p = Planner(s, devices, vocab, memory_bytes, log)
  p.check_batch()
  d0 = p.devices[0]
  plan = Plan(target=target, platform=p.platform, num_devices=len(p.devices),
              device_kind=d0.device_kind, memory_bytes=memory_bytes, memory_label=memory_label,
              mesh={k: int(v) for k, v in p.mesh.shape.items()}, model=p.model_summary(),
              steps=[], peak_flops=flops.peak_flops(d0.device_kind), versions=versions())
  for ph in p.s.train.phases:
    plan.steps.append(p.compile_step("train", ph))
  if include_eval:
    for ph in p.s.train.phases:
      plan.steps.append(p.compile_step("eval", ph))
  failing = [st for st in plan.steps if st.kind == "train" and not st.fits]
  if failing and search:
    search_fixes(p, plan, failing, max_search_compiles)
  return plan


def versions() -> dict:
  from bert_jax.planner import topology
  import jaxlib
  out = {"jax": jax.__version__, "jaxlib": jaxlib.__version__}
  tpu = topology.installed_libtpu()
  if tpu:
    out["libtpu"] = tpu
  return out
