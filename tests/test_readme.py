"""Every fenced command and Python snippet of README.md and of every guide in docs/ runs as written.

Blocks fenced as ```bash / ```shell / ```sh are shell commands (continuation lines
joined, `a && b` run as two commands); ```console blocks contribute their `$ ` lines;
```python blocks are scripts. Other fences (```text, plain ```) are output or layout
and are not run. The blocks run in one scratch directory that looks like a fresh clone
(its code, configs and data linked in), after the Quick start's `python train.py`, in a
reader's order: README.md first, then the guides in GUIDES order, each file top to
bottom. So a guide finds `runs/tiny` where a reader would have it, and what an earlier
block made (a guide may use it; the order is fixed, and every guide must be listed).

Shrinking, never by editing the docs' text: every `train.py` command gets SHRINK
appended (later `--config.*` overrides win), which keeps the Quick start's model (2
layers, hidden 128) but trains 8 steps on 40 documents. Commands that cannot run here
are listed in SKIP by exact prefix, each with its reason; a command that no entry
matches is run, so a new one is tested by default, and an entry that matches no
command of any file is an error (the list only shrinks). Skipped commands are reported
as warnings, and a whole block of them as a skipped test.

Links and paths: every relative link of these files points at a file (and heading)
that exists, and every `bert_jax/...` path and `python -m bert_jax...` module they name
exists, so a moved module cannot leave a guide pointing at its old place.
"""

import contextlib
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import warnings

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = "README.md"
# The guides, in the order their blocks run (after the README's). A guide may use what
# an earlier file's blocks made; each one only needs the Quick start's runs/tiny today.
GUIDES = ("docs/training.md", "docs/corpora.md", "docs/multi-host-and-tpu.md", "docs/continued-pretraining.md",
          "docs/feature-extraction.md", "docs/conversion.md", "docs/bad-input-and-recovery.md",
          "docs/performance.md", "docs/deviations.md", "docs/downstream.md",
          "docs/modernbert.md", "docs/ARCHITECTURE.md")
FILES = (README,) + GUIDES

# What a fresh clone holds that the commands of the README and the guides use.
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
    "python -m pytest": "the test suite (whole, or its fast tier), of which this file is a part",
    "python -m tools.bench ": ("the benchmark: about 35 minutes for every case; even --quick "
                               "starts a worker process per case and implementation"),
    "gcloud compute tpus tpu-vm ssh ": "a TPU pod launch over ssh",
    "for i in 0 1; do": "a two-process launch; tests/test_distributed.py runs it with its "
                        "TINY flags",
    "python -m bert_jax.convert from-tf ": "needs TensorFlow and a downloaded "
                                           "google-research/bert checkpoint",
    "python -m bert_jax.finetune --checkpoint runs/base --task glue_data/": (
        "GLUE's files come from the user (nothing downloads); tests/test_finetune.py runs "
        "fine-tuning on tasks it writes in GLUE's layouts"),
    "python -m bert_jax.convert to-hf runs/mrpc-model ": "exports the model of the "
                                                           "skipped GLUE command above",
    "python train.py --config configs/modernbert_tiny.py --workdir runs/modernbert-continued ": (
        "continues the shrunk run above (2 layers here, 3 in configs/modernbert_tiny.py, and a "
        "continued run takes the config's shape as a contradiction); "
        "tests/test_modernbert_runs.py continues a ModernBERT export through init_from"),
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


def _read(name: str) -> str:
  with open(os.path.join(ROOT, name), encoding="utf-8") as f:
    return f.read()


def _blocks() -> list[tuple[str, int, str, object]]:
  """(file, line, 'shell' or 'python', commands or source) of every block that runs."""
  out = []
  for name in FILES:
    text = _read(name)
    for m in _FENCE.finditer(text):
      indent, lang, body = len(m.group(1)), m.group(2), m.group(3)
      body = "\n".join(l[indent:] for l in body.splitlines())
      line = text.count("\n", 0, m.start()) + 1
      if lang in _SHELL or lang == "console":
        out.append((name, line, "shell", _commands(lang, body)))
      elif lang == "python":
        out.append((name, line, "python", body))
  return out


BLOCKS = _blocks()


def _skip_reason(command: str):
  return next((why for prefix, why in SKIP.items() if command.startswith(prefix)), None)


# A staged config's per-stage fields, cleared with the shrink to one phase.
STAGED_SHRINK = ("--config.train.phase_batch_sizes=()", "--config.train.phase_tokens=()",
                 "--config.train.phase_steps=()", "--config.train.phase_rope_thetas=()",
                 "--config.train.phase_mask_probs=()", "--config.train.phase_lr=()",
                 "--config.train.schedule=linear")


def _staged(command: str) -> bool:
  """Whether the command's --config file trains in stages of its own."""
  m = re.search(r"--config\s+(\S+\.py)", command)
  if not m:
    return False
  import importlib.util  # pylint: disable=import-outside-toplevel
  spec = importlib.util.spec_from_file_location("_cfg", os.path.join(ROOT, m.group(1)))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  t = module.get_config().train
  return bool(t.phase_tokens or t.phase_steps or t.phase_batch_sizes)


