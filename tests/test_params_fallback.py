"""Params-only readers (restore_params, features, convert to-hf) skip a damaged newest
step with one warning, refuse a damaged given step with one error line, and read
only complete checkpoints while a run writes."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from bert_jax.commands import features as features_cli
from bert_jax.io import checkpointing, convert
from bert_jax.commands import convert as convert_cli
from bert_jax.errors import CheckpointError
from tests.test_convert import hf_state, write_hf_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOOD, NEWEST = 3, 5


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  """checkpoints/3 and checkpoints/5 of the same imported model (params + meta)."""
  tmp = tmp_path_factory.mktemp("fallback")
  hf_dir = write_hf_dir(tmp / "hf", hf_state())
  wd = str(tmp / "run")
  assert convert_cli.main(["from-hf", hf_dir, wd]) == 0
  params, meta = checkpointing.restore_params(wd)
  shutil.rmtree(os.path.join(wd, "checkpoints", "0"))
  for step in (GOOD, NEWEST):
    checkpointing.save_params(wd, step, params, {**meta, "step": step})
  return wd


def _no_params(step_dir):
  shutil.rmtree(os.path.join(step_dir, "params"))


def _bad_meta(step_dir):
  with open(os.path.join(step_dir, "meta", "metadata"), "w") as f:
    f.write('{"step": 5, "vo')


def _meta_gone(step_dir):
  os.remove(os.path.join(step_dir, "meta", "metadata"))


def _truncated_params(step_dir):
  for d, _, files in os.walk(os.path.join(step_dir, "params")):
    for name in files:
      if name not in ("_METADATA", "commit_success.txt"):
        path = os.path.join(d, name)
        with open(path, "r+b") as f:
          f.truncate(os.path.getsize(path) // 2)


DAMAGE = {"no-params": _no_params, "meta-not-json": _bad_meta, "meta-file-gone": _meta_gone,
          "params-truncated": _truncated_params}


@pytest.fixture(params=sorted(DAMAGE))
def damaged(request, workdir, tmp_path):
  wd = str(tmp_path / "run")
  shutil.copytree(workdir, wd)
  DAMAGE[request.param](os.path.join(wd, "checkpoints", str(NEWEST)))
  return wd


def _tree_digest(path):
  out = {}
  for d, dirs, files in os.walk(path):
    for name in files:
      with open(os.path.join(d, name), "rb") as f:
        out[os.path.relpath(os.path.join(d, name), path)] = f.read()
    for name in dirs:
      out[os.path.relpath(os.path.join(d, name), path)] = "dir"
  return out


def test_newest_damaged_step_is_skipped_with_one_warning(damaged, capsys):
  before = _tree_digest(damaged)
  params, meta = checkpointing.restore_params(damaged)
  assert meta["step"] == GOOD
  err = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
  assert len(err) == 1 and err[0].startswith("warning:"), err
  assert f"checkpoints/{NEWEST} (" in err[0] and f"using step {GOOD}" in err[0]
  assert _tree_digest(damaged) == before  # nothing moved, nothing deleted


def test_a_given_damaged_step_is_one_error_line(damaged, capsys):
  with pytest.raises(CheckpointError) as e:
    checkpointing.restore_params(damaged, step=NEWEST)
  msg = str(e.value)
  assert "\n" not in msg and f"checkpoints/{NEWEST}" in msg and "expected" in msg
  assert capsys.readouterr().err == ""
  step_dir = os.path.join(damaged, "checkpoints", str(NEWEST))
  if os.path.isdir(os.path.join(step_dir, "params")):  # a step folder as the path, too
    with pytest.raises(CheckpointError, match=f"checkpoints/{NEWEST}"):
      checkpointing.restore_params(step_dir)
  assert checkpointing.restore_params(damaged, step=GOOD)[1]["step"] == GOOD


def test_every_step_damaged_lists_them_all(workdir, tmp_path, capsys):
  wd = str(tmp_path / "run")
  shutil.copytree(workdir, wd)
  _no_params(os.path.join(wd, "checkpoints", str(NEWEST)))
  _bad_meta(os.path.join(wd, "checkpoints", str(GOOD)))
  with pytest.raises(CheckpointError) as e:
    checkpointing.restore_params(wd)
  msg = str(e.value)
  assert "\n" not in msg and f"checkpoints/{NEWEST} (" in msg and f"checkpoints/{GOOD} (" in msg


def test_a_checkpoint_being_written_is_not_read_nor_touched(workdir, tmp_path):
  """Orbax writes step s into `<s>.orbax-checkpoint-tmp-*` and renames it when done:
  a reader meanwhile reads the newest complete step and leaves the folder alone."""
  wd = str(tmp_path / "run")
  shutil.copytree(workdir, wd)
  ckpts = os.path.join(wd, "checkpoints")
  partial = os.path.join(ckpts, "9.orbax-checkpoint-tmp-1234567")
  shutil.copytree(os.path.join(ckpts, str(NEWEST)), partial)
  _truncated_params(partial)
  before = _tree_digest(partial)
  assert checkpointing.restore_params(wd)[1]["step"] == NEWEST
  assert _tree_digest(partial) == before


def test_features_and_export_cli_fall_back_or_stop_in_one_line(workdir, tmp_path):
  wd = str(tmp_path / "run")
  shutil.copytree(workdir, wd)
  _bad_meta(os.path.join(wd, "checkpoints", str(NEWEST)))
  inp = tmp_path / "in.txt"
  inp.write_text("the cat sat\n", encoding="utf-8")
  env = {**os.environ, "JAX_PLATFORMS": "cpu",
         "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}

  def cli(*argv):
    return subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)

  out = str(tmp_path / "f.npy")
  proc = cli("bert_jax.features", "--checkpoint", wd, "--input", str(inp), "--output", out)
  assert proc.returncode == 0, proc.stderr
  assert "Traceback" not in proc.stderr
  warnings = [l for l in proc.stderr.splitlines() if l.startswith("warning:")]
  assert len(warnings) == 1 and f"checkpoints/{NEWEST} (JSONDecodeError" in warnings[0]
  assert np.load(out).shape[0] == 1

  proc = cli("bert_jax.convert", "to-hf", wd, str(tmp_path / "hf_out"), "--step", str(NEWEST))
  assert proc.returncode == 2 and "Traceback" not in proc.stderr
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and lines[0].startswith("error:") and f"checkpoints/{NEWEST}" in lines[0]
  assert not os.path.exists(tmp_path / "hf_out")


def test_in_process_clis_agree(workdir, tmp_path, capsys):
  wd = str(tmp_path / "run")
  shutil.copytree(workdir, wd)
  _no_params(os.path.join(wd, "checkpoints", str(NEWEST)))
  assert convert_cli.main(["to-hf", wd, str(tmp_path / "hf_out")]) == 0
  cap = capsys.readouterr()
  assert f"(step {GOOD})" in cap.out
  assert [l for l in cap.err.splitlines() if l.startswith("warning:")][0].count(
      f"checkpoints/{NEWEST}") == 1
  inp = tmp_path / "in.txt"
  inp.write_text("the cat\n", encoding="utf-8")
  assert features_cli.main(["--checkpoint", wd, "--input", str(inp), "--output",
                        str(tmp_path / "f.npy"), "--step", str(NEWEST)]) == 2
  err = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
  assert len(err) == 1 and err[0].startswith("error:") and "missing item" in err[0]


def test_a_step_rotated_away_by_a_writing_run_is_not_reported(workdir, tmp_path, capsys,
                                                              monkeypatch):
  """The run's max_to_keep deletes the step being read after it wrote a newer one:
  the reader lists the steps again and reads the newest, without a warning."""
  wd = str(tmp_path / "run")
  shutil.copytree(workdir, wd)
  ckpts = os.path.join(wd, "checkpoints")
  real = checkpointing._restore_params_step
  calls = []

  def rotated_while_reading(mngr, root, step, sharding):
    calls.append(step)
    if step == NEWEST and not os.path.exists(os.path.join(ckpts, "8")):
      shutil.copytree(os.path.join(ckpts, str(NEWEST)), os.path.join(ckpts, "8"))
      shutil.rmtree(os.path.join(ckpts, str(NEWEST)))
      raise FileNotFoundError(os.path.join(ckpts, str(NEWEST), "params"))
    return real(mngr, root, step, sharding)

  monkeypatch.setattr(checkpointing, "_restore_params_step", rotated_while_reading)
  params, meta = checkpointing.restore_params(wd)
  assert calls == [NEWEST, 8] and meta["step"] == NEWEST  # 8 is a copy of step 5's files
  assert capsys.readouterr().err == ""
  assert os.path.isdir(os.path.join(ckpts, "8"))
