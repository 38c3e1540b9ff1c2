"""The package's rules, by folder (docs/ARCHITECTURE.md says why each holds).

Modules are found by walking bert_jax/, never listed by hand, so a module
added to a folder is held to that folder's rules. Each import rule imports the
modules in a fresh interpreter and looks at `sys.modules`, so what a module
drags in transitively counts, not only its own import lines.
"""

import ast
import glob
import json
import os
import re
import subprocess
import sys

import pytest

import architecture_doc

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(REPO, "bert_jax")
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60
# A function longer than MAX_FUNCTION_LINES says why on its `def` line or the line
# above it, in a comment starting with this.
LONG_REASON = "# long:"
# Modules allowed over MAX_MODULE_LINES for now (none: data/dataset.py was split in parts).
OVER_LIMIT_FOR_NOW: set[str] = set()
JAX = ("jax", "jaxlib", "flax", "optax", "orbax")


def _modules() -> dict[str, str]:
  """{dotted module name: path} of every module of the package."""
  out = {}
  for folder, _, files in os.walk(PACKAGE):
    for f in files:
      if f.endswith(".py"):
        path = os.path.join(folder, f)
        name = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
        out[name.removesuffix(".__init__")] = path
  return out


def _in(prefix: str) -> list[str]:
  """Modules of subpackage `prefix` (e.g. 'bert_jax.data'), `__main__` left out."""
  return sorted(m for m in _modules()
                if (m == prefix or m.startswith(prefix + ".")) and not m.endswith("__main__"))


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


def _trees() -> dict[str, ast.Module]:
  out = {}
  for name, path in _modules().items():
    with open(path, encoding="utf-8") as f:
      out[name] = ast.parse(f.read(), path)
  return out


def _imports(tree: ast.Module) -> list[tuple[int, str, list[str]]]:
  """(line, module, names) of every absolute import, at any depth."""
  out = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      out += [(node.lineno, a.name, []) for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      out.append((node.lineno, node.module, [a.name for a in node.names]))
  return out


# (subpackage or module, what it must not load, why)
RULES = [
    ("bert_jax.data", JAX, "text -> examples -> batches is host code: no JAX"),
    ("bert_jax.settings.model", JAX, "settings and data read the model's shape without JAX"),
    ("bert_jax.settings", JAX, "the config is checked before JAX is imported"),
    ("bert_jax.console", JAX, "an edge module every layer prints through, data/ included"),
    ("bert_jax.model", ("optax", "orbax", "bert_jax.parallel", "bert_jax.planner", "bert_jax.train",
                      "bert_jax.io"),
     "the model knows no optimizer, mesh, checkpoint or loop"),
    ("bert_jax.parallel.startup_roster", JAX, "start-up guards run before JAX is initialised"),
    ("bert_jax.storage.workdir_lock", JAX, "start-up guards run before JAX is initialised"),
    ("bert_jax.parallel.host_malloc", JAX, "it may exec the command again, before JAX starts"),
    ("bert_jax.commands.launch", JAX, "the commands exec again before JAX starts"),
    ("bert_jax.features", ("optax", "bert_jax.train", "bert_jax.trainer"),
     "feature extraction never loads the optimizer or the trainer"),
    # (its settings check the model section against the families' registry,
    # model/family and the FLOPs formulas it names: plain data, which is no model)
    ("bert_jax.train.optim", tuple(m for m in _in("bert_jax.model") if m not in (
        "bert_jax.model", "bert_jax.model.family", "bert_jax.model.flops")),
     "the optimizer knows no model"),
    ("bert_jax.model.family", JAX, "the families' registry is plain data the "
     "settings check a config with before JAX starts"),
]


@pytest.mark.parametrize("prefix, forbidden, why", RULES, ids=[r[0] for r in RULES])
def test_import_rule(prefix, forbidden, why):
  modules = _in(prefix)
  assert modules, f"no module under {prefix}"
  loaded = _loaded_after_importing(*modules)
  assert not _found(loaded, forbidden), why


def test_every_module_is_in_a_folder_with_rules_or_tells_the_run_story():
  # The top level holds the run's story (trainer, errors, console, the default config)
  # and the commands' `python -m` names; everything else lives in a subpackage.
  top = {m for m, path in _modules().items()
         if m.count(".") == 1 and not path.endswith("__init__.py")}
  allowed = {"bert_jax.default_config",
             "bert_jax.trainer", "bert_jax.errors", "bert_jax.console", "bert_jax.__main__",
             *(f"bert_jax.{c}" for c in ALIASES)}
  assert top <= allowed, sorted(top - allowed)


# `python -m bert_jax.<name>`: a module of that name only hands over to commands/.
ALIASES = ("probe", "finetune", "plan", "convert", "merge")


def test_a_command_alias_only_hands_over_to_its_command():
  """One `python -m` pattern: the same guarded two lines for every command."""
  trees = _trees()
  for name, module in [(n, f"bert_jax.{n}") for n in ALIASES] + [
      ("features", "bert_jax.features.__main__")]:
    tree = trees[module]
    assert [m for _, m in _runtime_imports(tree)] == ["bert_jax.commands.launch"], name
    body = ast.unparse(tree.body[-1])
    assert body.startswith("if __name__ == '__main__':") and f"launch.{name}()" in body, name


def test_nothing_in_the_library_imports_a_command():
  bad = [f"{name}:{line} imports {target}" for name, tree in _trees().items()
         if not name.startswith("bert_jax.commands") and name.removeprefix("bert_jax.") not in
         ALIASES and not name.endswith("__main__")
         for line, target in _runtime_imports(tree) if target.startswith("bert_jax.commands")]
  assert not bad, bad


def test_package_never_imports_configs_or_tools():
  # The top-level configs/ and tools/ folders are not installed with the package.
  bad = [f"{name}:{line} imports {mod}" for name, tree in _trees().items()
         for line, mod, _ in _imports(tree) if mod.split(".")[0] in ("configs", "tools")]
  assert not bad, bad


# Folders in import order, from the bottom: a module imports its own folder and the folders
# before it, never one after it (docs/ARCHITECTURE.md draws the same order).
FOLDER_ORDER = ("storage", "settings", "data", "model", "io", "parallel", "features", "train", "eval",
                "planner", "commands")
# Top-level modules any folder may import: what every layer shares at the edge (errors,
# the console, the default config). The other top-level
# modules tell a run's story (trainer) or name a command: only commands/, at the top,
# imports them.
EDGE = ("errors", "console", "default_config")
# Imports up the folder order, each with why it is not a climb.
CLIMBS_ALLOWED = {
    ("bert_jax.settings", "bert_jax.model.family"):
        "a config names its family: the settings check it against the families' registry, "
        "plain data (no JAX; a test holds it)",
    ("bert_jax.settings", "bert_jax.model.precision"):
        "model.dtype='auto' asks the backend which float it runs fast (JAX, imported only then)",
}
TOP = "commands"  # above the story too


def _runtime_imports(tree: ast.Module) -> list[tuple[int, str]]:
  """(line, bert_jax module or name imported) of imports that run: not under
  `if TYPE_CHECKING:` (annotations only)."""
  skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
          and "TYPE_CHECKING" in ast.dump(node.test) for n in ast.walk(node)}
  out = []
  for node in ast.walk(tree):
    if id(node) in skip:
      continue
    if isinstance(node, ast.Import):
      out += [(node.lineno, a.name) for a in node.names if a.name.startswith("bert_jax.")]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith(
        "bert_jax"):
      out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
  return out


def _climbs(trees: dict[str, ast.Module], folders: tuple[str, ...]) -> list[str]:
  """Imports of a folder's module that go up the folder order, or into a story module."""
  bad = []
  for name, tree in trees.items():
    parts = name.split(".")
    if len(parts) < 3 or parts[-1] == "__main__":
      continue  # the top level (the run's story) and `python -m` entry points: anything
    rank = folders.index(parts[1])
    for line, target in _runtime_imports(tree):
      t = target.split(".")
      if len(t) < 2 or t[1] == parts[1]:
        continue
      if t[1] in folders:
        if folders.index(t[1]) > rank and not any(
            name.startswith(a) and target.startswith(b) for a, b in CLIMBS_ALLOWED):
          bad.append(f"{name}:{line} imports {target}: {t[1]}/ is above {parts[1]}/")
      elif t[1] not in EDGE and parts[1] != TOP:
        bad.append(f"{name}:{line} imports {target}: a folder imports no story module")
  return bad


def test_every_folder_has_a_place_in_the_folder_order():
  folders = {m.split(".")[1] for m in _modules() if m.count(".") >= 2}
  assert folders == set(FOLDER_ORDER), sorted(folders ^ set(FOLDER_ORDER))


def test_folders_import_only_down_the_folder_order():
  assert not _climbs(_trees(), FOLDER_ORDER)


