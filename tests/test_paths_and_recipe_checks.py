"""Paths and recipe settings that look plausible but cannot work are one `error:` line
from the real command, before any work and with nothing written (issue 41)."""

import os
import subprocess
import sys

import pytest

import soak_kill

ROOT = soak_kill.ROOT


def _train(cwd, *flags) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *flags], cwd=cwd,
                        env=soak_kill.subprocess_env(), capture_output=True, text=True,
                        timeout=300)


def _one_error(proc) -> str:
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
  return lines[0]


@pytest.mark.parametrize("workdir, says", [
    ("GS://bkt/x", "did you mean gs://bkt/x?"),
    ("gs:/bkt/x", "did you mean gs://bkt/x?"),
    ("s3://x", "the s3:// scheme is not supported"),
    ("gs://", "names no bucket"),
    ("gs:///x", "did you mean gs://x?"),
    # Trained, then ended rc 2: its log composed /x/metrics.jsonl, its checkpoints x/...
    ("gs://bkt//x", "empty path segment ('//'); expected 'gs://bkt/x'"),
])
def test_a_workdir_url_that_is_not_a_bucket_is_one_line_and_no_local_folder(
    tmp_path, workdir, says):
  line = _one_error(_train(tmp_path, "--workdir", workdir, "--config.train.num_steps=2"))
  assert line.startswith(f"error: --workdir {workdir!r}") and says in line, line
  assert os.listdir(tmp_path) == []  # no ./GS:/bkt/x, ./s3:/x: nothing written


def test_cudnn_attention_on_a_cpu_is_refused_before_the_workdir_is_made(tmp_path):
  """Refused once traced, it left prepared/, checkpoints/ and goodput/ in a new workdir."""
  line = _one_error(_train(tmp_path, "--workdir", "run", "--config.train.num_steps=2",
                           "--config.model.attention_kernel=cudnn",
                           "--config.model.dtype=bfloat16",
                           "--config.model.attention_dropout_rate=0.0"))
  assert "attention_kernel='cudnn' needs an NVIDIA GPU" in line, line
  assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("field", ["data.corpus", "data.cache_dir", "init_from",
                                   "data.vocab_file"])
def test_a_config_path_that_is_a_foreign_url_is_one_line_naming_the_field(tmp_path, field):
  line = _one_error(_train(tmp_path, "--workdir", "run", f"--config.{field}=S3://b/x"))
  assert line.startswith(f"error: --config.{field} 'S3://b/x'"), line
  assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("argv, flag", [
    (["-m", "bert_jax.features", "--checkpoint", "GS://b/run", "--input", "in.txt",
      "--output", "out.npz"], "--checkpoint"),
    (["-m", "bert_jax.probe", "--checkpoint", "run", "--task", "word_order", "--output",
      "gs:/b/out.json"], "--output"),
    (["-m", "bert_jax.convert", "to-hf", "run", "s3://b/hf"], "OUT_HF_DIR"),
    (["-m", "bert_jax.finetune", "--checkpoint", "run", "--task", "word_order",
      "--output_dir", "Gs://b/ft"], "--output_dir"),
])
def test_every_commands_path_arguments_are_checked(tmp_path, argv, flag):
  proc = subprocess.run([sys.executable, *argv], cwd=tmp_path, capture_output=True, text=True,
                        env={**soak_kill.subprocess_env(), "PYTHONPATH": ROOT}, timeout=300)
  line = _one_error(proc)
  assert line.startswith(f"error: {flag} "), line
  assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("shape", ["linear", "cosine", "sqrt"])
def test_a_wsd_decay_of_zero_steps_is_refused_before_data_preparation(tmp_path, shape):
  """num_steps 10, decay_fraction 0.01: 0 decay steps (cosine crashed after preparing the
  data; linear and sqrt never decayed)."""
  args = soak_kill.tiny_args(str(tmp_path / "run"), str(tmp_path / "prepared"), 10, **{
      "train.schedule": "wsd", "train.decay_fraction": 0.01, "train.decay_shape": shape})
  line = _one_error(_train(tmp_path, *args))
  assert "--config.train.decay_fraction" in line and "0 decay steps" in line, line
  assert not os.path.exists(tmp_path / "prepared") and not os.path.exists(tmp_path / "run")
