"""TPU planning without a TPU: slice names, the HLO reader, the planner, and compiled TPU steps.

The tests of the compiled TPU program need libtpu (pip install -r
requirements-tpu.txt) and are skipped without it; the rest run anywhere.
"""

import dataclasses
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bert_jax
from bert_jax import settings as settings_lib
from bert_jax.model import precision
from bert_jax.planner import fit_search, hlo, plan as plan_lib, plan_report, topology
from bert_jax.data.tokenizer import SpecialIds
from bert_jax.errors import TopologyError

import configs.base as base
import configs.tiny as tiny

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAVE_LIBTPU = topology.installed_libtpu() is not None
needs_libtpu = pytest.mark.skipif(
    not HAVE_LIBTPU, reason="libtpu is not installed (pip install -r requirements-tpu.txt)")


def overridden(c, overrides: dict):
  """Settings of config `c` with `overrides` ('section.field': value) applied."""
  c.update_from_flattened_dict(overrides)
  return settings_lib.from_config(c)


def tiny_settings(**overrides):
  """The tiny config, shrunk further so a step compiles in seconds; mixed bf16 as on a TPU."""
  c = tiny.get_config()
  c.model.hidden_size, c.model.num_layers, c.model.num_heads = 32, 1, 2
  c.model.intermediate_size, c.model.dtype = 64, "bfloat16"
  c.data.vocab_size, c.train.batch_size = 512, 16
  return overridden(c, overrides)


# ----------------------------------------------------------------------------
# Slice names -> topologies (no libtpu needed)


@pytest.mark.parametrize("name, libtpu_name, devices, hbm_gib, hosts, megacore", [
    ("v4-8", "v4:2x2x1", 4, 32, 1, True),  # 4 chips = 8 TensorCores, one device per chip
    ("v4-16", "v4:2x2x2", 8, 32, 2, True),
    ("v4-32", "v4:2x2x4", 16, 32, 4, True),
    ("v4-128", "v4:4x4x4", 64, 32, 16, True),
    ("v5p-8", "v5:2x2x1", 4, 95, 1, True),
    ("v5e-8", "v5e:2x4", 8, 16, 1, False),
    ("v5litepod-8", "v5e:2x4", 8, 16, 1, False),
    ("v5e-16", "v5e:4x4", 16, 16, 4, False),
    ("v5litepod-256", "v5e:16x16", 256, 16, 64, False),
    ("v6e-8", "v6e:2x4", 8, 32, 1, False),
    ("tpu7x-8", "tpu7x:2x2x1", 8, 96, 1, False),  # 4 chips of 2 devices, 192 GiB each
    ("v3-8", "v3:2x2", 8, 16, 1, False),  # v3 shows each of a chip's two cores as a device
    ("V4:2x2x1", "v4:2x2x1", 4, 32, 1, True),  # libtpu's own form, in chips
])
def test_slice_names_map_to_the_devices_a_job_gets(name, libtpu_name, devices, hbm_gib, hosts,
                                                   megacore):
  t = topology.parse(name)
  assert t.libtpu_name == libtpu_name
  assert t.num_devices == devices
  assert t.hbm_bytes_per_device == hbm_gib * topology.GIB
  assert t.num_hosts == hosts
  kw = t.topology_kwargs()
  assert kw["chip_config_name"] == ("megacore" if megacore else "default")
  assert name in t.describe() and f"{devices} devices" in t.describe()


def test_large_slices_wrap_around():
  assert topology.parse("v4-128").topology_kwargs()["wrap"] == (True, True, True)
  assert topology.parse("v4-64").topology_kwargs()["wrap"] == (False, False, False)
  assert topology.parse("v5e-256").topology_kwargs()["wrap"] == (True, True, False)


@pytest.mark.parametrize("name, says", [
    ("v9-8", "unknown TPU slice"), ("tpu", "unknown TPU slice"), ("v4-6", "v4-8, v4-16"),
    ("v4-4", "v4-8, v4-16"), ("v5e-2", "v5e-1, v5e-4"), ("v5e:2x2x1", "2-D grid"),
    ("v4:2x2", "3-D grid"),
])
def test_unknown_slices_fail_in_one_line(name, says):
  with pytest.raises(TopologyError) as e:
    topology.parse(name)
  text = str(e.value)
  assert "\n" not in text and repr(name) in text and says in text and "expected" in text


def test_libtpu_missing_or_mismatched_says_which_to_install():
  kw = dict(required="libtpu==0.0.42.*", jax_version="0.10.2", library_path="")
  with pytest.raises(TopologyError, match=r"libtpu, which is not installed; expected "
                     r"libtpu==0\.0\.42\.\* \(the version jax 0\.10\.2 pins\): pip install "
                     r"'libtpu==0\.0\.42\.\*'"):
    topology.check_libtpu("v4-8", installed="", **kw)
  with pytest.raises(TopologyError, match=r"libtpu 0\.0\.40 does not match jax 0\.10\.2; "
                     r"expected libtpu==0\.0\.42\.\*: pip install 'libtpu==0\.0\.42\.\*'"):
    topology.check_libtpu("v4-8", installed="0.0.40", **kw)
  topology.check_libtpu("v4-8", installed="0.0.42.1", **kw)  # the pinned one passes
  assert not topology.version_matches("0.0.420", "libtpu==0.0.42.*")


