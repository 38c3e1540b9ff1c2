"""The planner on this host's CPU devices (no libtpu): every step compiles, fits, and has
the collectives of its parameter sharding. The TPU tier (tests/test_tpu_plan.py, run again
by .ci/run with libtpu installed) compiles for TPU slices; this file is not in it."""

import json

import jax
import pytest

from bert_jax.planner import plan as plan_lib, plan_report
from test_tpu_plan import tiny_settings


@pytest.mark.slow
def test_local_plan_on_cpu_devices_replicated_and_fsdp():
  devices = jax.devices()
  assert len(devices) == 8
  plans = {}
  for mode in ("replicated", "fsdp"):
    s = tiny_settings(**{"mesh.param_sharding": mode})
    plans[mode] = plan_lib.make_plan(s, devices, "8 cpus", 1 << 40, "RAM/dev", search=False,
                                     include_eval=mode == "replicated")  # one eval is enough
  rep, fsdp = plans["replicated"], plans["fsdp"]
  assert [st.kind for st in rep.steps] == ["train", "eval"]
  for p in (rep, fsdp):
    assert p.fits
    train = p.steps[0]
    assert train.compiled and train.temp_bytes > 0 and train.xla_flops > 0
    # arguments = parameters + optimizer state + batch (+ the step counter)
    assert abs(train.argument_bytes - (train.params_bytes + train.opt_state_bytes
                                       + train.batch_bytes)) <= 64
    assert train.model_flops > 0 and train.host_transfers == []
  floats = lambda st: {c.kind: c.float_bytes for c in st.collectives}
  # replicated: gradients all-reduced, no parameter gathered (XLA CPU gathers a few int32
  # masking indices for top_k, which is not parameter traffic)
  assert floats(rep.steps[0])["all-reduce"] > 0 and not floats(rep.steps[0]).get("all-gather")
  assert floats(fsdp.steps[0])["all-gather"] > 0
  assert fsdp.steps[0].params_bytes * 4 < rep.steps[0].params_bytes
  text = plan_report.format_plan(rep)
  assert "train phase 0" in text and "fits" in text and "all-reduce" in text
  json.dumps(rep.to_dict())  # serialisable as --json writes it


@pytest.mark.slow
def test_each_stage_is_planned_at_its_own_length_and_batch_and_the_tightest_is_named():
  """Issue 57: a staged recipe's phases each compile at their own batch; the report
  names the phase with the least memory to spare."""
  s = tiny_settings(**{"train.phase_fractions": (0.5, 0.5), "train.seq_lens": (64, 128),
                       "train.max_predictions": (10, 20), "train.phase_batch_sizes": (32, 8)})
  plan = plan_lib.make_plan(s, jax.devices(), "8 cpus", 1 << 40, "RAM/dev", search=False,
                            include_eval=False)
  assert [(st.phase, st.seq_len, st.batch) for st in plan.steps] == [(0, 64, 32), (1, 128, 8)]
  tight = min(plan.steps, key=lambda st: st.headroom_bytes)
  text = plan_report.format_plan(plan)
  assert f"the tightest is {tight.name} (B={tight.batch})" in text