def test_architecture_md_tables_are_the_module_docstrings():
  # Each folder's section of docs/ARCHITECTURE.md ("## <folder>/...") has a table whose
  # rows are its modules and their docstrings' first sentences (tests/architecture_doc.py
  # writes them): a module added, moved, removed or re-described without the doc fails.
  with open(architecture_doc.DOC, encoding="utf-8") as f:
    doc = f.read()
  assert set(architecture_doc.sections(doc)) == set(FOLDER_ORDER), "a '## <folder>/' section"
  assert architecture_doc.generated(doc) == doc, (
      "docs/ARCHITECTURE.md's tables differ from the docstrings: run "
      "`python tests/architecture_doc.py`")


def test_every_module_of_a_folder_has_a_docstring():
  missing = [m for m in _modules() if m.count(".") >= 2 and not m.endswith("__main__")
             and not architecture_doc.summary(_modules()[m])]
  assert not missing, missing


def test_architecture_md_draws_the_folder_order_and_lists_the_top_level():
  with open(os.path.join(REPO, "docs", "ARCHITECTURE.md"), encoding="utf-8") as f:
    doc = f.read()
  # The diagram is FOLDER_ORDER, with the story between the library and the commands.
  drawn = " <- ".join(f"{f}/" for f in FOLDER_ORDER[:-1]) + f" <- the top level <- {TOP}/"
  assert f"\n{drawn}\n" in doc, drawn
  table = re.search(r"(?ms)^## The top level[^\n]*\n(.*?)(?=^## )", doc).group(1)
  listed = {n for row in re.findall(r"(?m)^\| ([^|]+) \|", table)
            for n in re.findall(r"`(\w+)\.py`", row)}
  top = {m.split(".")[1] for m, path in _modules().items()
         if m.count(".") == 1 and not path.endswith("__init__.py")}
  assert listed == top, sorted(listed ^ top)


def test_the_folder_check_finds_a_climb_and_an_aliased_one():
  # The check itself: a data module importing train (directly, or as an alias) is caught.
  trees = {"bert_jax.data.x": ast.parse("from bert_jax.train import loop\n"
                                          "import bert_jax.eval.probe as p\n"
                                          "from bert_jax import trainer\n"
                                          "if TYPE_CHECKING:\n  from bert_jax.train import steps\n")}
  found = _climbs(trees, FOLDER_ORDER)
  assert len(found) == 3 and "train/ is above data/" in found[0], found


def _private_uses(name: str, tree: ast.Module, modules: dict) -> list[str]:
  """`_private` names of another bert_jax module: imported, or used through any name the
  module is bound to (`from a import b`, `import a.b as c`, `from a import b as c`)."""
  bad, aliases = [], {}  # local name -> bert_jax module
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for a in node.names:
        if a.name in modules and a.asname:
          aliases[a.asname] = a.name
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      for a in node.names:
        if f"{node.module}.{a.name}" in modules:
          aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        elif node.module.startswith("bert_jax") and a.name.startswith("_"):
          bad.append(f"{name}:{node.lineno} imports {node.module}.{a.name}")
  for node in ast.walk(tree):
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
        and node.value.id in aliases and node.attr.startswith("_")
        and not node.attr.startswith("__") and aliases[node.value.id] != name):
      bad.append(f"{name}:{node.lineno} uses {aliases[node.value.id]}.{node.attr}")
  return bad


def test_the_private_name_check_sees_through_aliases():
  modules = {"bert_jax.a": "", "bert_jax.b": ""}
  tree = ast.parse("import bert_jax.a as z\nfrom bert_jax import a as y\nz._x\ny._y\n")
  assert len(_private_uses("bert_jax.b", tree, modules)) == 2


def test_no_private_name_is_used_outside_its_module():
  modules, bad = _modules(), []
  for name, tree in _trees().items():
    bad += _private_uses(name, tree, modules)
  assert not bad, bad


# Opening, renaming and replacing files: only bert_jax/storage does it, so every path a
# user gives (local or gs://) meets one layer (os.open stays: fcntl's lock files).
_FILE_CALLS = {("", "open"), ("io", "open"), ("os", "replace"), ("os", "rename"),
               ("shutil", "move")}


def _file_calls(tree: ast.AST) -> list[tuple[int, str]]:
  out = []
  for node in ast.walk(tree):
    if not isinstance(node, ast.Call):
      continue
    f = node.func
    if isinstance(f, ast.Name) and ("", f.id) in _FILE_CALLS:
      out.append((node.lineno, f.id))
    elif (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)
          and (f.value.id, f.attr) in _FILE_CALLS):
      out.append((node.lineno, f"{f.value.id}.{f.attr}"))
  return sorted(out)