def _shrunk(command: str) -> str:
  if not re.search(r"\btrain\.py\b", command):
    return command
  shrink = SHRINK
  if "--config.init_from=" in command:  # the source decides the model's shape
    shrink = tuple(f for f in SHRINK if not f.startswith("--config.model."))
  if "--config.train.num_steps=0" in command:  # an evaluation of the source: no steps to shrink
    shrink = tuple(f for f in shrink if not f.startswith("--config.train.num_steps="))
  if _staged(command):  # one shrunk phase: the stages' own fields go too
    shrink += STAGED_SHRINK
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
  assert proc.returncode == 0, (f"{what} exited {proc.returncode}:\n"
                                f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
  return proc


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
  """A fresh-clone-like directory in which the Quick start has run (shrunk)."""
  root = str(tmp_path_factory.mktemp("clone"))
  for name in CLONE:
    os.symlink(os.path.join(ROOT, name), os.path.join(root, name))
  proc = _run(_shrunk(QUICK_START), root, f"README Quick start `{QUICK_START}`", shell=True)
  assert "final eval @ step 8" in proc.stdout + proc.stderr
  assert os.path.isdir(os.path.join(root, "runs", "tiny", "checkpoints", "8"))
  yield root
  shutil.rmtree(root, ignore_errors=True)


def test_the_docs_have_blocks_to_run_and_the_quick_start_comes_first():
  kinds = [kind for _, _, kind, _ in BLOCKS]
  assert kinds.count("shell") >= 8 and kinds.count("python") >= 3
  assert BLOCKS[0][0] == README and QUICK_START in BLOCKS[0][3]
  # Every guide that shows a command is run: the files with blocks, in FILES order.
  with_blocks = list(dict.fromkeys(name for name, *_ in BLOCKS))
  assert with_blocks == [f for f in FILES if f in with_blocks]
  assert {"docs/training.md", "docs/feature-extraction.md", "docs/conversion.md",
          "docs/continued-pretraining.md"} <= set(with_blocks)


def test_every_guide_in_docs_is_in_the_run_order():
  found = {os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md"))}
  assert found == set(GUIDES), (f"add to GUIDES (in reading order): {sorted(found - set(GUIDES))}; "
                                f"remove from GUIDES: {sorted(set(GUIDES) - found)}")


def test_every_skip_entry_matches_a_command_of_some_file():
  commands = [c for _, _, kind, cs in BLOCKS if kind == "shell" for c in cs]
  unused = [p for p in SKIP if not any(c.startswith(p) for c in commands)]
  assert not unused, f"SKIP entries that no README or guide command matches (remove them): {unused}"


def _slug(heading: str) -> str:
  """The anchor GitHub gives a heading."""
  heading = re.sub(r"[`*_]|\[([^]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading)
  return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(name: str) -> set[str]:
  text = re.sub(r"^```.*?^```", "", _read(name), flags=re.M | re.S)
  return {_slug(m[1]) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


@pytest.mark.parametrize("name", FILES)
def test_every_link_and_package_path_exists(name):
  text = _read(name)
  bad = []
  for target in re.findall(r"\]\(([^)\s]+)\)", text):
    if re.match(r"[a-z]+:", target):
      continue  # a web address
    path, _, anchor = target.partition("#")
    linked = os.path.normpath(os.path.join(os.path.dirname(name), path)) if path else name
    if not os.path.exists(os.path.join(ROOT, linked)):
      bad.append(f"link {target}: no {linked}")
    elif anchor and linked.endswith(".md") and anchor not in _anchors(linked):
      bad.append(f"link {target}: no heading #{anchor} in {linked}")
  for path in set(re.findall(r"\bbert_jax/[\w/]+\.py\b", text)):
    if not os.path.isfile(os.path.join(ROOT, path)):
      bad.append(f"path {path} does not exist")
  for module in set(re.findall(r"python -m (bert_jax(?:\.\w+)*)", text)):
    base = os.path.join(ROOT, *module.split("."))
    if not (os.path.isfile(base + ".py") or os.path.isfile(os.path.join(base, "__main__.py"))):
      bad.append(f"`python -m {module}`: no such module")
  assert not bad, bad


# The blocks each worker's clone has run (a pytest-xdist worker has a clone of its own).
_ran: dict[str, set[int]] = {}


@pytest.mark.slow
@pytest.mark.parametrize("name,line,kind,content", BLOCKS,
                         ids=[f"{b[0]}:{b[1]}" for b in BLOCKS])
def test_block_runs_as_written(clone, name, line, kind, content):
  # A block may use what any earlier block made. Under `-n 2 --dist worksteal` a block
  # can be taken by the other worker, whose clone has not run the blocks before it:
  # they run there first, in order (so a block never fails for want of its reader's
  # earlier steps, and each block is still its own test).
  index = BLOCKS.index((name, line, kind, content))
  done = _ran.setdefault(clone, set())
  for earlier in range(index):
    if earlier not in done:
      with contextlib.suppress(pytest.skip.Exception):  # a block of skipped commands
        _run_block(clone, *BLOCKS[earlier])
      done.add(earlier)
  _run_block(clone, name, line, kind, content)
  done.add(index)


def _run_block(clone: str, name: str, line: int, kind: str, content) -> None:
  where = f"{name} line {line}"
  if kind == "python":
    stem = re.sub(r"\W", "_", name)
    script = os.path.join(clone, f"snippet_{stem}_{line}.py")
    with open(script, "w", encoding="utf-8") as f:
      f.write(content)
    _run([sys.executable, script], clone, f"Python snippet at {where}")
    return
  ran, skipped = 0, []
  for command in content:
    if command == QUICK_START:
      ran += 1  # run once, shrunk, by the `clone` fixture
      continue
    why = _skip_reason(command)
    if why is not None:
      skipped.append(f"{command.splitlines()[0]!r}: {why}")
      warnings.warn(f"{where}: not run: {skipped[-1]}")
      continue
    proc = _run(_shrunk(command), clone, f"command at {where} `{command}`", shell=True)
    assert "error:" not in proc.stderr, proc.stderr[-3000:]
    ran += 1
  if not ran:
    pytest.skip(f"{where}: every command is on the reviewed SKIP list: " + "; ".join(skipped))
