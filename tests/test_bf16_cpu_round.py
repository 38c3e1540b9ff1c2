"""tools/bf16_cpu_round.sh, issue 22's measurements for a CPU with native bf16 dots, run
here against a stub python (tests/test_gpu_lease.py's): such a CPU is drawn only some
sessions, and a bad argument found there costs one of its long steps.

`bash tools/bf16_cpu_round.sh --quick` runs it for real anywhere (5 minutes).
"""

from __future__ import annotations

import pathlib

import pytest

from tests.test_gpu_lease import run_with_stub
from tools import ab_step, bench, bench_matmul, cases, profile_step

SCRIPT = "tools/bf16_cpu_round.sh"


def _cpuinfo(tmp_path: pathlib.Path, flags: str) -> str:
  path = tmp_path / "cpuinfo"
  path.write_text(f"model name\t: Test CPU\nflags\t\t: fpu sse2 avx2 {flags}\n")
  return str(path)


def test_a_cpu_without_native_bf16_dots_is_refused_with_one_error_line(tmp_path):
  calls, out, err = run_with_stub(SCRIPT, tmp_path, returncode=2,
                                  CPUINFO=_cpuinfo(tmp_path, "avx512f"))
  assert calls == [] and not out.exists()
  assert err.count("error:") == 1 and "amx_bf16" in err


@pytest.mark.parametrize("flag", ["amx_bf16", "avx512_bf16"])
def test_every_step_runs_in_order_with_arguments_its_tool_accepts(tmp_path, monkeypatch, flag):
  calls, out, _ = run_with_stub(SCRIPT, tmp_path, CPUINFO=_cpuinfo(tmp_path, flag))
  assert [c[0] if c[0] != "-m" else c[1] for c in calls] == [
      "tools/bench_matmul.py", "tools.bench", "tools/profile_step.py", "tools/profile_step.py",
      "tools/ab_step.py", "tools/ab_step.py", "tools/ab_step.py", "tools.bench"]
  assert flag in (out / "env.txt").read_text()
  monkeypatch.setattr(bench_matmul, "cpu_description", _stop)
  with pytest.raises(_Reached):
    bench_matmul.main(calls[0][1:])
  # Both bench runs pass every check of their command line and reach the run: the first
  # rewrites the README table, the second is the allocator PyTorch runs best with.
  reached = []

  def run_benchmark(cases_, impls, *args, **kwargs):
    reached.append(kwargs["malloc"])
    raise _Reached
  monkeypatch.setattr(bench, "run_benchmark", run_benchmark)
  for call in (calls[1], calls[7]):
    with pytest.raises(_Reached):
      bench.main(call[2:])
  assert reached == ["huge-pages", "retain"]
  assert "--readme" in calls[1] and "--readme" not in calls[7]
  for call in calls[2:4]:
    args = profile_step.parse_args(call[1:])
    assert args.dtype == "bfloat16" and cases.find(args.case).name == args.case
  for call in calls[4:7]:
    args = ab_step.parse_args(call[1:])
    assert args.dtype == "bfloat16" and len(args.variants) == 4
    parsed = [ab_step.parse_variant(v) for v in args.variants]
    # A B B' A': the twins differ from their variant only in a setting that leaves the
    # program as it is.
    assert parsed[0].items() <= parsed[3].items() and parsed[1].items() <= parsed[2].items()


def test_steps_past_the_budget_are_skipped_with_a_note(tmp_path):
  calls, out, _ = run_with_stub(SCRIPT, tmp_path, CPUINFO=_cpuinfo(tmp_path, "amx_bf16"),
                                ROUND_S="0")
  assert calls == []
  assert (out / "bench.log").read_text().startswith("skipped: no time left")


class _Reached(Exception):
  pass


def _stop(*args, **kwargs):
  raise _Reached