def test_required_libtpu_is_the_pin_of_the_installed_jax():
  import importlib.metadata
  pins = [r for r in importlib.metadata.requires("jax") if r.startswith("libtpu")]
  assert pins and topology.required_libtpu() == pins[0].split(";")[0].replace(" ", "")
  from packaging.requirements import Requirement
  with open(os.path.join(ROOT, "requirements-tpu.txt")) as f:  # what CI installs is what jax pins
    pinned = [Requirement(line.split("#")[0].strip()) for line in f if line.startswith("libtpu")]
  # One pin a Python (environment markers): this Python's is the one jax pins.
  mine = [r for r in pinned if r.marker is None or r.marker.evaluate()]
  assert len(mine) == 1 and topology.version_matches(str(mine[0].specifier).lstrip("="),
                                                     topology.required_libtpu())


def test_planner_without_libtpu_fails_in_one_line(monkeypatch):
  monkeypatch.setattr(topology, "installed_libtpu", lambda: None)
  monkeypatch.delenv("TPU_LIBRARY_PATH", raising=False)
  with pytest.raises(TopologyError, match="not installed; expected libtpu"):
    topology.devices(topology.parse("v4-8"))


def test_cli_unknown_topology_is_one_error_line(tmp_path):
  out = tmp_path / "plan.json"
  r = subprocess.run([sys.executable, "-m", "bert_jax.plan", "--config", "configs/tiny.py",
                      "--topology", "v9-8", "--json", str(out)],
                     capture_output=True, text=True, timeout=300, cwd=ROOT)
  assert r.returncode == 2, r.stderr
  lines = r.stderr.strip().splitlines()
  assert lines[-1].startswith("error: --topology 'v9-8': unknown TPU slice; expected"), r.stderr
  assert not out.exists()


# ----------------------------------------------------------------------------
# libtpu installed on a CPU-only host: normal runs stay quiet and on the CPU


def test_cpu_only_host_with_libtpu_pins_jax_to_the_cpu_and_nothing_else():
  lib = {"TPU_LIBRARY_PATH": "/opt/libtpu.so"}  # libtpu installed (by path)
  env = dict(lib)
  assert bert_jax.cpu_only_without_accelerator(env, accelerator=False)
  assert env["JAX_PLATFORMS"] == "cpu"
  for env, accelerator in (({**lib, "JAX_PLATFORMS": "tpu"}, False),  # the user's choice
                           ({**lib, "JAX_PLATFORMS": ""}, False),
                           ({**lib, "JAX_FORCE_TPU_INIT": "1"}, False),
                           (dict(lib), True)):  # a TPU VM (or a GPU host)
    before = dict(env)
    assert not bert_jax.cpu_only_without_accelerator(env, accelerator=accelerator)
    assert env == before


def test_accelerator_device_files_are_found(tmp_path):
  (tmp_path / "dev").mkdir()
  pattern = (str(tmp_path / "dev" / "accel*"),)
  vendors = str(tmp_path / "pci" / "*" / "vendor")
  assert not bert_jax.has_accelerator(pattern, vendors)
  (tmp_path / "pci" / "0000:00:04.0").mkdir(parents=True)
  (tmp_path / "pci" / "0000:00:04.0" / "vendor").write_text("0x8086\n")
  assert not bert_jax.has_accelerator(pattern, vendors)
  (tmp_path / "dev" / "accel0").write_text("")  # a v4 TPU VM's chip
  assert bert_jax.has_accelerator(pattern, vendors)
  (tmp_path / "dev" / "accel0").unlink()
  (tmp_path / "pci" / "0000:00:04.0" / "vendor").write_text("0x1ae0\n")  # Google: a TPU chip
  assert bert_jax.has_accelerator(pattern, vendors)


@needs_libtpu
@pytest.mark.slow
@pytest.mark.skipif(bert_jax.has_accelerator(), reason="this host has a TPU or GPU")
def test_plain_train_run_with_libtpu_installed_is_quiet_and_on_cpu(tmp_path):
  env = {k: v for k, v in os.environ.items()
         if k not in ("JAX_PLATFORMS", "XLA_FLAGS") and not k.startswith("TPU_")}
  tiny_run = ["--config.data.corpus=" + os.path.join(ROOT, "data", "corpus.txt"),
              "--config.data.dupe_factor=1", "--config.data.vocab_size=512",
              "--config.model.hidden_size=32", "--config.model.num_layers=1",
              "--config.model.num_heads=2", "--config.model.intermediate_size=64",
              "--config.model.max_position_embeddings=32", "--config.train.seq_lens=(32,)",
              "--config.train.max_predictions=(5,)", "--config.train.batch_size=8",
              "--config.train.num_steps=1", "--config.eval_batches=1",
              "--config.progress_bar=False"]
  r = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--workdir",
                      str(tmp_path / "w"), *tiny_run], capture_output=True, text=True,
                     timeout=600, cwd=ROOT, env=env)
  out = r.stdout + r.stderr
  assert r.returncode == 0, out[-2000:]
  for noise in ("TPU_ACCELERATOR_TYPE", "TPU_WORKER_HOSTNAMES", "libtpu", "TPU"):
    assert noise not in out, out[-2000:]
  assert "1 cpu devices" in out, out[-2000:]


