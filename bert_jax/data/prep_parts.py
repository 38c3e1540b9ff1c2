"""A corpus cut into parts, the unit of parallel preparation.

A part's boundaries depend only on the corpus, never on how many workers or
hosts prepare it: the text files of a corpus (a glob's files in sorted order)
are seen as one byte stream, cut every `part_bytes(total size)` bytes (parts
of 16 to 64 MiB, about TARGET_PARTS of them: enough that workers finish
together, few enough that shard files stay few), and each cut moved forward
to the next document boundary (after a blank line for `plain`, after a line end
for `tab` and `jsonl`, at a row group's start for `parquet`; a file's end always is
one; a compressed file is never cut inside, as its stream is read from its start).
Sizes count the text inside (`work_size`): a compressed file's bytes times
COMPRESSED_WORK, a Parquet file's uncompressed row groups. So
the documents of the parts, read in
part order, are the documents of the corpus read whole; only the part-local
seeds and windows (see `prep_write`) depend on the cuts, and the cuts on the
bytes of the corpus alone.

A TFDS corpus is cut every TFDS_PART_EXAMPLES examples (the order of its
'train' split). A corpus of at most one part's size (the built-in one, any
small file or TFDS set), and any corpus read with `data.max_documents` (a
count in corpus order), is one part: the whole corpus, read by its spec,
exactly as before parts.
"""

from __future__ import annotations

import dataclasses
import os
import re

from bert_jax.data import corpus, records
from bert_jax.storage import fs

# A corpus up to PART_BYTES is one part. Above, parts of MIN_PART_BYTES to PART_BYTES,
# about TARGET_PARTS of them: a part's fixed costs (its last window, its shard
# files) stay small against its seconds of work, and with many more parts than
# workers the last ones finish close together.
# BERT_JAX_PREPARE_PART_BYTES: a hidden setting for tests of several parts on a small corpus.
# Read and checked when used (a bad value is one line); a number set here wins (tests).
PART_BYTES: int | None = None


def part_bytes_limit() -> int:
  if PART_BYTES is not None:
    return PART_BYTES
  return int(fs.env_number("BERT_JAX_PREPARE_PART_BYTES", 64 << 20, int, 1))


MIN_PART_BYTES = 16 << 20
TARGET_PARTS = 256
TFDS_PART_EXAMPLES = 20_000  # ~60 MiB of Wikipedia articles
_SCAN_BYTES = 1 << 20
# A blank line: a line end, then only whitespace (CR of CRLF included), then a line end.
_PLAIN_BOUNDARY = re.compile(rb"\n[ \t\r\f\v]*\n")
_LINE_BOUNDARY = re.compile(rb"\n")

Range = tuple[str, int, "int | None"]  # (path, start, end or None = to the file's end)


@dataclasses.dataclass(frozen=True)
class Part:
  """One part: `ranges` of files, `examples` of a TFDS corpus, or neither: the whole
  corpus read by its spec."""
  index: int
  count: int  # parts in the corpus
  ranges: tuple[Range, ...]
  bytes: int  # its size, for progress: bytes of text, or TFDS examples (0: unknown)
  examples: tuple[int, int] | None = None  # [start, end) of a TFDS corpus

  def describe(self) -> str:
    """The input, as an error line names it."""
    if self.examples is not None:
      return f"part {self.index + 1} of {self.count} (examples {self.examples[0]} to " \
             f"{self.examples[1]})"
    if not self.ranges:
      return "the whole corpus"
    (first, start, _), (last, _, end) = self.ranges[0], self.ranges[-1]
    where = [f"'{first}' from byte {start}"]
    if last != first:
      where.append(f"'{last}'")
    where.append(f"to byte {end}" if end is not None else "to its end")
    return f"part {self.index + 1} of {self.count} ({' '.join(where)})"


def plan(spec: str, fmt: str, max_documents: int) -> list[Part]:
  """The parts of corpus `spec` (`fmt` resolved), in corpus order."""
  if spec.startswith(corpus.TFDS_PREFIX) and not max_documents:
    return _tfds_parts(corpus.tfds_size(spec))
  if not corpus.is_files(spec) or max_documents:
    return [Part(0, 1, (), _size(spec))]
  paths = corpus.files(spec)
  layout = [_File(p, fmt) for p in paths]
  total = sum(f.size for f in layout)
  if total <= part_bytes_limit():
    return [Part(0, 1, (), total)]
  step = part_bytes(total)
  cuts = [(0, 0)]
  stream = 0  # stream offset of file i's start
  for i, f in enumerate(layout):
    k = stream // step + 1
    while k * step < stream + f.size:
      at = f.cut_at(k * step - stream)
      cut = (i, at) if at is not None and at < f.extent else (i + 1, 0)
      if cut > cuts[-1] and cut != (len(paths), 0):
        cuts.append(cut)
      k += 1
    stream += f.size
  cuts.append((len(paths), 0))
  ranges = [r for a, b in zip(cuts, cuts[1:]) if (r := _ranges(layout, a, b))]
  return [Part(i, len(ranges), tuple(r), sum(layout[paths.index(p)].bytes_of(s, e)
                                             for p, s, e in r))
          for i, r in enumerate(ranges)]


