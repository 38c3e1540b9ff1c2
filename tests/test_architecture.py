"""The package's import rules and size limit (docs: README, "Layout").

Each import rule imports the modules in a fresh interpreter and looks at
`sys.modules`, so what a module drags in transitively counts, not only its own
import lines. One subprocess per rule keeps the file to a few seconds a rule.
"""

import ast
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(REPO, "bert_jax")
MAX_MODULE_LINES = 450
# One streaming pass from documents to records (docs/ARCHITECTURE.md says why it is longer).
OVER_LIMIT_FOR_NOW = {"dataset.py"}


def _loaded_after_importing(*modules: str) -> set[str]:
  """sys.modules of a fresh interpreter after importing `modules`."""
  code = ("import importlib, json, sys\n"
          f"for m in {list(modules)!r}:\n"
          "  importlib.import_module(m)\n"
          "print(json.dumps(sorted(sys.modules)))")
  out = subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True,
                       capture_output=True, text=True).stdout
  return set(json.loads(out.strip().splitlines()[-1]))


def _found(loaded: set[str], forbidden: tuple[str, ...]) -> list[str]:
  """The forbidden modules (or their submodules) that were loaded."""
  return sorted(m for m in loaded for f in forbidden if m == f or m.startswith(f + "."))


def _package_files() -> list[str]:
  return sorted(f for f in os.listdir(PACKAGE) if f.endswith(".py"))


def test_model_imports_neither_optimizer_nor_mesh_code():
  loaded = _loaded_after_importing("bert_jax.model")
  assert not _found(loaded, ("optax", "bert_jax.sharding", "bert_jax.optim"))


def test_data_side_imports_no_jax():
  loaded = _loaded_after_importing(
      "bert_jax.tokenizer", "bert_jax.corpus", "bert_jax.corpus_files",
      "bert_jax.pretraining_data", "bert_jax.input_pipeline", "bert_jax.dataset",
      "bert_jax.example_store", "bert_jax.prepared_check", "bert_jax.corpus_files")
  assert not _found(loaded, ("jax", "flax", "optax"))


def test_startup_guards_import_no_jax():
  # Plain sockets and files, run before jax.distributed.initialize: no JAX backend there.
  loaded = _loaded_after_importing("bert_jax.startup_roster", "bert_jax.workdir_lock")
  assert not _found(loaded, ("jax", "flax", "optax"))


def test_features_imports_neither_optimizer_nor_trainer():
  loaded = _loaded_after_importing("bert_jax.features", "bert_jax.features_cli")
  assert not _found(loaded, ("optax", "bert_jax.optim", "bert_jax.steps", "bert_jax.trainer"))


def test_optimizer_does_not_import_the_model():
  loaded = _loaded_after_importing("bert_jax.optim")
  assert not _found(loaded, ("bert_jax.model",))


def test_package_never_imports_configs_or_tools():
  # The top-level configs/ and tools/ folders are not installed with the package.
  bad = []
  for name in _package_files():
    path = os.path.join(PACKAGE, name)
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        targets = [node.module]
      else:
        continue
      bad += [f"{name}:{node.lineno} imports {t}" for t in targets
              if t.split(".")[0] in ("configs", "tools")]
  assert not bad, bad


def test_every_module_is_short():
  lines = {}
  for name in _package_files():
    with open(os.path.join(PACKAGE, name), encoding="utf-8") as f:
      lines[name] = sum(1 for _ in f)
  over = {n: k for n, k in lines.items() if k > MAX_MODULE_LINES and n not in OVER_LIMIT_FOR_NOW}
  assert not over, f"modules over {MAX_MODULE_LINES} lines: {over}"