# ----------------------------------------------------------------------------
# The HLO reader


_HLO = """HloModule m, entry_computation_layout={()->f32[]}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%cond (p: (s32[], f32[8,4])) -> pred[] {
  %p = (s32[], f32[8,4]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (p.1: (s32[], f32[8,4])) -> (s32[], f32[8,4]) {
  %p.1 = (s32[], f32[8,4]{1,0}) parameter(0)
  %x = f32[8,4]{1,0:T(8,128)} get-tuple-element(%p.1), index=1
  %ag = f32[64,4]{1,0:T(8,128)} all-gather(%x), dimensions={0}, replica_groups={{0,1,2,3,4,5,6,7}}
  %i.1 = s32[] get-tuple-element(%p.1), index=0
  ROOT %t = (s32[], f32[8,4]{1,0}) tuple(%i.1, %x)
}

%all-reduce-scatter.1 (input.1: f32[64,4]) -> f32[8,4] {
  %input.1 = f32[64,4]{1,0} parameter(0)
  %ar = f32[64,4]{1,0} all-reduce(%input.1), to_apply=%add
  ROOT %ds = f32[8,4]{1,0} dynamic-slice(%ar), dynamic_slice_sizes={8,4}
}

ENTRY %main (g: f32[64,4], w: bf16[4,4], v: bf16[64,4]) -> f32[] {
  %g = f32[64,4]{1,0} parameter(0)
  %w = bf16[4,4]{1,0} parameter(1)
  %v = bf16[64,4]{1,0} parameter(2)
  %rs = f32[8,4]{1,0} fusion(%g), kind=kCustom, calls=%all-reduce-scatter.1
  %z = s32[] constant(0)
  %init = (s32[], f32[8,4]{1,0}) tuple(%z, %rs)
  %loop = (s32[], f32[8,4]{1,0}) while(%init), condition=%cond, body=%body
  %ars = ((f32[64,4]), f32[64,4]{1,0}) all-reduce-start(%g), to_apply=%add
  %ard = f32[64,4]{1,0} all-reduce-done(%ars)
  %d = f32[64,4]{1,0} dot(%v, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(f)/dot_general"}
  %cb = () custom-call(%d), custom_call_target="xla_ffi_python_cpu_callback"
  ROOT %r = f32[] constant(0)
}
"""


def test_hlo_collectives_count_an_all_reduce_offloaded_to_the_sparsecore():
  """TPU7x (libtpu 0.0.50): the gradients' all-reduce runs on the SparseCore, inside the
  computation an async call-start applies; before, the planner saw 498 KiB of
  BERT-Base's 440 MB."""
  text = "\n".join([
      "HloModule m", "",
      "%add (a: f32[], b: f32[]) -> f32[] {", "  %a = f32[] parameter(0)",
      "  %b = f32[] parameter(1)", "  ROOT %s = f32[] add(%a, %b)", "}", "",
      "%called_computation.11 (p0: f32[768,768]) -> f32[768,768] {",
      "  %p0 = f32[768,768]{1,0} parameter(0)",
      "  ROOT %all-reduce.236 = f32[768,768]{1,0} all-reduce(%p0), to_apply=%add",
      '}, execution_thread="sparsecore"', "",
      "ENTRY %main (g: f32[768,768]) -> f32[768,768] {",
      "  %g = f32[768,768]{1,0} parameter(0)",
      '  %cs = ((), ()) call-start(), async_execution_thread="sparsecore", '
      "to_apply=%called_computation.11",
      "  %cu = (f32[768,768]{1,0}) call-update(%cs, %g)",
      "  ROOT %cd = f32[768,768]{1,0} call-done(%cu)", "}"])
  got = {c.kind: (c.count, c.bytes) for c in hlo.collectives(text)}
  assert got == {"all-reduce": (1, 768 * 768 * 4)}


def test_hlo_collectives_count_loops_fusions_and_async_pairs():
  got = {c.kind: (c.count, c.bytes) for c in hlo.collectives(_HLO)}
  assert got == {"all-gather": (3, 3 * 64 * 4 * 4),  # in a loop of 3 iterations (i < 3)
                 "reduce-scatter": (1, 64 * 4 * 4),  # the kCustom fusion; its all-reduce not again
                 "all-reduce": (1, 64 * 4 * 4)}  # -start counted once, -done not


def test_hlo_dots_and_host_callbacks():
  assert hlo.dots(_HLO) == [("bf16", "bf16", "f32", "jit(f)/dot_general")]
  assert hlo.host_transfers(_HLO) == ["custom-call cb (xla_ffi_python_cpu_callback)"]
  assert hlo.custom_call_targets(_HLO) == {"xla_ffi_python_cpu_callback": 1}


