"""`.ci/run` leaves nothing behind in the temporary directory, pass or fail.

CI machines keep their temporary directory between runs; the environments
(about 4 GB) left by every run once filled a CI machine's disk. The
script runs here against stub python3/pip/pytest, so no real install happens.
"""

from __future__ import annotations

import os
import pathlib
import stat
import subprocess
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent

# `python3 -m venv DIR` makes DIR/bin/{activate,python,pip}; the venv's python
# runs `-m pytest` as exit $FAKE_PYTEST_RC and logs every call, tagged with its
# environment (`python[venv312] ...`); its pip fails when its arguments contain
# $FAKE_PIP_FAILS. The same stub stands for Python 3.12 (BERT_JAX_CI_PYTHON312).
_FAKE_PYTHON3 = r'''#!/usr/bin/env bash
set -e
[ "$1 $2" = "-m venv" ] || exit 90
d="$3"; echo "venv $(basename "$d") beside: $(ls "$(dirname "$d")" | tr '\n' ' ')" >> "$CALL_LOG"
mkdir -p "$d/bin"
head -c 100000 /dev/zero > "$d/weight"
cat > "$d/bin/activate" <<EOS
deactivate() { PATH="\$_OLD_PATH"; }
_OLD_PATH="\$PATH"; PATH="$d/bin:\$PATH"
EOS
v="$(basename "$d")"
printf '#!/usr/bin/env bash\necho "python[%s] $*" >> "$CALL_LOG"\n[ "$1 $2" = "-m pytest" ] && exit "${FAKE_PYTEST_RC:-0}"\nexit 0\n' "$v" > "$d/bin/python"
printf '#!/usr/bin/env bash\necho "pip[%s] $*" >> "$CALL_LOG"\ncase "$*" in *"$FAKE_PIP_FAILS"*) exit 1;; esac\n' "$v" > "$d/bin/pip"
chmod +x "$d/bin/python" "$d/bin/pip"
'''


def _run_ci(tmp_path: pathlib.Path, pytest_rc: int, pip_fails: str = "no such argument") -> subprocess.CompletedProcess:
  """Runs .ci/run with TMPDIR=tmp_path/tmp, which the caller may have filled."""
  stubs = tmp_path / "stubs"
  stubs.mkdir()
  fake = stubs / "python3"
  fake.write_text(_FAKE_PYTHON3)
  fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
  scratch = tmp_path / "tmp"
  scratch.mkdir(exist_ok=True)
  log = tmp_path / "calls.log"
  env = dict(os.environ, PATH=f"{stubs}:{os.environ['PATH']}", TMPDIR=str(scratch),
             CALL_LOG=str(log), FAKE_PYTEST_RC=str(pytest_rc), FAKE_PIP_FAILS=pip_fails,
             BERT_JAX_CI_PYTHON312=str(fake))
  proc = subprocess.run(["bash", str(REPO / ".ci" / "run")], env=env, capture_output=True,
                        text=True, timeout=60)
  return proc


@pytest.mark.parametrize("pytest_rc", [0, 1])
def test_ci_run_removes_its_environments(tmp_path, pytest_rc):
  scratch = tmp_path / "tmp"
  proc = _run_ci(tmp_path, pytest_rc)
  calls = (tmp_path / "calls.log").read_text()
  assert "python[venv] -m pytest" in calls, proc.stderr  # it really ran the suite
  assert (proc.returncode == 0) == (pytest_rc == 0), proc.stderr  # a failure still fails CI
  assert list(scratch.iterdir()) == []  # and neither environment is left behind


def test_ci_run_runs_the_main_suite_on_311_then_the_312_tier_with_libtpu(tmp_path):
  """The main suite runs without libtpu, as users run it; the 3.12 environment (libtpu,
  transformers 5) is installed beside it and runs the conversion, parity, resume and TPU
  tier after it."""
  proc = _run_ci(tmp_path, 0)
  assert proc.returncode == 0, proc.stderr
  calls = [l for l in (tmp_path / "calls.log").read_text().splitlines()
           if l.startswith(("pip", "python[venv] -m pytest", "python[venv312] -m pytest"))]
  main = [c for c in calls if c.startswith(("pip[venv]", "python[venv]"))]
  tier = [c for c in calls if c.startswith(("pip[venv312]", "python[venv312]"))]
  assert main == ["pip[venv] install -q -r requirements.txt -r requirements-peers.txt",
                  "python[venv] -m pytest -n 2 --dist worksteal"]
  assert tier == ["pip[venv312] install -q -r requirements-tpu.txt -r requirements-peers.txt",
                  "python[venv312] -m pytest -n 2 --dist worksteal tests/test_hf_versions.py "
                  "tests/test_convert.py tests/test_modernbert.py tests/test_parity.py "
                  "tests/test_train.py::test_interrupted_run_resumes_to_identical_parameters "
                  "tests/test_tpu_plan.py "
                  "-k not (v5p-8-L128-packed or v5e-8-L512-padded or v6e-8-L512-packed or v5e-8-L512-packed)"]
  assert calls[-1] == tier[-1] and calls.index(main[-1]) < calls.index(tier[-1])


def test_ci_run_stops_failed_when_the_main_install_fails(tmp_path):
  proc = _run_ci(tmp_path, 0, pip_fails="requirements.txt -r requirements-peers.txt")
  assert proc.returncode != 0
  assert "-m pytest" not in (tmp_path / "calls.log").read_text()


def test_ci_run_stops_failed_when_the_312_install_fails(tmp_path):
  proc = _run_ci(tmp_path, 0, pip_fails="requirements-tpu.txt")
  assert proc.returncode != 0 and "installing the Python 3.12 environment failed" in proc.stderr
  assert "python[venv312] -m pytest" not in (tmp_path / "calls.log").read_text()
  assert list((tmp_path / "tmp").iterdir()) == []


def test_ci_run_removes_what_a_killed_run_left(tmp_path):
  scratch = tmp_path / "tmp"
  stale, recent, other = (scratch / n for n in ("bert-jax-ci.old111", "bert-jax-ci.new222",
                                                 "tmp.someone"))
  for d in (stale, recent, other):
    (d / "venv").mkdir(parents=True)
  four_hours_ago = time.time() - 4 * 3600
  os.utime(stale, (four_hours_ago, four_hours_ago))
  os.utime(other, (four_hours_ago, four_hours_ago))
  proc = _run_ci(tmp_path, 0)
  assert proc.returncode == 0, proc.stderr
  assert not stale.exists()  # a killed run's leftover (over 3 h old) goes
  assert recent.exists() and other.exists()  # a run that may be live, and others' files, stay