# A compressed file counts as this many times its bytes when parts are sized: about the
# text inside (zstd and gzip shrink web text 3 to 5 times), so a part of compressed
# shards is about as much work as one of text. Fixed, so parts depend on the corpus alone.
COMPRESSED_WORK = 4


def work_size(path: str) -> int:
  """A file's size as parts count it, about the text inside: its bytes; COMPRESSED_WORK
  times them for a compressed file; a Parquet file's row groups' uncompressed bytes."""
  return _File(path, "").size


class _File:
  """Where a corpus file can be cut, in its own coordinates: bytes (at document
  boundaries) for text and JSONL; row groups for Parquet; nowhere inside for a
  compressed file (a stream is read from its start), which is one range whole. `size`
  is `work_size`'s."""

  def __init__(self, path: str, fmt: str):
    self.path, self.fmt = path, fmt
    first = records.head(path)
    self.compressed = records.compression(first) is not None
    self.groups: list[int] | None = None  # where a Parquet file's row groups start, in work
    if first.startswith(records.PARQUET_MAGIC):
      sizes = records.row_group_sizes(path) or [0]  # no group: one range, whose read says so
      self.groups = [sum(sizes[:g]) for g in range(len(sizes))]
      self.size = max(sum(sizes), 1)
    else:
      self.size = os.path.getsize(path) * (COMPRESSED_WORK if self.compressed else 1)
    self.extent = len(self.groups) if self.groups is not None else self.size

  def cut_at(self, offset: int) -> int | None:
    """The first place a part may start at or after byte `offset` (None: none before the
    file's end)."""
    if self.groups is not None:
      return next((g for g, at in enumerate(self.groups) if at >= offset), None)
    if self.compressed:
      return None
    return _next_boundary(self.path, offset, self.fmt)

  def bytes_of(self, start: int, end: int | None) -> int:
    """The size of the range [start, end) of this file, in bytes."""
    if self.groups is None:
      return (self.size if end is None else end) - start
    at = lambda g: self.size if g is None or g >= len(self.groups) else self.groups[g]
    return at(end) - at(start)


def part_bytes(total: int) -> int:
  """The part size of a text corpus of `total` bytes (all of it for one part)."""
  if total <= part_bytes_limit():
    return total
  return min(part_bytes_limit(), max(MIN_PART_BYTES, total // TARGET_PARTS))


def _tfds_parts(n: int) -> list[Part]:
  if n <= TFDS_PART_EXAMPLES:
    return [Part(0, 1, (), n)]
  starts = list(range(0, n, TFDS_PART_EXAMPLES))
  return [Part(i, len(starts), (), min(s + TFDS_PART_EXAMPLES, n) - s,
               (s, min(s + TFDS_PART_EXAMPLES, n))) for i, s in enumerate(starts)]


def _size(spec: str) -> int:
  return sum(work_size(p) for p in corpus.files(spec)) if corpus.is_files(spec) else 0


def _ranges(layout: list[_File], a: tuple[int, int], b: tuple[int, int]) -> list[Range]:
  """The file ranges from cut `a` to cut `b` (each (file index, place in the file))."""
  out: list[Range] = []
  for i in range(a[0], min(b[0], len(layout) - 1) + 1):
    start = a[1] if i == a[0] else 0
    end = b[1] if i == b[0] else None
    if end == 0 or start == layout[i].extent:
      continue
    out.append((layout[i].path, start, end))
  return out


def _next_boundary(path: str, offset: int, fmt: str) -> int | None:
  """The first document start at or after `offset` (None: none before the file's end)."""
  pattern = _PLAIN_BOUNDARY if fmt == "plain" else _LINE_BOUNDARY  # tab, JSONL: a line end
  with fs.open(path, "rb") as f:
    f.seek(max(0, offset - 1))  # a line end just before `offset` may start the match
    base, data = f.tell(), b""
    while True:
      block = f.read(_SCAN_BYTES)
      if not block:
        return None
      data += block
      found = pattern.search(data)
      if found:
        return base + found.end()
      keep = len(data) - 64 if len(data) > 64 else 0  # a blank line cut by the block end
      base, data = base + keep, data[keep:]