def test_only_the_storage_layer_opens_renames_or_replaces_files():
  bad = [f"{name}:{line} {call}" for name, tree in _trees().items()
         if not name.startswith("bert_jax.storage") for line, call in _file_calls(tree)]
  assert not bad, bad


def test_the_file_call_check_finds_open_and_os_replace():
  tree = ast.parse("import os\nwith open('x') as f: pass\nos.replace('a', 'b')\nfs.open('y')")
  assert _file_calls(tree) == [(2, "open"), (3, "os.replace")]


def test_no_import_cycles():
  modules = _modules()
  graph = {}
  for name, tree in _trees().items():
    deps = set()
    for _, mod, names in _imports(tree):
      deps |= {f"{mod}.{n}" for n in names if f"{mod}.{n}" in modules}
      if mod in modules and not any(f"{mod}.{n}" in modules for n in names):
        deps.add(mod)
    graph[name] = deps - {name}
  state, cycles = {}, []

  def visit(u, stack):
    state[u] = "open"
    stack.append(u)
    for v in sorted(graph[u]):
      if state.get(v) == "open":
        cycles.append(stack[stack.index(v):] + [v])
      elif v not in state:
        visit(v, stack)
    stack.pop()
    state[u] = "done"

  for m in sorted(graph):
    if m not in state:
      visit(m, [])
  assert not cycles, cycles


def test_every_module_is_short():
  lines = {}
  for name, path in _modules().items():
    with open(path, encoding="utf-8") as f:
      lines[name] = sum(1 for _ in f)
  over = {n: k for n, k in lines.items() if k > MAX_MODULE_LINES and n not in OVER_LIMIT_FOR_NOW}
  assert not over, f"modules over {MAX_MODULE_LINES} lines: {over}"


def test_long_functions_say_why():
  bad = []
  for name, path in _modules().items():
    with open(path, encoding="utf-8") as f:
      text = f.read()
    lines = text.splitlines()
    for node in ast.walk(ast.parse(text, path)):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        n = node.end_lineno - node.lineno + 1
        first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
        near = lines[first - 2:node.lineno] if first > 1 else lines[:node.lineno]
        if n > MAX_FUNCTION_LINES and not any(LONG_REASON in l for l in near):
          bad.append(f"{name}:{node.lineno} {node.name} ({n} lines)")
  assert not bad, f"over {MAX_FUNCTION_LINES} lines with no '{LONG_REASON}' reason: {bad}"


def test_pyproject_installs_every_subpackage(tmp_path):
  # The package list is written out (configs/ maps to bert_jax.configs): every folder
  # of the package must be in it, or `pip install .` leaves it out.
  import tomllib
  with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
    listed = set(tomllib.load(f)["tool"]["setuptools"]["packages"])
  folders = {m for m in _modules() if os.path.basename(_modules()[m]) == "__init__.py"}
  assert listed == folders | {"bert_jax.configs"}, sorted(listed ^ (folders | {"bert_jax.configs"}))


def test_every_environment_variable_the_package_reads_is_in_the_docs_table():
  """Settings kept as environment variables are documented (issue 42): each BERT_JAX_*
  name in the package is a row of docs/multi-host-and-tpu.md's table, and each row is
  still read somewhere."""
  used = set()
  for path in glob.glob(os.path.join(PACKAGE, "**", "*.py"), recursive=True):
    with open(path, encoding="utf-8") as f:
      used |= set(re.findall(r"\bBERT_JAX_[A-Z_]+\b", f.read()))
  with open(os.path.join(REPO, "docs", "multi-host-and-tpu.md"), encoding="utf-8") as f:
    text = f.read()
  table = text[text.index("<!-- env:start -->"):text.index("<!-- env:end -->")]
  rows = set(re.findall(r"^\| `(BERT_JAX_[A-Z_]+)`", table, re.M))
  assert used - rows == set(), f"undocumented: {sorted(used - rows)}"
  assert rows - used == set(), f"documented but never read: {sorted(rows - used)}"


def test_the_step_loop_reads_as_the_step_loop():
  """Issue 42: every concern around a step is a hook (train/hooks), so the loop of a
  phase stays short: under 40 lines."""
  tree = _trees()["bert_jax.train.loop"]
  fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
            and n.name == "_train_phase")
  assert fn.end_lineno - fn.lineno + 1 < 40


