"""What to change when a train step does not fit: the largest per-device batch that does,
and which changes of the config make the requested batch fit, each verified by a compile.

`search_fixes(planner, plan, failing)` takes a `plan.Planner` (anything with its
`s`, `mesh`, `platform`, `memory_bytes`, `log`, `compile_step`, `check_batch` and
`variant`) and fills `plan.max_per_device_batch`, `plan.max_batch_exact` and
`plan.fixes` ([Fix]). The changes tried: FSDP, splash attention (TPU), full remat,
and gradient accumulation with micro-batches no larger than the largest batch that
fits; when that accumulation does not fit (its float32 gradient sum sits beside the
gradients), the same accumulation with full remat when remat alone did not fit, else
the next smaller micro-batch, which is also tried when the remat fit leaves over half of
the memory free (remat's recompute costs a third more FLOPs a step).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from bert_jax.errors import ConfigError
from bert_jax.settings import model as model_config
from bert_jax.parallel import sharding
from bert_jax.settings import Phase, Settings


@dataclasses.dataclass
class Fix:
  """A change of the config that was compiled to see whether the train steps then fit."""
  field: str  # '--config.train.grad_accum_steps=4' (one change may set several fields)
  fits: bool
  total_bytes: int  # the largest total of the train steps with it
  note: str = ""

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)


def largest_fitting(measure: Callable[[int], tuple[bool, int]], failing: int, failing_total: int,
                    memory: int, step: int = 1, max_compiles: int = 12,
                    fixed_bytes: int = 0) -> tuple[int, bool]:
  """(rows, exact): the largest multiple of `step` below `failing` rows seen to fit.

  `measure` compiles and returns (fits, total bytes; 0 when unknown). Memory
  grows about linearly with the batch, so each guess interpolates between the
  largest batch known to fit and the smallest known not to (the first from
  what the failing compile said it needs against `memory`, and `fixed_bytes`,
  what a batch of none would need: the state); a guess that does
  not halve the interval is followed by a plain bisection. `rows` is 0 when no
  batch was seen to fit; `exact` says whether `rows + step` was seen not to, and is
  False when `max_compiles` ran out first (`rows` is then a lower bound, still
  verified by a compile, that gradient accumulation can use).
  """
  lo, lo_total = 0, fixed_bytes  # in units of `step` rows
  hi, hi_total = failing // step, failing_total
  same_side, last = 0, None
  for _ in range(max_compiles):
    if hi - lo <= 1:
      return lo * step, True
    guess = (lo + hi) // 2
    if hi_total > lo_total and same_side < 2:  # interpolate: rows where total == memory
      guess = lo + int((memory - lo_total) * (hi - lo) / (hi_total - lo_total))
    guess = min(max(guess, lo + 1), hi - 1)
    fits, total = measure(guess * step)
    side = "lo" if fits else "hi"
    same_side = same_side + 1 if side == last else 1
    last = side
    if fits:
      lo, lo_total = guess, total
    else:
      hi, hi_total = guess, total or hi_total
  return lo * step, hi - lo <= 1


def search_fixes(p, plan, failing: list, max_compiles: int = 12) -> None:
  """Fills plan.max_per_device_batch and plan.fixes for the train steps that do not fit."""
  worst = max(failing, key=lambda st: (st.seq_len, st.total_bytes))
  ph = _phase(p.s, worst.phase)
  data = p.mesh.shape[sharding.DATA]
  accum = p.s.train.grad_accum_steps

  def measure(per_device: int) -> tuple[bool, int]:
    st = p.compile_step("train", ph, per_device * data)
    return st.fits, st.total_bytes

  p.log(f"searching the largest per-device batch that fits {worst.name} ...")
  best, plan.max_batch_exact = largest_fitting(
      measure, worst.per_device_batch, worst.total_bytes, p.memory_bytes or 0, accum,
      max_compiles, worst.params_bytes + worst.opt_state_bytes)
  plan.max_per_device_batch = best if best or plan.max_batch_exact else None

  def try_fix(changes: dict[str, Any], note: str = "") -> Fix:
    """One change of one or more fields ('section.name': value), compiled."""
    s2 = p.s
    for field, value in changes.items():
      s2 = _override(s2, field, value)
    flags = " ".join(f"--config.{field}={value}" for field, value in changes.items())
    try:
      p2 = p.variant(s2)
      p2.check_batch(s2.train.batch_size)
    except ConfigError as e:
      plan.fixes.append(Fix(flags, False, 0, str(e)))
      return plan.fixes[-1]
    p.log(f"trying {flags} ...")
    steps = [p2.compile_step("train", _phase(p2.s, st.phase)) for st in failing]
    plan.fixes.append(Fix(flags, all(st.fits for st in steps),
                          max(st.total_bytes for st in steps), note))
    return plan.fixes[-1]

  if p.s.mesh.param_sharding != "fsdp":
    try_fix({"mesh.param_sharding": "fsdp"})
  splash = splash_fix(p)
  if splash:
    try_fix(*splash)
  # Full remat only: remat_policy=save_dots needs as much memory here in the one case
  # measured (BERT-Large, 512, v6e-8), and libtpu's compile of it can crash the process
  # (docs/multi-host-and-tpu.md), which would end the search.
  remat = full_remat(p.s)
  if remat and try_fix(remat).fits:
    remat = {}  # fits alone: with accumulation too would say nothing new
  if plan.max_per_device_batch:
    _try_accumulation(try_fix, worst.per_device_batch, plan.max_per_device_batch, remat,
                      p.memory_bytes or 0)


def _try_accumulation(try_fix: Callable[..., Fix], per_device: int, largest: int,
                      remat: dict, memory: int) -> None:
  """Micro-batches no larger than the largest batch that fits (the steps must divide the
  batch evenly). Accumulation keeps a float32 sum of the gradients beside them, so that
  micro-batch can still be too large: then the same accumulation with `remat` (full remat
  where it did not fit alone: it frees the activations, ModernBERT-Large at 1024 on
  v5e-8), or without it, the next smaller micro-batch. Remat recomputes the forward, a
  third more FLOPs a step: when it fits with over half of `memory` free, the next smaller
  micro-batch is tried without it too (ModernBERT-Large on v5p-8: 22.7 of 95 GiB with
  remat, 85.8 without at 72 rows instead of 96; on v5e-8 remat's 11.4 of 16 GiB is the
  only fit)."""
  want = -(-per_device // largest)
  options = [a for a in range(want, per_device + 1) if per_device % a == 0]
  if not options:
    return
  note = lambda a: f"micro-batches of {per_device // a} per device"
  if try_fix({"train.grad_accum_steps": options[0]}, note(options[0])).fits:
    return
  spares = ""
  if remat:
    with_remat = try_fix({**remat, "train.grad_accum_steps": options[0]}, note(options[0]))
    if not (with_remat.fits and 2 * with_remat.total_bytes <= memory):
      return
    spares = "; without remat's recomputed forward"
  if len(options) > 1:
    try_fix({"train.grad_accum_steps": options[1]}, note(options[1]) + spares)


def full_remat(s: Settings) -> dict:
  """The fields that turn full remat on ({} when it is on already)."""
  if not s.model.remat:
    return {"model.remat": True} if s.model.remat_policy == "full" else {
        "model.remat": True, "model.remat_policy": "full"}
  return {} if s.model.remat_policy == "full" else {"model.remat_policy": "full"}


def splash_fix(p) -> Optional[tuple[dict, str]]:
  """Splash attention as a change to try (TPU only; every length a multiple of 128): it
  keeps no [B, H, L, L] scores. It has no attention dropout, so a nonzero rate goes to 0
  with it, and the note says so."""
  if p.platform != "tpu" or p.s.model.attention_kernel == "splash":
    return None
  if not model_config.splash_tiles_fit([ph.seq_len for ph in p.s.train.phases]):
    return None
  changes: dict[str, Any] = {"model.attention_kernel": "splash"}
  note = ""
  if p.s.model.attention_dropout_rate:
    changes["model.attention_dropout_rate"] = 0.0
    note = "splash has no attention dropout"
  return changes, note


def _phase(s: Settings, index: int) -> Phase:
  return next(ph for ph in s.train.phases if ph.index == index)


def _override(s: Settings, field: str, value: Any) -> Settings:
  section, name = field.split(".")
  if section == "mesh":
    return dataclasses.replace(s, mesh=dataclasses.replace(s.mesh, **{name: value}))
  if section == "model":
    return dataclasses.replace(s, model=dataclasses.replace(s.model, **{name: value}))
  if section == "train":
    return dataclasses.replace(s, train=dataclasses.replace(s.train, **{name: value}))
  raise ValueError(field)
