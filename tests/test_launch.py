"""Issue 55: `python -m bert_jax <command>` runs every command by its name; a new command
is one module of bert_jax/commands (found, not listed)."""

import os
import subprocess
import sys

from bert_jax.commands import launch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*args):
  return subprocess.run([sys.executable, "-m", "bert_jax", *args], capture_output=True,
                        text=True, cwd=REPO, timeout=120)


def test_the_commands_are_the_modules_of_the_commands_folder_but_its_helpers(tmp_path):
  assert launch.commands() == ["convert", "features", "finetune", "merge", "plan", "probe",
                               "train"]
  for name in ("common.py", "launch.py", "config_args.py", "_private.py", "newcmd.py"):
    (tmp_path / name).write_text("def cli():\n  pass\n")
  assert launch.commands([str(tmp_path)]) == ["newcmd"]  # a new command: one module


def test_no_command_lists_them_and_an_unknown_one_is_one_error_line():
  listed = _run()
  assert listed.returncode == 2 and "commands: convert, features" in listed.stderr
  unknown = _run("pretrain")
  assert unknown.returncode == 2
  assert unknown.stderr.strip().splitlines() == [
      "error: unknown command 'pretrain'; expected one of convert, features, finetune, merge, "
      "plan, probe, train"]


def test_a_command_runs_with_its_arguments_and_names_itself_so():
  out = _run("merge", "--help")
  assert out.returncode == 0 and out.stdout.startswith("usage: python -m bert_jax merge "), out
  assert _run("-h").stdout.startswith("usage: python -m bert_jax <command>")
