"""tools/readme_block.py: the one rewriter of the docs' generated blocks."""

import os

import pytest

from bert_jax.errors import ConfigError
from tools import readme_block

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Every generated block and the file that holds it (the tools that write them name
# the same files: measure_quickstart.README, bench.README_PATH).
BLOCKS = [("quickstart", "README.md"), ("reruns", "README.md"),
          ("bench", "docs/performance.md")]


def test_only_the_body_between_the_markers_changes(tmp_path):
  path = tmp_path / "guide.md"
  before = "# t\n\n<!-- a:start -->\nkept a\n<!-- a:end -->\n\nmiddle\n"
  after = "\ntail, no newline at the end"
  path.write_text(before + "<!-- b:start -->\nold\nlines\n<!-- b:end -->" + after)
  readme_block.rewrite(str(path), "b", "\nnew table\n\n")
  assert path.read_text() == before + "<!-- b:start -->\nnew table\n<!-- b:end -->" + after
  assert [p.name for p in tmp_path.iterdir()] == ["guide.md"]  # no temporary file left


@pytest.mark.parametrize("text", [
    "no markers\n",
    "<!-- b:start -->\nonly a start\n",
    "<!-- b:end -->\nend first\n<!-- b:start -->\n",
    "<!-- b:start -->\n<!-- b:end -->\n<!-- b:start -->\n<!-- b:end -->\n",
])
def test_a_file_without_exactly_one_block_is_one_line_and_unchanged(tmp_path, text):
  path = tmp_path / "guide.md"
  path.write_text(text)
  for call in (lambda: readme_block.check(str(path), "b"),
               lambda: readme_block.rewrite(str(path), "b", "new")):
    with pytest.raises(ConfigError) as e:
      call()
    assert "\n" not in str(e.value) and str(path) in str(e.value)
    assert "<!-- b:start -->" in str(e.value) and "<!-- b:end -->" in str(e.value)
  assert path.read_text() == text


def test_wrap_is_what_rewrite_puts_in_the_file(tmp_path):
  path = tmp_path / "guide.md"
  path.write_text("x\n<!-- b:start -->\n<!-- b:end -->\ny\n")
  readme_block.rewrite(str(path), "b", "body\n")
  assert path.read_text() == "x\n" + readme_block.wrap("b", "body") + "\ny\n"


@pytest.mark.parametrize("name, path", BLOCKS, ids=[b[0] for b in BLOCKS])
def test_each_generated_block_is_once_in_its_file(name, path):
  readme_block.check(os.path.join(ROOT, path), name)
  with open(os.path.join(ROOT, path), encoding="utf-8") as f:
    text = f.read()
  for other, other_path in BLOCKS:
    if other_path != path:
      assert readme_block.markers(other)[0] not in text, f"{other} block in {path}"


def test_the_tools_write_the_files_listed_here():
  from tools import bench, measure_quickstart, measure_reruns
  assert os.path.relpath(measure_quickstart.README, ROOT) == "README.md"
  assert (measure_quickstart.BLOCK, measure_reruns.BLOCK, bench.README_BLOCK) == tuple(
      name for name, _ in BLOCKS)
  assert bench.README_PATH == dict(BLOCKS)["bench"]