# The names of a workdir's parts (storage/workdir.py spells them, once).
_LAYOUT = {"checkpoints", "prepared", "tensorboard", "metrics.jsonl", "training_curves.png",
           "goodput", "PROFILE"}


def test_only_the_workdir_object_spells_the_workdirs_layout():
  """Issue 42: no module builds a workdir sub-path by hand; each asks storage/workdir."""
  bad = []
  for name, tree in _trees().items():
    if name == "bert_jax.storage.workdir":
      continue
    for node in ast.walk(tree):
      if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
          and node.func.attr == "join"):
        bad += [f"{name}:{node.lineno} {a.value!r}" for a in node.args
                if isinstance(a, ast.Constant) and a.value in _LAYOUT]
  assert not bad, bad


def test_importing_the_package_changes_nothing_in_the_process():
  """Issue 42: no process-wide patching at import. Importing every module (as a library
  user's notebook would) leaves the environment and the loggers' levels as the
  dependencies' own imports left them (JAX sets two variables of its own),
  even with libtpu installed on a host without a TPU, where a command (launch.start)
  pins JAX to the CPU: the command does that, before JAX is imported, not the import."""
  script = (
      "import importlib, logging, os, sys\n"
      "import gcsfs, jax, flax, optax, orbax.checkpoint, tensorflow_datasets  # their own\n"
      "levels = lambda: {k: v.level for k, v in logging.Logger.manager.loggerDict.items()\n"
      "                  if isinstance(v, logging.Logger)}\n"
      "env, before = dict(os.environ), levels()\n"
      "for n in sys.argv[1:]:\n"
      "  importlib.import_module(n)\n"
      "after = levels()\n"
      "changed = sorted(k for k in set(env) | set(os.environ) if env.get(k) != os.environ.get(k))\n"
      "print(changed, {k: v for k, v in after.items() if v != before.get(k, 0)})\n"
      "from bert_jax.commands import launch\n"
      "launch.bert_jax.cpu_only_without_accelerator(accelerator=False)\n"
      "print(os.environ.get('JAX_PLATFORMS'))\n")
  env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
  env["TPU_LIBRARY_PATH"] = "/nonexistent/libtpu.so"  # libtpu "installed"
  names = sorted(m for m in _modules() if not m.endswith("__main__"))
  out = subprocess.run([sys.executable, "-c", script, *names], env=env, cwd=REPO,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  first, second = out.stdout.strip().splitlines()[-2:]
  assert first == "[] {}", first
  assert second == "cpu"  # what the command's start does, asked for


def test_only_storage_asks_which_storage_a_path_is_on():
  """Issue 42: local and gs:// are one interface; code outside storage/ asks what it
  needs of a path (storage/outputs' checks, fs.local_copy_dir, fs.local_mirror), never
  whether it is a bucket."""
  bad = []
  for name, tree in _trees().items():
    if name.startswith("bert_jax.storage"):
      continue
    for node in ast.walk(tree):
      if isinstance(node, ast.Attribute) and node.attr in ("is_gcs", "GCS"):
        bad.append(f"{name}:{node.lineno} {node.attr}")
      if isinstance(node, ast.ImportFrom) and any(a.name in ("is_gcs", "GCS") for a in node.names):
        bad.append(f"{name}:{node.lineno} import")
      if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):  # x.startswith("gs://")
        urls = [a.value for a in node.args
                if isinstance(a, ast.Constant) and isinstance(a.value, str) and "://" in a.value]
        if urls:
          bad.append(f"{name}:{node.lineno} {node.func.attr}({urls[0]!r})")
  assert not bad, bad


def test_settings_import_only_what_checks_a_config():
  """Issue 42: the settings package sits at the bottom; it imports errors, the families'
  registry (plain data: a config's family is checked against it), the default config
  (what a continued run's source owns), storage's URL check (storage/urls), and its own
  modules; `model.precision` only to resolve 'auto' (the dtype and the attention kernel)."""
  allowed = ("bert_jax.errors", "bert_jax.model.family", "bert_jax.default_config",
             "bert_jax.storage.urls", "bert_jax.settings", "bert_jax.model.precision")
  bad = [f"{name}:{line} imports {target}" for name, tree in _trees().items()
         if name.startswith("bert_jax.settings")
         for line, target in _runtime_imports(tree) if not target.startswith(allowed)]
  assert not bad, bad


