"""Every fenced command and Python snippet of README.md runs as written.

Blocks fenced as ```bash / ```shell / ```sh are shell commands (continuation lines
joined, `a && b` run as two commands); ```console blocks contribute their `$ ` lines;
```python blocks are scripts. Other fences (```text, plain ```) are output or layout
and are not run. Each block runs in README order in one scratch directory that looks
like a fresh clone (its code, configs and data linked in), after the Quick start's
`python train.py`, so snippets find `runs/tiny` where a reader would have it.

Shrinking, never by editing the README text: every `train.py` command gets SHRINK
appended (later `--config.*` overrides win), which keeps the Quick start's model (2
layers, hidden 128) but trains 8 steps on 40 documents. Commands that cannot run here
are listed in SKIP by exact prefix, each with its reason; a README command that no
entry matches is run, so a new one is tested by default. Skipped commands are
reported as warnings, and a whole block of them as a skipped test.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
import warnings

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")

# What a fresh clone holds that the README's commands use.
CLONE = ("train.py", "bert_jax", "configs", "data", "tools", "requirements.txt",
         "requirements-peers.txt", "pyproject.toml")

# The Quick start command; the module fixture runs it (shrunk) once for every block.
QUICK_START = "python train.py"

# Appended to every `train.py` command: 8 steps of the tiny model on little data.
SHRINK = ("--config.train.num_steps=8", "--config.train.warmup_steps=2",
          "--config.train.batch_size=16", "--config.train.phase_fractions=(1.0,)",
          "--config.train.seq_lens=(64,)", "--config.train.max_predictions=(10,)",
          "--config.model.num_layers=2", "--config.model.hidden_size=128",
          "--config.model.num_heads=2", "--config.model.intermediate_size=512",
          "--config.model.max_position_embeddings=128", "--config.model.dtype=float32",
          "--config.data.max_documents=40", "--config.data.dupe_factor=1",
          "--config.log_every=4", "--config.eval_every=8", "--config.checkpoint_every=8",
          "--config.eval_batches=2", "--config.progress_bar=False")

# Reviewed list: exact command prefix -> why it is not run here.
SKIP = {
    "pip install ": "installs packages; the tests run in an environment that has them",
    "python -m pytest": "the whole test suite, of which this file is a part",
    "python -m tools.bench ": ("the benchmark: about 35 minutes for every case; even --quick "
                               "starts a worker process per case and implementation"),
    "gcloud compute tpus tpu-vm ssh ": "a TPU pod launch over ssh",
    "for i in 0 1; do": "a two-process launch; tests/test_distributed.py runs it with its "
                        "TINY flags",
    "python -m bert_jax.io.convert from-tf ": "needs TensorFlow and a downloaded "
                                           "google-research/bert checkpoint",
}

_FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```\s*$", re.M | re.S)
_SHELL = ("bash", "shell", "sh")


def _commands(lang: str, body: str) -> list[str]:
  """The commands of one shell or console block, in order."""
  lines = body.splitlines()
  if lang == "console":
    lines = [l[2:] for l in lines if l.startswith("$ ")]
  text = re.sub(r"\\\n\s*", "", "\n".join(lines))  # continuation lines
  out, loop = [], []
  for line in text.splitlines():
    line = re.sub(r"\s+#\s[^'\"]*$", "", line).strip()  # a trailing comment
    if not line:
      continue
    if loop or line.startswith("for "):  # a loop up to its `done` is one command
      loop.append(line)
      if line.startswith("done"):
        out.append("\n".join(loop))
        loop = []
      continue
    out.extend(part.strip() for part in _split_and(line))
  return out


def _split_and(line: str) -> list[str]:
  """`a && b` as [a, b], leaving a quoted ` && ` alone."""
  parts, start, quote = [], 0, None
  for i, c in enumerate(line):
    if quote:
      quote = None if c == quote else quote
    elif c in "'\"":
      quote = c
    elif line.startswith(" && ", i):
      parts.append(line[start:i])
      start = i + 4
  return parts + [line[start:]]


def _blocks() -> list[tuple[int, str, object]]:
  """(line, 'shell' or 'python', commands or source) of every block that runs."""
  with open(README, encoding="utf-8") as f:
    text = f.read()
  out = []
  for m in _FENCE.finditer(text):
    indent, lang, body = len(m.group(1)), m.group(2), m.group(3)
    body = "\n".join(l[indent:] for l in body.splitlines())
    line = text.count("\n", 0, m.start()) + 1
    if lang in _SHELL or lang == "console":
      out.append((line, "shell", _commands(lang, body)))
    elif lang == "python":
      out.append((line, "python", body))
  return out


BLOCKS = _blocks()


def _skip_reason(command: str):
  return next((why for prefix, why in SKIP.items() if command.startswith(prefix)), None)


def _shrunk(command: str) -> str:
  if not re.search(r"\btrain\.py\b", command):
    return command
  shrink = SHRINK
  if "--config.init_from=" in command:  # the source decides the model's shape
    shrink = tuple(f for f in SHRINK if not f.startswith("--config.model."))
  appended = []
  for flag in shrink:
    name = flag.split("=", 1)[0]
    # A flag the command sets already is replaced in place: a tuple flag given twice
    # is not overridden by its second value.
    command, n = re.subn(rf"(?<!\S){re.escape(name)}=\S+", lambda _: shlex.quote(flag), command)
    if not n:
      appended.append(flag)
  return f"{command} {shlex.join(appended)}"


def _env(clone: str) -> dict:
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="", TF_CPP_MIN_LOG_LEVEL="3",
             PYTHONPATH=clone)
  env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
  return env


def _run(argv, clone: str, what: str, shell: bool = False) -> subprocess.CompletedProcess:
  proc = subprocess.run(argv, cwd=clone, env=_env(clone), shell=shell, executable=(
      "/bin/bash" if shell else None), capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, (f"README {what} exited {proc.returncode}:\n"
                                f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
  return proc


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
  """A fresh-clone-like directory in which the Quick start has run (shrunk)."""
  root = str(tmp_path_factory.mktemp("clone"))
  for name in CLONE:
    os.symlink(os.path.join(ROOT, name), os.path.join(root, name))
  proc = _run(_shrunk(QUICK_START), root, f"Quick start `{QUICK_START}`", shell=True)
  assert "final eval @ step 8" in proc.stdout + proc.stderr
  assert os.path.isdir(os.path.join(root, "runs", "tiny", "checkpoints", "8"))
  yield root
  shutil.rmtree(root, ignore_errors=True)


def test_the_readme_has_blocks_to_run_and_the_quick_start_comes_first():
  kinds = [kind for _, kind, _ in BLOCKS]
  assert kinds.count("shell") >= 5 and kinds.count("python") >= 3
  assert QUICK_START in BLOCKS[0][2]


def test_every_skip_entry_matches_a_readme_command():
  commands = [c for _, kind, cs in BLOCKS if kind == "shell" for c in cs]
  unused = [p for p in SKIP if not any(c.startswith(p) for c in commands)]
  assert not unused, f"SKIP entries that no README command matches (remove them): {unused}"


@pytest.mark.parametrize("line,kind,content", BLOCKS, ids=[f"line{b[0]}" for b in BLOCKS])
def test_readme_block_runs_as_written(clone, line, kind, content):
  if kind == "python":
    script = os.path.join(clone, f"readme_line{line}.py")
    with open(script, "w", encoding="utf-8") as f:
      f.write(content)
    _run([sys.executable, script], clone, f"Python snippet at line {line}")
    return
  ran, skipped = 0, []
  for command in content:
    if command == QUICK_START:
      ran += 1  # run once, shrunk, by the `clone` fixture
      continue
    why = _skip_reason(command)
    if why is not None:
      skipped.append(f"{command.splitlines()[0]!r}: {why}")
      warnings.warn(f"README line {line}: not run: {skipped[-1]}")
      continue
    proc = _run(_shrunk(command), clone, f"command at line {line} `{command}`", shell=True)
    assert "error:" not in proc.stderr, proc.stderr[-3000:]
    ran += 1
  if not ran:
    pytest.skip(f"README line {line}: every command is on the reviewed SKIP list: "
                + "; ".join(skipped))
