"""The entry points' huge-page allocator setting (bert_jax.parallel.host_malloc)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from bert_jax.parallel import host_malloc

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPU_HOST = dict(glibc=(2, 36), thp=True, accelerator=False)


def test_adds_the_tunable_and_keeps_the_users_own():
  env = host_malloc.tuned_environ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "A": "1"},
                                  **CPU_HOST)
  assert env == {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1", "A": "1"}
  assert host_malloc.tuned_environ({}, **CPU_HOST) == {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}


@pytest.mark.parametrize("environ, host", [
    ({"BERT_JAX_MALLOC": "system"}, CPU_HOST),
    ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, CPU_HOST),  # the user chose
    ({"LD_PRELOAD": "/usr/lib/libtcmalloc.so.4"}, CPU_HOST),
    ({}, {**CPU_HOST, "accelerator": True}),
    ({}, {**CPU_HOST, "thp": False}),
    ({}, {**CPU_HOST, "glibc": (2, 31)}),  # no hugetlb tunable before 2.35
    ({}, {**CPU_HOST, "glibc": ()}),  # musl and other C libraries
], ids=["opted-out", "user-set", "tcmalloc", "accelerator", "thp-never", "old-glibc", "not-glibc"])
def test_leaves_the_environment_alone_where_it_does_not_apply(environ, host):
  assert host_malloc.tuned_environ(environ, **host) is None


def test_thp_mode_is_read_from_sysfs(tmp_path):
  for text, on in (("always [madvise] never\n", True), ("[always] madvise never\n", True),
                   ("always madvise [never]\n", False)):
    (tmp_path / "enabled").write_text(text)
    assert host_malloc.thp_available(str(tmp_path / "enabled")) is on
  assert host_malloc.thp_available(str(tmp_path / "missing")) is False


_SCRIPT = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, {repo!r})
    from bert_jax.parallel import host_malloc
    host_malloc.reexec_with_huge_pages()
    print(json.dumps([os.environ.get("GLIBC_TUNABLES", ""), sys.argv[1:]]))
    """)


def _run(tmp_path, **env) -> list[str]:
  script = tmp_path / "entry.py"
  script.write_text(_SCRIPT.format(repo=REPO))
  environ = {k: v for k, v in os.environ.items()
             if k not in ("GLIBC_TUNABLES", "BERT_JAX_MALLOC", "LD_PRELOAD")}
  proc = subprocess.run([sys.executable, str(script), "--flag", "a b"], env={**environ, **env},
                        capture_output=True, text=True, check=True)
  return proc.stdout.splitlines()


def test_an_entry_point_runs_once_more_with_the_tunable_and_its_arguments(tmp_path):
  if host_malloc.tuned_here({}) is None:
    pytest.skip("this host gets no tunable (no glibc >= 2.35, THP off, or an accelerator)")
  lines = _run(tmp_path)
  assert len(lines) == 1, lines  # exec replaced the first run: it printed nothing
  assert json.loads(lines[0]) == [host_malloc.TUNABLE, ["--flag", "a b"]]


def test_opting_out_runs_the_command_as_it_is(tmp_path):
  [line] = _run(tmp_path, BERT_JAX_MALLOC="system")
  assert json.loads(line) == ["", ["--flag", "a b"]]


_PROBE = textwrap.dedent("""
    import runpy, sys
    sys.path.insert(0, {repo!r})
    from bert_jax.parallel import host_malloc

    def stop():  # stands in for the exec: reports what was loaded by then
      print("jax loaded" if "jax" in sys.modules else "jax not loaded")
      raise SystemExit(0)

    host_malloc.reexec_with_huge_pages = stop
    {call}
    """)


@pytest.mark.parametrize("call", [
    *[f"from bert_jax.commands import launch; launch.{c}()"
      for c in ("train", "features", "convert", "finetune", "probe", "plan")],
    *[f"runpy.run_module('bert_jax.{c}', run_name='__main__')"
      for c in ("features", "convert", "finetune", "probe", "plan")],
    "sys.argv = ['train.py']; runpy.run_path({train!r}, run_name='__main__')",
    "sys.argv = ['bert_jax', 'plan']; runpy.run_module('bert_jax', run_name='__main__')",
])
def test_every_command_reaches_the_exec_before_it_loads_jax(call, tmp_path):
  # Otherwise the command starts JAX twice: once before the exec, once after.
  code = _PROBE.format(repo=REPO, call=call.format(train=os.path.join(REPO, "train.py")))
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        cwd=tmp_path, timeout=120)
  assert proc.stdout.strip() == "jax not loaded", proc.stdout + proc.stderr


def test_the_installed_commands_are_the_light_entry_points():
  import tomllib
  with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
    scripts = tomllib.load(f)["project"]["scripts"]
  from bert_jax.commands import launch
  assert scripts.pop("bert-jax") == "bert_jax.commands.launch:main"  # bert-jax <command>
  assert sorted(scripts) == sorted(f"bert-jax-{c}" for c in launch.commands())
  for name, target in scripts.items():
    assert target == f"bert_jax.commands.launch:{name.removeprefix('bert-jax-')}", target
