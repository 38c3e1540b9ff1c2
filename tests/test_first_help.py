"""What a new user meets first: every command's --help through a pipe that closes
early (`| head`), exit codes of help, and the installed command's help outside the repo
naming configs it ships."""

import os
import shutil
import subprocess
import sys

import pytest

import soak_kill

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS = {
    "train.py": [sys.executable, os.path.join(ROOT, "train.py")],
    "plan": [sys.executable, "-m", "bert_jax.plan"],
    "finetune": [sys.executable, "-m", "bert_jax.finetune"],
    "probe": [sys.executable, "-m", "bert_jax.probe"],
    "features": [sys.executable, "-m", "bert_jax.features"],
    "convert": [sys.executable, "-m", "bert_jax.convert"],
    "merge": [sys.executable, "-m", "bert_jax.merge"],
}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_through_a_pipe_closed_after_one_line_is_quiet_and_exits_0(name):
  proc = subprocess.Popen([*COMMANDS[name], "--help"], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, env=soak_kill.subprocess_env())
  first = proc.stdout.readline()
  proc.stdout.close()  # as `| head -1` does
  stderr = proc.stderr.read().decode()
  rc = proc.wait(timeout=120)
  assert first.strip() and rc == 0, (rc, stderr[-2000:])
  assert "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr[-2000:]


def test_plan_help_exits_0_not_the_does_not_fit_status():
  proc = subprocess.run([*COMMANDS["plan"], "--help"], cwd=ROOT, capture_output=True,
                        text=True, env=soak_kill.subprocess_env(), timeout=120)
  assert proc.returncode == 0 and "--topology" in proc.stdout


def test_a_config_by_name_resolves_to_the_shipped_file(tmp_path, monkeypatch):
  from bert_jax.commands import config_args  # pylint: disable=import-outside-toplevel
  monkeypatch.chdir(tmp_path)
  (tmp_path / "mine.py").write_text("")
  (tmp_path / "large").write_text("")  # a file of that name here is that file
  assert config_args.config_path("base") == os.path.join(ROOT, "configs", "base.py")
  assert config_args.config_path("large") == "large"
  assert config_args.config_path(str(tmp_path / "mine.py")) == str(tmp_path / "mine.py")


@pytest.mark.parametrize("flags, want", [
    (["--config.train.seq_lens=(64,)", "--config.train.seq_lens=(32,)"], (32,)),
    (["--config.train.seq_lens", "(64,)", "--config.train.seq_lens", "(32,)"], (32,)),
    (["--config.train.seq_lens=(64,)", "--config.train.seq_lens=()"], ()),
    (["--config.train.seq_lens=(16,32)", "--config.train.num_steps=3"], (16, 32))])
def test_a_tuple_flag_given_twice_is_replaced_as_a_scalar_is(flags, want):
  """absl appended a repeated tuple flag: `(64,)` then `(32,)` trained `(64, 32)`."""
  from bert_jax.commands import config_args  # pylint: disable=import-outside-toplevel
  config = config_args.load_config(os.path.join(ROOT, "configs", "tiny.py"), flags)
  assert tuple(config.train.seq_lens) == want


@pytest.mark.slow
def test_the_installed_train_command_outside_the_repo_shows_and_takes_its_own_configs(
    tmp_path):
  site, src = tmp_path / "site", tmp_path / "src"  # built from a copy: no build/ in the repo
  for name in ("bert_jax", "configs"):
    shutil.copytree(os.path.join(ROOT, name), src / name,
                    ignore=shutil.ignore_patterns("__pycache__"))
  shutil.copy(os.path.join(ROOT, "pyproject.toml"), src)
  subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                  "--no-build-isolation", "--target", str(site), str(src)], check=True,
                 capture_output=True, timeout=300, cwd=str(tmp_path))
  env = {**soak_kill.subprocess_env(), "PYTHONPATH": str(site)}
  run = lambda *args: subprocess.run(
      [sys.executable, "-c", "import sys; from bert_jax.commands import launch; "
       "sys.argv[0] = 'bert-jax-train'; launch.train()", *args], cwd=str(tmp_path),
      capture_output=True, text=True, env=env, timeout=120)
  usage = run("--help")
  assert usage.returncode == 0, usage.stderr[-2000:]
  assert "--config tiny" in usage.stdout and "configs/tiny.py" not in usage.stdout
  tiny = run("--config", "tiny", "--help")  # the line a user copies from that help
  assert tiny.returncode == 0, tiny.stderr[-2000:]
  shipped = os.path.join(str(site), "bert_jax", "configs", "tiny.py")
  assert f"defaults from {shipped}" in tiny.stdout
  assert "--config.train.num_steps=1200" in tiny.stdout  # tiny's, not BERT-Base's 1,000,000