def test_importing_the_package_changes_nothing_outside_it():
  """Issue 42: no process-wide patching at import. A module's top level defines; it calls
  nothing and assigns no attribute or item (of a dependency, sys, os.environ): logging
  filters, hooks and client settings are installed by the code that needs them, when it
  runs (io/checkpointing's, before its first manager). A custom_vjp's defvjp is a
  definition."""
  def top_level(body):  # statements run at import, inside ifs and trys too
    for node in body:
      if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
        continue
      yield node
      if isinstance(node, (ast.If, ast.Try, ast.With)):
        yield from top_level(node.body + getattr(node, "orelse", []))

  bad = []
  for name, tree in _trees().items():
    for node in top_level(tree.body):
      if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
          and not (isinstance(node.value.func, ast.Attribute)
                   and node.value.func.attr == "defvjp")):
        bad.append(f"{name}:{node.lineno} {ast.unparse(node)[:60]}")
      targets = (node.targets if isinstance(node, ast.Assign) else
                 [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
      bad += [f"{name}:{node.lineno} {ast.unparse(t)} =" for t in targets
              if isinstance(t, (ast.Attribute, ast.Subscript))]
  assert not bad, bad


def _family_questions(trees: dict[str, ast.Module], names: tuple[str, ...]) -> list[str]:
  """Comparisons of a family's name (`x.family == 'bert'`, `family in ('modernbert',)`)
  outside the families' registry."""
  bad = []
  for name, tree in trees.items():
    if name == "bert_jax.model.family":
      continue
    for node in ast.walk(tree):
      if not isinstance(node, ast.Compare):
        continue
      sides = [node.left, *node.comparators]
      said = {n.value for s in sides for n in ast.walk(s)
              if isinstance(n, ast.Constant) and isinstance(n.value, str)}
      asks = any(isinstance(n, (ast.Attribute, ast.Name))
                 and (getattr(n, "attr", None) or getattr(n, "id", None)) == "family"
                 for s in sides for n in ast.walk(s))
      if asks and said & set(names):
        bad.append(f"{name}:{node.lineno} compares a family's name")
  return bad


def test_no_module_but_the_registry_compares_a_familys_name():
  """Issue 55: every family question goes to its record (model/family.py): a new family
  is a record, not a branch in every module that asks."""
  from bert_jax.model import family
  assert not _family_questions(_trees(), tuple(family.FAMILIES))


def test_the_family_check_finds_a_comparison():
  tree = ast.parse("if config.family == 'modernbert':\n  pass\nok = fam.rope\n"
                   "bad = c.model.family in ('bert',)\n")
  found = _family_questions({"bert_jax.x.y": tree}, ("bert", "modernbert"))
  assert [f.split(":")[1].split()[0] for f in found] == ["1", "4"]


def test_the_runs_parts_take_the_workdir_the_trainer_opened():
  """Issue 55: the trainer opens the run's Workdir once and hands the object on; no module
  but the trainer and storage/ builds one (a reader of a user's path, a test's or a
  tool's, asks `storage.workdir.opened`)."""
  bad = [f"{name}:{node.lineno}" for name, tree in _trees().items()
         if name != "bert_jax.trainer" and not name.startswith("bert_jax.storage")
         for node in ast.walk(tree)
         if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Workdir"]
  assert not bad, bad


def _private_imports_of(package: str, trees: dict[str, ast.Module]) -> list[str]:
  """Modules that import a private module (`_x`) or a private name of `package`."""
  bad = []
  for name, tree in trees.items():
    for node in ast.walk(tree):
      names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
               [f"{node.module}.{a.name}" for a in node.names]
               if isinstance(node, ast.ImportFrom) and node.module else [])
      for full in names:
        parts = full.split(".")
        if parts[:len(package.split("."))] == package.split(".") and any(
            p.startswith("_") and not p.startswith("__") for p in parts):
          bad.append(f"{name}:{node.lineno} imports {full}")
  return bad


def test_only_one_module_touches_orbaxs_private_names():
  """Issue 55: the settings Orbax has no public option for live in io/orbax_private.py
  (its names are checked against the installed Orbax: tests/test_storage_backends.py)."""
  trees = {n: t for n, t in _trees().items() if n != "bert_jax.io.orbax_private"}
  assert _private_imports_of("orbax", trees) == []
  paths = _modules()
  assert not [n for n in trees if "_BASE_TS_CONTEXT" in open(paths[n]).read()]


def test_the_private_import_check_finds_one():
  tree = ast.parse("from orbax.checkpoint._src.metadata import array_metadata_store\n"
                   "import orbax.checkpoint as ocp\n")
  assert len(_private_imports_of("orbax", {"m": tree})) == 1
