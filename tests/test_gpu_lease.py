"""tools/gpu_lease.sh, the GPU measurements for a short device lease, run here against
a stub python: a lease is too short and too rare to find a bad argument there.

The stub logs every call, so the tests check what the script would run (each command
line is accepted by the tool it calls) and that steps past the time budget are skipped
with a note, not run. `bash tools/gpu_lease.sh --quick` runs it for real (minutes).
"""

from __future__ import annotations

import os
import pathlib
import shlex
import stat
import subprocess

import pytest

from tools import ab_step, bench, cases, compare_families

REPO = pathlib.Path(__file__).resolve().parent.parent

# Logs its arguments, one call a line; sleeps $STUB_SLEEP seconds on `-m pytest`.
_STUB = r'''#!/usr/bin/env bash
printf '%q ' "$@" >> "$CALL_LOG"; echo >> "$CALL_LOG"
[ "$1 $2" = "-m pytest" ] && sleep "${STUB_SLEEP:-0}"
exit 0
'''


def run_with_stub(script: str, tmp_path: pathlib.Path, *args: str, returncode: int = 0,
                  **env: str) -> tuple[list[list[str]], pathlib.Path, str]:
  """Runs `bash script args` with the stub as $PYTHON: (its step calls, $OUT, stderr)."""
  stub = tmp_path / "python"
  stub.write_text(_STUB)
  stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
  out, log = tmp_path / "out", tmp_path / "calls.log"
  proc = subprocess.run(
      ["bash", script, *args], cwd=REPO, capture_output=True, text=True,
      timeout=60, env=dict(os.environ, PYTHON=str(stub), OUT=str(out), CALL_LOG=str(log),
                           SKIP_WHEELS="1", **env))
  assert proc.returncode == returncode, proc.stderr
  calls = [shlex.split(line) for line in log.read_text().splitlines()] if log.exists() else []
  # The steps, not the version report (`-c ...`, `-m pip list`) of env.txt.
  steps = [c for c in calls if c[0] != "-c" and c[:3] != ["-m", "pip", "list"]]
  return steps, out, proc.stderr


def _lease(tmp_path: pathlib.Path, *args: str, **env: str) -> tuple[list[list[str]], pathlib.Path]:
  calls, out, _ = run_with_stub("tools/gpu_lease.sh", tmp_path, *args, **env)
  return calls, out


@pytest.mark.parametrize("mode", [(), ("--quick",)])
def test_every_step_runs_in_priority_order_with_arguments_its_tool_accepts(
    tmp_path, monkeypatch, mode):
  calls, out = _lease(tmp_path, *mode)
  smoke, calls = calls[0], calls[1:]
  assert smoke[0] == "train.py" and "--config.train.num_steps=3" in smoke
  assert [c[:2] for c in calls] == [["-m", "pytest"], ["tools/ab_step.py", "--case"],
                                    ["tools/compare_families.py", "--seconds"],
                                    ["-m", "tools.bench"], ["tools/ab_step.py", "--case"]]
  pytest_args = calls[0]
  selected = pytest_args[pytest_args.index("-k") + 1]
  assert "tests/test_cudnn.py" in pytest_args and selected == ("on_a_gpu" if not mode else "cudnn")
  families = compare_families.parse_args(calls[2][1:])
  assert families.out == str(out / "families_gpu.txt") and families.seconds > 0
  # The bench command passes every check of its command line and reaches the run.
  reached = []

  def run_benchmark(cases_, impls, *args, **kwargs):
    reached.append(([c.name for c in cases_], impls))
    raise SystemExit(0)  # the real run is minutes
  monkeypatch.setattr(bench, "run_benchmark", run_benchmark)
  with pytest.raises(SystemExit):
    bench.main(calls[3][2:])
  assert reached and reached[0][0][0] == "train_base_128" and reached[0][1][0] == "ours"
  kernel = "cudnn" if not mode else "jax"
  for ab, n in ((calls[1][1:], 3), (calls[4][1:], 2)):
    case = ab[ab.index("--case") + 1]
    assert cases.find(case).kind == "train"
    variants = [ab_step.parse_variant(a) for a in ab if "=" in a and not a.startswith("-")]
    assert len(variants) == n and variants[1]["model.attention_kernel"] == kernel
  packed = [ab_step.parse_variant(a) for a in calls[1][1:] if "=" in a and not a.startswith("-")]
  assert [v.get("data.packing", False) for v in packed] == [True, True, False]
  assert (out / "env.txt").exists()


def test_steps_past_the_budget_are_skipped_with_a_note(tmp_path):
  # The version report and the smoke run (stub calls) take well under 5 s, even loaded.
  calls, out = _lease(tmp_path, LEASE_S="5", STUB_SLEEP="6")
  assert [c[:2] for c in calls[1:]] == [["-m", "pytest"]]  # the first step used the budget
  for name in ("ab_packed.txt", "families.log", "bench.log", "ab_cudnn.txt"):
    assert (out / name).read_text().startswith("skipped: no time left")