def test_host_callback_of_a_real_compiled_step_is_found():
  def f(x):
    y = jax.pure_callback(lambda a: np.asarray(a) * 2, jax.ShapeDtypeStruct((4,), jnp.float32), x)
    return y + 1
  text = jax.jit(f).lower(jnp.ones(4)).compile().as_text()
  assert hlo.host_transfers(text)
  assert not hlo.host_transfers(jax.jit(lambda x: x + 1).lower(jnp.ones(4)).compile().as_text())


# ----------------------------------------------------------------------------
# The mixed dot's layout follows the platform compiled for


def _grads(platform):
  a = jax.random.normal(jax.random.key(0), (8, 6, 16))
  b = jax.random.normal(jax.random.key(1), (16, 12))

  def f(a, b):
    with precision.target_platform(platform):
      return precision.einsum("bld,df->fbl", a, b).sum() * 1.5  # needs transposes on CPU

  return jax.make_jaxpr(jax.grad(f, (0, 1)))(a, b), jax.grad(f, (0, 1))(a, b)


def test_mixed_dot_is_plain_for_tpu_and_gpu_and_laid_out_for_cpu():
  jaxpr_tpu, grads_tpu = _grads("tpu")
  jaxpr_cpu, grads_cpu = _grads("cpu")
  names = lambda j: {e.primitive.name for e in precision.iter_eqns(j)}
  assert "optimization_barrier" not in names(jaxpr_tpu)
  assert "optimization_barrier" in names(jaxpr_cpu)
  for j in (jaxpr_tpu, jaxpr_cpu):  # forward and both gradient dots: bf16 x bf16 -> f32
    assert precision.dot_dtypes(j) == [("bfloat16", "bfloat16", "float32")] * 3
  for t, c in zip(grads_tpu, grads_cpu):  # same maths, only the layout differs
    np.testing.assert_allclose(np.asarray(t), np.asarray(c), rtol=1e-5, atol=1e-5)


def test_train_steps_take_the_platform_of_their_mesh():
  from bert_jax import trainer
  s = tiny_settings()
  steps = trainer.make_steps(s, 512, SpecialIds(0, 1, 2, 3, 4))
  assert steps.platform == "cpu"


# ----------------------------------------------------------------------------
# The planner on this machine's devices (8 simulated CPUs)


