"""Generated blocks of the docs: the text between `<!-- NAME:start -->` and `<!-- NAME:end -->`.

The one rewriter of such blocks, used by every tool that writes one:

  quickstart  README.md             tools/measure_quickstart.py --readme ("Measured")
  reruns      README.md             tools/measure_reruns.py --readme ("Reruns")
  bench       docs/performance.md   python -m tools.bench --readme (the benchmark table)

Everything outside the markers is kept byte for byte. A file without exactly one
start marker followed by one end marker is a one-line ConfigError naming the file,
and is left as it was; the new text is written to a temporary file beside it and
renamed over it, so a failed write never leaves half a file.
"""

from __future__ import annotations

import os
import tempfile

from bert_jax.errors import ConfigError


def markers(name: str) -> tuple[str, str]:
  """The start and end marker lines of block `name`."""
  return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def wrap(name: str, body: str) -> str:
  """`body` between the markers of block `name`, as it appears in the file."""
  start, end = markers(name)
  return f"{start}\n{body.strip(chr(10))}\n{end}"


def replace(text: str, name: str, body: str, path: str) -> str:
  """`text` with the body of block `name` replaced by `body`; `path` names it in errors."""
  start, end = markers(name)
  if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
    raise ConfigError(f"{path}: expected exactly one '{start}' line followed by one "
                      f"'{end}' line to put the generated block between")
  head, rest = text.split(start)
  _, tail = rest.split(end)
  return head + wrap(name, body) + tail


def check(path: str, name: str) -> None:
  """Raises what `rewrite` would, before a long measurement rather than after it."""
  with open(path, encoding="utf-8") as f:
    replace(f.read(), name, "", path)


def rewrite(path: str, name: str, body: str) -> None:
  """Replaces the body of block `name` in the file `path`, atomically."""
  with open(path, encoding="utf-8") as f:
    text = replace(f.read(), name, body, path)
  folder = os.path.dirname(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(dir=folder, prefix=".readme_block-", suffix=".tmp")
  try:
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      f.write(text)
    os.chmod(tmp, os.stat(path).st_mode & 0o777)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise
