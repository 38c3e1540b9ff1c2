"""Fine-tuning's writers under faults: a read-only --output_dir, a disk that fills up
before --save, two fine-tunings with the same outputs, a killed --save's temporary.

Each is one `error:` line (exit 2) with nothing half-written; the sweep's results are
kept when only the save fails.
"""

import json
import os
import socket
import subprocess
import sys

import pytest

from bert_jax.commands import finetune as finetune_cli
from bert_jax.storage import workdir_lock
from bert_jax.storage import outputs
from test_finetune import data  # noqa: F401  (the module's checkpoint and task fixture)
from test_full_disk import _dead_pid, _errors, _in_namespace
import soak_kill

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAST = ["--learning_rates", "3e-3", "--seeds", "0", "--epochs", "1", "--batch_size", "32",
        "--no_progress"]

# Runs the finetune command with every file write past 1 KiB failing (EFBIG, as on a
# disk that fills up) from the moment the save begins: the sweep's outputs are written.
SAVE_ON_FULL_DISK = """
import resource, signal, sys
sys.path.insert(0, {root!r})
from bert_jax.commands import finetune as cli
from bert_jax.eval import finetune
real = finetune.FineTuner.save
def save(*args, **kwargs):
  signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # fail the write instead of killing
  resource.setrlimit(resource.RLIMIT_FSIZE, (1024, resource.RLIM_INFINITY))
  return real(*args, **kwargs)
finetune.FineTuner.save = save
sys.exit(cli.main(sys.argv[1:]))
"""


def test_a_read_only_output_dir_is_one_line_before_any_work(data, tmp_path):  # noqa: F811
  _, ckpt, task_dir, _ = data
  ro = tmp_path / "ro"
  ro.mkdir()
  out = _in_namespace(tmp_path, "read-only", str(ro),
                      [sys.executable, "-m", "bert_jax.finetune", "--checkpoint", ckpt,
                       "--task", task_dir, "--output_dir", "@WORKDIR@/out", *FAST])
  errors = _errors(out["stderr"])
  assert out["rc"] == 2 and len(errors) == 1, out["stderr"][-3000:]
  assert "--output_dir" in errors[0] and "Read-only file system" in errors[0]
  assert "Traceback" not in out["stderr"] and out["after"] == out["before"] == {}


def test_a_save_on_a_full_disk_is_one_line_and_keeps_the_results(data, tmp_path):  # noqa: F811
  _, ckpt, task_dir, _ = data
  out_dir, save = tmp_path / "out", tmp_path / "model"
  proc = subprocess.run(
      [sys.executable, "-c", SAVE_ON_FULL_DISK.format(root=ROOT), "--checkpoint", ckpt,
       "--task", task_dir, "--output_dir", str(out_dir), "--save", str(save), *FAST],
      capture_output=True, text=True, timeout=600, cwd=str(tmp_path),
      env=soak_kill.subprocess_env())
  errors = _errors(proc.stderr)
  assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-3000:]
  assert "--save" in errors[0] and "File too large" in errors[0]
  assert "results.json" in errors[0] and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  with open(out_dir / "results.json", encoding="utf-8") as f:
    assert json.load(f)["runs"][0]["metrics"]["dev"]["accuracy"] > 0
  assert not save.exists() and sorted(os.listdir(tmp_path)) == ["out"]  # no temporary left


def test_a_second_fine_tuning_with_the_same_save_stops_with_one_line(
    data, tmp_path, capsys):  # noqa: F811
  _, ckpt, task_dir, _ = data
  save = tmp_path / "model"
  with workdir_lock.hold(str(tmp_path), lock_file=".model.lock"):  # the first one, running
    rc = finetune_cli.main(["--checkpoint", ckpt, "--task", task_dir, "--output_dir",
                            str(tmp_path / "out2"), "--save", str(save), *FAST])
  errors = _errors(capsys.readouterr().err)
  assert rc == 2 and len(errors) == 1
  assert f"--save {save} is in use by another fine-tuning (pid {os.getpid()}" in errors[0]
  assert not (tmp_path / "out2").exists()  # its output dir was not taken


def test_a_second_fine_tuning_with_the_same_output_dir_stops_with_one_line(
    data, tmp_path, capsys):  # noqa: F811
  _, ckpt, task_dir, _ = data
  out_dir = tmp_path / "out"
  with workdir_lock.hold(str(out_dir)):
    rc = finetune_cli.main(["--checkpoint", ckpt, "--task", task_dir, "--output_dir",
                            str(out_dir), *FAST])
  errors = _errors(capsys.readouterr().err)
  assert rc == 2 and len(errors) == 1 and "--output_dir" in errors[0]
  assert "in use by another fine-tuning" in errors[0]


def test_a_killed_writers_temporary_is_removed_by_the_next_output(tmp_path):
  stale = tmp_path / f".model.tmp-{socket.gethostname()}-{_dead_pid()}"
  (stale / "checkpoints").mkdir(parents=True)
  alive = tmp_path / f".model.tmp-{socket.gethostname()}-{os.getppid()}"  # a live writer's
  alive.mkdir()
  with outputs.atomic_output_dir(str(tmp_path / "model"), overwrite=False) as tmp:
    with open(os.path.join(tmp, "x"), "w", encoding="utf-8") as f:
      f.write("x")
  assert sorted(os.listdir(tmp_path)) == sorted([alive.name, "model"])