@pytest.fixture
def fake_planner(monkeypatch):
  """A planner whose compiles are faked: memory grows with the batch, 100 MiB + 1 MiB per
  row per device, against a limit of 105 MiB (5 rows per device fit, 6 do not). Returns
  (planner, an empty plan, the failing step at 8 rows per device)."""
  s = tiny_settings(**{"train.batch_size": 64})
  p = plan_lib.Planner(s, jax.devices(), 512)

  def fake(kind, ph, batch_size=None):
    st = plan_lib.StepPlan(kind, ph.index, ph.seq_len, ph.max_predictions,
                           batch_size or s.train.batch_size, (batch_size or 64) // 8, 0, 0, 0,
                           compiled=True, memory_bytes=p.memory_bytes)
    st.total_bytes = (100 + (batch_size or 64) // 8) << 20
    return st

  monkeypatch.setattr(plan_lib.Planner, "compile_step", lambda self, *a, **k: fake(*a, **k))
  p.memory_bytes = (100 + 5) << 20
  plan = plan_lib.Plan("t", "cpu", 8, "cpu", p.memory_bytes, "RAM", {"data": 8}, {}, [])
  return p, plan, fake("train", s.train.phases[0])


def test_search_finds_the_batch_and_the_fixes_that_fit(fake_planner):
  """With a memory limit between the sizes, the search reports the largest batch that fits."""
  p, plan, failing = fake_planner
  assert not failing.fits
  fit_search.search_fixes(p, plan, [failing])
  assert plan.max_per_device_batch == 5
  fixes = {f.field: f for f in plan.fixes}
  assert fixes["--config.train.grad_accum_steps=2"].note == "micro-batches of 4 per device"
  assert set(fixes) >= {"--config.mesh.param_sharding=fsdp", "--config.model.remat=True"}


@pytest.mark.parametrize("rows, fixed_mib, mib_a_row, remat, remat_mib_a_row, grad_sum_mib, "
                         "tried, fitting", [
    # Remat off and not enough alone: the accumulation with full remat.
    (8, 100, 1, False, 0.7, 2, ["--config.model.remat=True",
                                "--config.train.grad_accum_steps=2",
                                "--config.model.remat=True --config.train.grad_accum_steps=2"],
     ["--config.model.remat=True --config.train.grad_accum_steps=2"]),
    # Remat alone fits: not combined again; the next smaller micro-batch instead.
    (8, 100, 1, False, 0.6, 2, ["--config.model.remat=True",
                                "--config.train.grad_accum_steps=2",
                                "--config.train.grad_accum_steps=4"],
     ["--config.model.remat=True", "--config.train.grad_accum_steps=4"]),
    # Remat already full: the next smaller micro-batch.
    (8, 100, 1, True, 0.7, 3, ["--config.train.grad_accum_steps=2",
                               "--config.train.grad_accum_steps=4"],
     ["--config.train.grad_accum_steps=4"]),
    # Remat with the accumulation fits with over half the memory free (46 of 105 MiB):
    # the next smaller micro-batch without remat's recompute is tried too, and fits.
    (64, 10, 10, False, 2, 20, ["--config.model.remat=True",
                                "--config.train.grad_accum_steps=8",
                                "--config.model.remat=True --config.train.grad_accum_steps=8",
                                "--config.train.grad_accum_steps=16"],
     ["--config.model.remat=True --config.train.grad_accum_steps=8",
      "--config.train.grad_accum_steps=16"])])
def test_an_accumulation_that_does_not_fit_is_tried_again(monkeypatch, rows, fixed_mib,
                                                          mib_a_row, remat, remat_mib_a_row,
                                                          grad_sum_mib, tried, fitting):
  """Accumulation keeps a float32 sum of the gradients beside them, so micro-batches of the
  largest batch that fits can still be too large (ModernBERT-Large at 1024 on v5e-8). Faked
  compiles: a fixed part + a part a row per device (less with remat) + the sum, against 105
  MiB."""
  s = tiny_settings(**{"train.batch_size": 8 * rows, "model.remat": remat})
  p = plan_lib.Planner(s, jax.devices(), 512, memory_bytes=105 << 20)

  def fake(self, kind, ph, batch_size=None):
    t = self.s.train
    rows = (batch_size or t.batch_size) // 8
    mib = fixed_mib + rows / t.grad_accum_steps * (
        remat_mib_a_row if self.s.model.remat else mib_a_row)
    st = plan_lib.StepPlan(kind, ph.index, ph.seq_len, ph.max_predictions,
                           batch_size or t.batch_size, rows, 0, 0, 0, compiled=True,
                           memory_bytes=self.memory_bytes)
    st.total_bytes = int((mib + (grad_sum_mib if t.grad_accum_steps > 1 else 0)) * 2**20)
    return st

  monkeypatch.setattr(plan_lib.Planner, "compile_step", fake)
  plan = plan_lib.Plan("t", "cpu", 8, "cpu", p.memory_bytes, "RAM", {"data": 8}, {}, [])
  fit_search.search_fixes(p, plan, [p.compile_step("train", s.train.phases[0])])
  fixes = {f.field: f.fits for f in plan.fixes if f.field != "--config.mesh.param_sharding=fsdp"}
  assert list(fixes) == tried
  assert [f for f, fits in fixes.items() if fits] == fitting
  # The micro-batch tried beside a remat fit says what it spares (the report prints notes).
  spares = [f.field for f in plan.fixes if "without remat's recomputed forward" in f.note]
  assert spares == (tried[-1:] if rows == 64 else [])  # the one case with a roomy remat fit


@pytest.mark.parametrize("seq_len, dropout, want", [
    (128, 0.1, {"model.attention_kernel": "splash", "model.attention_dropout_rate": 0.0}),
    (256, 0.0, {"model.attention_kernel": "splash"}),
    (96, 0.0, None)])  # not a multiple of splash's 128-wide tiles
def test_on_a_tpu_the_search_tries_splash_attention(fake_planner, seq_len, dropout, want):
  p, plan, failing = fake_planner
  p.s = dataclasses.replace(
      p.s, model=dataclasses.replace(p.s.model, attention_dropout_rate=dropout),
      train=dataclasses.replace(p.s.train, phases=tuple(
          dataclasses.replace(ph, seq_len=seq_len) for ph in p.s.train.phases)))
  fit_search.search_fixes(p, plan, [failing])
  assert not [f for f in plan.fixes if "splash" in f.field]  # these are CPU devices
  p.platform = "tpu"
  plan.fixes = []
  fit_search.search_fixes(p, plan, [failing])
  splash = [f for f in plan.fixes if "splash" in f.field]
  if want is None:
    assert not splash
    return
  (fix,) = splash
  assert fix.field == " ".join(f"--config.{k}={v}" for k, v in want.items())
  assert fix.note == ("splash has no attention dropout" if dropout else "")


def test_with_remat_keeping_matmul_outputs_full_remat_is_the_fix_tried(fake_planner):
  p, plan, failing = fake_planner
  p.s = dataclasses.replace(p.s, model=dataclasses.replace(
      p.s.model, remat=True, remat_policy="save_dots"))
  fit_search.search_fixes(p, plan, [failing])
  remat = [f.field for f in plan.fixes if "remat" in f.field]
  # Alone, then with the accumulation that did not fit alone (the fake ignores both).
  assert remat == ["--config.model.remat_policy=full",
                   "--config.model.remat_policy=full --config.train.grad_accum_steps=2"]


def test_a_search_out_of_compiles_keeps_the_batch_it_saw_fit(fake_planner):
  """Out of compiles, the search still reports a batch a compile fitted, as a lower bound,
  and gradient accumulation is tried with it (a TPU compile's out-of-HBM figure can
  overstate the need, so interpolation converges slowly)."""
  p, plan, step = fake_planner
  failing = [step]
  failing[0].total_bytes = 200 << 20  # what the failing compile said it needs: too much
  fit_search.search_fixes(p, plan, failing, max_compiles=1)
  assert (plan.max_per_device_batch, plan.max_batch_exact) == (4, False)
  fixes = {f.field: f for f in plan.fixes}
  assert fixes["--config.train.grad_accum_steps=2"].note == "micro-batches of 4 per device"
  plan.steps = failing
  plan.model = dict(layers=1, hidden_size=32, vocab_size=512, padded_vocab_size=512, params=1,
                    dtype="float32", remat=False, dropout_rng="hash", batch_size=64,
                    grad_accum_steps=1, param_sharding="replicated")
  assert ("largest per-device batch seen to fit (the search ran out of compiles; a larger one "
          "may fit): 4 (--config.train.batch_size=32)") in plan_report.format_plan(plan)

  plan = plan_lib.Plan("t", "cpu", 8, "cpu", p.memory_bytes, "RAM", {"data": 8}, {}, [])
  fit_search.search_fixes(p, plan, failing)
  assert (plan.max_per_device_batch, plan.max_batch_exact) == (5, True)


# ----------------------------------------------------------------------------
# Compiled for TPU slices of 8 devices (libtpu, no TPU)


@pytest.fixture(scope="module", params=[("v4-16", "replicated"), ("v4-16", "fsdp"),
                                        ("v5e-8", "replicated"), ("v5e-8", "fsdp")],
                ids=lambda p: "-".join(p))
def tpu_plan(request):
  if not HAVE_LIBTPU:
    pytest.skip("libtpu is not installed (pip install -r requirements-tpu.txt)")
  name, mode = request.param
  t = topology.parse(name)
  devices = topology.devices(t)
  s = tiny_settings(**{"mesh.param_sharding": mode})
  return name, mode, plan_lib.make_plan(s, devices, t.describe(), t.hbm_bytes_per_device,
                                        search=False)


@needs_libtpu
@pytest.mark.slow
def test_tiny_steps_compile_for_tpu_within_bounds(tpu_plan):
  name, mode, plan = tpu_plan
  assert plan.platform == "tpu" and plan.num_devices == 8 and plan.mesh["data"] == 8
  for st in plan.steps:
    assert st.compiled, st.error
    assert st.fits and st.xla_flops > 0
    # Arguments are the state and the batch; a tiny step's whole footprint, compiled program
    # included, stays far below a chip.
    assert st.argument_bytes >= st.params_bytes + st.opt_state_bytes + st.batch_bytes
    assert st.total_bytes < 256 << 20, st.total_bytes
    assert st.host_transfers == [], st.host_transfers


@needs_libtpu
@pytest.mark.slow
def test_tpu_collectives_are_those_of_the_param_sharding(tpu_plan):
  name, mode, plan = tpu_plan
  train = plan.steps[0]
  kinds = {c.kind: c for c in train.collectives}
  floats = {k: c.float_bytes for k, c in kinds.items()}
  # Gradients are reduced across devices in float32 (the embedding tables' too: they are
  # looked up in float32, so their gradients are not bf16 scatter-adds). Replicated, every
  # all-reduce is a gradient's; with FSDP XLA also all-reduces bf16 activations.
  for kind in ("all-reduce", "reduce-scatter") if mode == "replicated" else ("reduce-scatter",):
    if kind in kinds:
      assert set(kinds[kind].dtypes) <= {"f32", "s32", "u32", "pred"}, (kind, kinds[kind].dtypes)
  if mode == "replicated":  # the gradient all-reduce (XLA combines the tensors), no gathers
    assert set(kinds) <= {"all-reduce", "all-gather"} and not floats.get("all-gather"), kinds
    # the gradients cross the wire once: at least the parameters in bf16
    assert floats["all-reduce"] >= train.params_bytes // 2
  else:  # parameters gathered for use, gradients reduced back to their shards
    assert floats.get("all-gather"), kinds
    if name.startswith("v5e"):  # as reduce-scatters (XLA TPU's all-reduce-scatter fusions)
      assert floats.get("reduce-scatter"), kinds
    else:  # v4 megacore: XLA all-reduces these small gradients and keeps its slice
      assert floats.get("reduce-scatter") or floats.get("all-reduce"), kinds


@needs_libtpu
@pytest.mark.slow
def test_fsdp_shrinks_the_state_per_device_by_the_data_axis():
  s_rep, s_fsdp = tiny_settings(), tiny_settings(**{"mesh.param_sharding": "fsdp"})
  devices = topology.devices(topology.parse("v5e-8"))
  rep, fsdp = plan_lib.Planner(s_rep, devices, 512), plan_lib.Planner(s_fsdp, devices, 512)
  state = lambda p: (plan_lib.per_device_bytes(p.steps.abstract_params)
                     + plan_lib.per_device_bytes(p.steps.abstract_opt_state))
  # Every tensor with a hidden ('embed') axis is split 8 ways; the few others (vocab and
  # feed-forward biases) stay whole, so the shrink is close to, not exactly, 8.
  assert 6 * state(fsdp) < state(rep) <= 8 * state(fsdp)


@needs_libtpu
@pytest.mark.slow
def test_every_tpu_matmul_is_bf16_operands_f32_accumulation(tpu_plan):
  name, mode, plan = tpu_plan
  for st in plan.steps:
    assert st.dot_dtypes, "no matmul found in the compiled HLO"
    for key in st.dot_dtypes:
      lhs, _, rhs, _, out = key.split()
      assert (lhs, rhs) == ("bf16", "bf16"), (st.name, st.dot_dtypes)
    # XLA writes a gradient dot whose result the program rounds to bf16 (the gradient of a
    # bf16 activation) as a bf16-output convolution; the MXU still accumulates in f32.
    # Every other dot returns f32.
    assert all("transpose(" in where for where in st.narrow_output_dots), st.narrow_output_dots
    # The CPU layout workaround (transposes behind optimization barriers) is not in a TPU
    # program (remat is off here, so no barrier is expected at all).
    assert st.optimization_barriers == 0


@needs_libtpu
@pytest.mark.slow
def test_fit_search_on_a_real_out_of_hbm_compile(monkeypatch):
  """A batch the v5e compiler refuses (16 GiB of HBM): the planner says so, finds the largest
  per-device batch that fits and a change that makes the requested batch fit, each compiled."""
  t = topology.parse("v5e-8")
  devices = topology.devices(t)
  too_many = 32  # rows per device: 128 heads of 496 x 496 attention, past 16 GiB
  # 496, not a multiple of splash's 128-wide tiles: no splash fix to compile (30 s here; the
  # splash train step has its own compile tests below).
  s = tiny_settings(**{"train.batch_size": too_many * 8, "train.seq_lens": (496,),
                       "train.max_predictions": (20,), "model.max_position_embeddings": 512,
                       "model.hidden_size": 128, "model.num_heads": 128,
                       "model.dropout_rng": "rbg"})  # the hash's 32-bit counter is too small
  compiled = {}  # per-device batch -> fits, of every train step compiled as configured
  real = plan_lib.Planner.compile_step

  def recorded(self, kind, ph, batch_size=None):
    st = real(self, kind, ph, batch_size)
    if (not self.s.model.remat and self.s.train.grad_accum_steps == 1
        and self.s.mesh.param_sharding == "replicated"):
      compiled[st.per_device_batch] = st.fits
    return st

  monkeypatch.setattr(plan_lib.Planner, "compile_step", recorded)
  plan = plan_lib.make_plan(s, devices, t.describe(), t.hbm_bytes_per_device, include_eval=False,
                            max_search_compiles=6)
  train = plan.steps[0]
  assert not train.fits and not plan.fits
  assert "RESOURCE_EXHAUSTED" in train.error and train.total_bytes > t.hbm_bytes_per_device
  best = plan.max_per_device_batch
  assert best and best < too_many, compiled
  # Verified by compiles: the batch found fits, one more row per device does not.
  assert compiled[best] is True and compiled[best + 1] is False, compiled
  fixes = {f.field: f for f in plan.fixes}
  accum = [f for name, f in fixes.items() if "grad_accum_steps" in name]
  assert accum and accum[0].fits and 0 < accum[0].total_bytes <= t.hbm_bytes_per_device
  assert "--config.mesh.param_sharding=fsdp" in fixes  # tried, whatever it gives
  text = plan_report.format_plan(plan)
  assert "does NOT fit" in text and f"largest per-device batch that fits: {best}" in text
  assert f"{accum[0].field}: fits" in text


# ----------------------------------------------------------------------------
# Splash attention compiled for TPU slices (libtpu, no TPU)


def test_hlo_reader_keeps_a_computation_past_a_multi_line_attribute():
  """A Mosaic kernel's backend_config spans lines; one of them starts with "}}" at the
  left edge. The entry computation goes on after it (its all-reduce was lost)."""
  text = "\n".join([
      "ENTRY %main (p: f32[4]) -> f32[4] {",
      "  %p = f32[4]{0} parameter(0)",
      '  %k = f32[4]{0} custom-call(%p), custom_call_target="tpu_custom_call", '
      'backend_config={"custom_call_config": {"body": "abc',
      '}}, metadata={op_name="splash"}',
      "  ROOT %all-reduce = f32[4]{0} all-reduce(%k), replica_groups={{0,1}}, to_apply=%add",
      "}"])
  module = hlo.parse(text)
  assert [i.opcode for i in module.computations["main"]] == ["parameter", "custom-call",
                                                             "all-reduce"]
  assert [c.kind for c in hlo.collectives(module)] == ["all-reduce"]


# BERT-Base's attention (12 heads of 64) at its two lengths, and ModernBERT-Base's (12
# heads of 64, 64 tokens each side: local_attention 128) at 1024, on each slice: compiled
# at the shapes a real run gives it (a kernel compiles in 1-4 s here).
BASE_KERNEL_CASES = [(n, l, None) for n in ("v5e-8", "v5p-8", "v6e-8") for l in (128, 512)] + [
    (n, 1024, 64) for n in ("v5e-8", "v5p-8", "v6e-8")]


@needs_libtpu
@pytest.mark.parametrize("name, seq_len, window", BASE_KERNEL_CASES,
                         ids=[f"{n}-L{l}" + (f"-window{w}" if w else "")
                              for n, l, w in BASE_KERNEL_CASES])
def test_splash_at_base_shapes_compiles_forward_and_backward_for_each_slice(name, seq_len,
                                                                           window):
  """model/splash.attention and its gradients for a 32-row micro-batch a device (BERT-Base's
  batch 256 on 8 devices) with 12 heads of 64 in bf16, sharded over the slice as the train
  step shards it: Mosaic kernels (forward, dq, dkv), not the interpreter. Packed and
  padded rows are the same program (segment ids are data)."""
  from bert_jax.model import splash
  t = topology.parse(name)
  mesh = jax.sharding.Mesh(np.array(topology.devices(t)).reshape(-1, 1), ("data", "model"))
  P = jax.sharding.PartitionSpec  # noqa: N806
  rows = 32 * mesh.shape["data"]
  qkv = jax.ShapeDtypeStruct((rows, seq_len, 12, 64), jnp.bfloat16,
                             sharding=jax.sharding.NamedSharding(mesh, P("data")))
  seg = jax.ShapeDtypeStruct((rows, seq_len), jnp.int32,
                             sharding=jax.sharding.NamedSharding(mesh, P("data")))

  def loss(q, k, v, segments):
    out = splash.attention(q, k, v, segments, window=window)
    return jnp.sum(out.astype(jnp.float32) ** 2)

  def step(q, k, v, segments):
    with precision.target_platform("tpu"), splash.sharded_over(mesh):
      return jax.grad(loss, argnums=(0, 1, 2))(q, k, v, segments)

  text = jax.jit(step).lower(qkv, qkv, qkv, seg).compile().as_text()
  # The forward kernel and the backward's dq and dkv kernels; none if interpreted.
  assert hlo.custom_call_targets(text)["tpu_custom_call"] == 3, text[:2000]


def splash_step(s, name: str, vocab_size: int):
  """The train step of `s`'s one phase compiled for slice `name`, asserted to fit with
  the three Mosaic kernels (forward, dq, dkv) of each layer and its gradients reduced."""
  t = topology.parse(name)
  planner = plan_lib.Planner(s, topology.devices(t), vocab_size, t.hbm_bytes_per_device)
  st = planner.compile_step("train", s.train.phases[0])
  assert st.compiled and st.fits, st.error
  assert st.custom_calls.get("tpu_custom_call", 0) == 3 * s.model.num_layers, st.custom_calls
  assert "all-reduce" in {c.kind for c in st.collectives}  # the data-parallel gradients
  return st


def splash_overrides(seq_len: int, packed: bool) -> dict:
  over = {"model.attention_kernel": "splash", "model.attention_dropout_rate": 0.0,
          "train.seq_lens": (seq_len,), "train.phase_fractions": (1.0,),
          "train.max_predictions": (int(0.15 * seq_len),),
          "model.max_position_embeddings": seq_len}
  if packed:  # packing's document masks: MLM only, as data.packing requires
    over.update({"objective": "mlm", "data.packing": True})
  return over


# The tiny ModernBERT, packed, with a global and a sliding-window layer (the full and the
# LocalMask kernel). BERT's four cases are BERT-Base's below.
@needs_libtpu
@pytest.mark.slow
def test_the_tiny_modernbert_train_step_with_splash_compiles_for_tpu():
  """The whole train step of a tiny ModernBERT (a compile of seconds) on v5e-8, packed at
  512 tokens."""
  over = {**splash_overrides(512, packed=True), "model.family": "modernbert",
          "model.num_layers": 2, "model.global_attn_every_n_layers": 2,
          "model.local_attention": 128}
  splash_step(tiny_settings(**over), "v5e-8", 512)


# BERT-Base's four cases (128 and 512 tokens, padded and packed), each compiled for at
# least one slice and each slice compiling two: packed at 512 (where `auto` picks splash
# once attention dropout is off) on every slice, and one of the other three on each.
BASE_STEP_CASES = [(n, 512, True) for n in ("v5e-8", "v5p-8", "v6e-8")] + [
    ("v5e-8", 512, False), ("v5p-8", 128, True), ("v6e-8", 128, False)]


@needs_libtpu
@pytest.mark.slow
@pytest.mark.parametrize("name, seq_len, packed", BASE_STEP_CASES,
                         ids=[f"{n}-L{l}-{'packed' if p else 'padded'}"
                              for n, l, p in BASE_STEP_CASES])
def test_the_bert_base_train_step_with_splash_compiles_for_each_slice(name, seq_len, packed):
  """BERT-Base's whole train step: batch 256, hidden 768, 12 heads, vocabulary 30522, with
  one of its twelve layers. The layers are one program twelve times, and each adds 20-30 s
  of compile on 2 cores; a Base step of one layer compiles in about 40 s alone and in
  58-139 s in the tier beside other tests (128 and 512 tokens alike), so the whole matrix,
  12 steps, would add about 5 minutes more to CI than these 6. The twelve-layer step is
  compiled by tools/plan_kernels.py."""
  s = overridden(base.get_config(), {**splash_overrides(seq_len, packed=packed),
                                      "model.num_layers": 1})
  st = splash_step(s, name, 30522)
  assert (st.batch, st.per_device_batch) == (256, 256 // topology.parse(name).num_devices)
