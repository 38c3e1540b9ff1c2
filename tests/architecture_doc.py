"""docs/ARCHITECTURE.md's per-folder tables, generated from the module docstrings.

Each folder's section ("## <folder>/: ...") holds a `| module | owns |` table whose
rows are the folder's modules, and whose "owns" cell is the first sentence of the
module's docstring. tests/test_architecture.py checks the doc against this; after
adding, moving or re-describing a module, rewrite the tables with

  python tests/architecture_doc.py

so the doc cannot drift from the code: the docstring is the one place to say it.
"""

import ast
import os
import re
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(REPO, "docs", "ARCHITECTURE.md")
HEADER = "| module | owns |\n| --- | --- |\n"
# A folder section's table: the header and its rows, up to the first line that is no row.
_TABLE = re.compile(r"\| module \| owns \|\n\| --- \| --- \|\n(?:\|[^\n]*\n)*")


def summary(path: str) -> str:
  """The first sentence of a module's docstring, on one line ('' without a docstring)."""
  with open(path, encoding="utf-8") as f:
    doc = ast.get_docstring(ast.parse(f.read(), path)) or ""
  paragraph = " ".join(doc.split("\n\n")[0].split())
  end = re.search(r"\.(\s|$)", paragraph)
  return paragraph[:end.start()] if end else paragraph


def folder_table(folder: str, order: list[str] = ()) -> str:
  """The table of bert_jax/<folder>/: one row per module (not `__init__`, `__main__`),
  those named in `order` first in that order (the doc's: the flow of the data), then the
  rest in file-name order."""
  directory = os.path.join(REPO, "bert_jax", folder)
  names = sorted(name for name in os.listdir(directory)
                 if name.endswith(".py") and name not in ("__init__.py", "__main__.py"))
  names = [n for n in order if n in names] + [n for n in names if n not in order]
  rows = [f"| `{name}` | {summary(os.path.join(directory, name)).replace('|', '/')} |\n"
          for name in names]
  return HEADER + "".join(rows)


def sections(doc: str) -> dict[str, tuple[int, int]]:
  """{folder: (start, end) of its section's table} for every `## <folder>/:` section."""
  out = {}
  for m in re.finditer(r"(?m)^## (\w+)/:[^\n]*\n", doc):
    table = _TABLE.search(doc, m.end())
    following = re.search(r"(?m)^## ", doc[m.end():])
    if table and (following is None or table.start() < m.end() + following.start()):
      out[m.group(1)] = table.span()
  return out


def generated(doc: str) -> str:
  """`doc` with every folder section's table replaced by the generated one."""
  for folder, (start, end) in sorted(sections(doc).items(), key=lambda kv: -kv[1][0]):
    order = re.findall(r"(?m)^\| `(\w+\.py)` \|", doc[start:end])
    doc = doc[:start] + folder_table(folder, order) + doc[end:]
  return doc


def main() -> int:
  with open(DOC, encoding="utf-8") as f:
    doc = f.read()
  new = generated(doc)
  if new != doc:
    with open(DOC, "w", encoding="utf-8") as f:
      f.write(new)
  print(f"{DOC}: {'rewritten' if new != doc else 'already up to date'}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
