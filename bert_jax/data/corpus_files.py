"""Text files of a corpus: checks, streamed reading with repair, plain and tab parsing.

Owns everything bert_jax.data.corpus does with a text file: the one-line CorpusError
for input that cannot be meant as text (missing, a directory, a symlink loop,
a zip archive, UTF-16, binary, empty or only blank lines; compressed files are judged
by their text, Parquet files by their footer), reading in 1 MiB
blocks, and `CorpusStats`, which counts what was repaired: bytes that are not
UTF-8 (replaced by U+FFFD), control characters such as NUL (dropped), lines
over 1 MiB (cut into pieces, each a sentence), tab-format lines without
exactly one tab or with an empty half (skipped), documents over 50 000
sentences or 1 MiB (cut into several). A UTF-8 byte order mark, CRLF and CR
line ends are simply accepted. Formats: `plain` (one sentence per line, blank
line between documents), `tab` (`A<TAB>B` per line, a two-sentence document), and the
record formats of bert_jax.data.records, `jsonl` and `parquet` (a record a document).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
from collections.abc import Iterator

from bert_jax.data import records
from bert_jax.errors import CorpusError
from bert_jax.storage import fs

_SNIFF_LINES = 1000
_SNIFF_BYTES = 1 << 16
_BLOCK_BYTES = 1 << 20
MAX_LINE_BYTES = records.MAX_SENTENCE_CHARS
MAX_DOCUMENT_SENTENCES = records.MAX_DOCUMENT_SENTENCES
MAX_DOCUMENT_CHARS = records.MAX_DOCUMENT_CHARS  # why: see records
CONTROL_CHARS = records.CONTROL_CHARS  # dropped, not fatal
_BOM = b"\xef\xbb\xbf"
# Compressed files (gzip, zstd, bzip2, xz) are read through bert_jax.data.records.
_MAGIC = ((b"PK\x03\x04", "a zip archive"), (b"\xff\xfe", "UTF-16/32 (byte order mark)"),
          (b"\xfe\xff", "UTF-16 (byte order mark)"), (b"\x00\x00\xfe\xff", "UTF-32"))


@dataclasses.dataclass
class CorpusStats:
  """What reading found: sizes, and odd input that was repaired (kind -> count, first place)."""
  documents: int = 0
  sentences: int = 0
  one_sentence_documents: int = 0
  oddities: dict[str, list] = dataclasses.field(default_factory=dict)

  def note(self, kind: str, where: str, count: int = 1) -> None:
    if kind not in _ODDITIES:
      raise ValueError(f"unknown kind {kind!r}")
    entry = self.oddities.setdefault(kind, [0, where])
    entry[0] += count

  def count(self, kind: str) -> int:
    return self.oddities.get(kind, [0])[0]

  def warnings(self) -> list[str]:
    """One line per kind of repaired input, naming the first place it occurred."""
    return [f"{n} {_ODDITIES[kind]} (first at {where})"
            for kind, (n, where) in sorted(self.oddities.items())]

  def to_dict(self) -> dict:
    return {"documents": self.documents, "sentences": self.sentences,
            "one_sentence_documents": self.one_sentence_documents,
            "repaired": {k: {"count": n, "first_at": w} for k, (n, w) in self.oddities.items()}}


_ODDITIES = {
    "invalid_utf8": "byte sequence(s) that are not UTF-8, replaced by U+FFFD",
    "control_chars": "control character(s) (NUL, ESC, ...), dropped",
    "long_lines": f"line(s) over {MAX_LINE_BYTES >> 20} MiB, cut into pieces that are "
                  "sentences of their own",
    "tab_lines_skipped": "tab-format line(s) without exactly one tab or with an empty half, "
                         "skipped",
    "long_documents": f"document(s) over {MAX_DOCUMENT_SENTENCES} sentences or "
                      f"{MAX_DOCUMENT_CHARS >> 20} MiB, cut into several documents",
    "null_fields": "record(s) whose text field is null, skipped",
}


def detect_format(path: str) -> str:
  """'parquet' for a Parquet file; 'jsonl' if the first non-blank line is a JSON object;
  'tab' if each of the first ~1000 non-blank lines has exactly one tab; else 'plain'.
  A compressed file is judged by its decompressed text."""
  check_file(path)
  if records.is_parquet(path):
    return "parquet"
  if _starts_with_json_object(path):
    return "jsonl"
  lines = itertools.islice((l for _, block, _ in _read_lines(path, CorpusStats())
                            for l in block if l.strip()), _SNIFF_LINES)
  seen = False
  for line in lines:
    seen = True
    if line.count("\t") != 1:
      return "plain"
  return "tab" if seen else "plain"


_JSON_LINE_BYTES = 64 << 20  # the first record is read whole to judge it, up to this


def _starts_with_json_object(path: str) -> bool:
  """Whether the first non-blank line is a JSON object (a record of any size)."""
  with records.open_bytes(path) as f:
    line = b""
    while not line.strip():
      line = f.readline(_JSON_LINE_BYTES)
      if not line:
        return False
  line = line.strip()
  if not line.startswith(b"{"):
    return False
  if len(line) >= _JSON_LINE_BYTES - 2:  # longer than is read to judge: an object's start
    return line.startswith(b'{"')
  try:
    return isinstance(json.loads(line.decode("utf-8", errors="replace")), dict)
  except ValueError:
    return False


def check_file(path: str) -> None:
  """A readable regular file that looks like UTF-8 text, or a one-line CorpusError."""
  if not os.path.lexists(path):
    raise CorpusError(f"corpus file '{path}' does not exist; expected a text file, a glob, "
                      "'builtin' or 'tfds:<name>:<feature>'")
  if not os.path.exists(path):
    raise CorpusError(f"corpus file '{path}' is a symlink that leads nowhere (broken or a "
                      "loop); expected a text file")
  if os.path.isdir(path):
    raise CorpusError(f"corpus file '{path}' is a directory; expected a text file")
  if not os.path.isfile(path):
    raise CorpusError(f"corpus file '{path}' is not a regular file (a pipe or device?); "
                      "expected a text file, which is read more than once")
  try:
    with fs.open(path, "rb") as f:
      head = f.read(_SNIFF_BYTES)
  except OSError as e:
    raise CorpusError(f"corpus file '{path}' cannot be read: {e.strerror or e}") from None
  if head.startswith(records.PARQUET_MAGIC):
    records.parquet_file(path)  # its footer: a truncated copy is found now, in one line
    return
  if records.compression(head) is not None:  # judged by the text inside
    with records.open_bytes(path) as f:
      head = f.read(_SNIFF_BYTES)
    if not head:
      raise CorpusError(f"corpus file '{path}' is compressed and holds nothing; expected "
                        "text, JSONL or Parquet")
  _sniff(path, head)


def _sniff(path: str, head: bytes) -> None:
  """Rejects what is clearly not UTF-8 text, from the first 64 KiB."""
  if head.startswith(_BOM):
    return
  for magic, what in _MAGIC:
    if head.startswith(magic):
      raise CorpusError(f"corpus file '{path}' is {what}; expected UTF-8 text "
                        "(decompress or convert it first)")
  # A lone bad byte is repaired while reading; this many means another encoding.
  text = head.decode("utf-8", errors="replace")
  if len(head) == _SNIFF_BYTES:
    text = text[:-4]  # the sample may end inside a character
  bad = text.count("\ufffd") - head.count("\ufffd".encode()) + text.count("\x00")
  if bad > 16 and bad > 0.01 * len(text):
    first = min(i for i in (text.find("\ufffd"), text.find("\x00")) if i >= 0)
    raise CorpusError(
        f"corpus file '{path}' does not look like UTF-8 text: {bad} NUL or invalid bytes in "
        f"its first {len(head)} bytes (first at line {text.count(chr(10), 0, first) + 1}); "
        "expected UTF-8 (convert it, e.g. iconv -f latin1 -t utf-8)")


def file_documents(path: str, fmt: str, stats: CorpusStats, start: int = 0,
                   end: int | None = None, field: str = "text") -> Iterator[list[str]]:
  """The documents of `path`, or of its part [start, end) (see `prep_parts`: bytes at
  document boundaries, or a Parquet file's row groups). Only a whole file can be 'empty'.
  `field` is the text field of JSONL records and Parquet rows."""
  span = (start, end)
  parquet = records.is_parquet(path)
  if parquet != (fmt == "parquet"):
    raise CorpusError(f"corpus file '{path}' is {'a Parquet file' if parquet else 'not Parquet'}"
                      f"; expected {fmt} (the corpus's format; a corpus's files share one, or "
                      "set --config.data.format)")
  if fmt in records.READERS:
    return records.READERS[fmt](path, field, stats, start, end)
  if fmt == "tab":
    return _tab_documents(path, stats, span)
  return _plain_documents(path, stats, span)


def _where(path: str, span: tuple[int, int | None]) -> str:
  """How notes name a place: line numbers count from the start of the byte range read."""
  return f"'{path}'" if span[0] == 0 else f"'{path}' (from byte {span[0]})"


def _blocks(path: str, span: tuple[int, int | None] = (0, None)) -> Iterator[tuple[bytes, bool]]:
  """(bytes of whole lines, is_piece); `\r\n`, `\r` and `\n` end lines.

  A line longer than MAX_LINE_BYTES comes in pieces (is_piece) cut at UTF-8
  character boundaries, so no line is ever held whole. The pieces of a line
  are followed by a block that starts with the line's last part.
  """
  start, end = span
  with records.open_bytes(path, start, end, _BLOCK_BYTES) as f:  # decompressed if compressed
    rest = f.read(len(_BOM))
    if rest == _BOM and start == 0:
      rest = b""
    while True:
      block = f.read(_BLOCK_BYTES)
      data = rest + block
      # Only the first line can be long: it continues the last block's rest.
      while len(data) > MAX_LINE_BYTES and _first_line_end(data) > MAX_LINE_BYTES:
        piece = _utf8_prefix(data, MAX_LINE_BYTES)
        data = data[len(piece):]
        yield piece, True
      if not block:
        if data:
          yield data, False
        return
      cut = max(data.rfind(b"\n"), data.rfind(b"\r"))
      if cut == len(data) - 1 and data[cut] == 13:  # "\r" may be half of "\r\n"
        cut = max(data.rfind(b"\n", 0, cut), data.rfind(b"\r", 0, cut))
      if cut < 0:
        rest = data
        continue
      whole, rest = data[:cut], data[cut + 1:]
      if data[cut] == 10 and whole.endswith(b"\r"):
        whole = whole[:-1]
      yield whole, False


def _first_line_end(data: bytes) -> int:
  ends = [i for i in (data.find(b"\n"), data.find(b"\r")) if i >= 0]
  return min(ends) if ends else len(data)


def _utf8_prefix(data: bytes, n: int) -> bytes:
  """data[:n] or a little less, so that no UTF-8 character is cut in two."""
  piece = data[:n]
  back = 0
  while back < 3 and piece[n - 1 - back] & 0xC0 == 0x80:
    back += 1  # continuation bytes: cut before the character they belong to
  lead = piece[n - 1 - back]
  size = 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
  if lead >= 0xC0 and back + 1 < size:  # the character is not complete in the piece
    piece = piece[:n - 1 - back]
  return piece


def _read_lines(path: str, stats: CorpusStats,
                span: tuple[int, int | None] = (0, None)) -> Iterator[tuple[int, list[str], bool]]:
  """(number of the first line, lines, is_piece) per block, repaired and counted.

  Lines come in lists, not one by one: per-line generator steps would cost
  more than reading. A piece of a long line is a list of one, numbered as
  its line; the line's last part starts the next list.
  """
  lineno, noted = 1, 0
  name = _where(path, span)
  for data, is_piece in _blocks(path, span):
    try:
      text = data.decode("utf-8")
    except UnicodeDecodeError as e:
      bad_line = lineno + data.count(b"\n", 0, e.start) + data.count(b"\r", 0, e.start)
      text = data.decode("utf-8", errors="replace")
      n_bad = text.count("\ufffd") - data.count("\ufffd".encode())
      stats.note("invalid_utf8", f"{name} line {bad_line}", max(n_bad, 1))
    if "\r" in text:
      text = text.replace("\r\n", "\n").replace("\r", "\n")
    found = CONTROL_CHARS.search(text)
    if found:
      where = f"{name} line {lineno + text.count(chr(10), 0, found.start())}"
      text, n = CONTROL_CHARS.subn("", text)
      stats.note("control_chars", where, n)
    if is_piece:
      if lineno != noted:
        noted = lineno
        stats.note("long_lines", f"{name} line {lineno}")
      yield lineno, [text], True
    else:
      lines = text.split("\n")
      yield lineno, lines, False
      lineno += len(lines)


def _plain_documents(path: str, stats: CorpusStats,
                     span: tuple[int, int | None]) -> Iterator[list[str]]:
  doc: list[str] = []
  chars = 0
  any_text = False
  name = _where(path, span)
  for first, lines, _ in _read_lines(path, stats, span):
    for lineno, line in enumerate(lines, start=first):
      line = line.strip()
      if line:
        if "  " in line or "\t" in line:
          line = " ".join(line.split())
        if len(doc) >= MAX_DOCUMENT_SENTENCES or chars + len(line) > MAX_DOCUMENT_CHARS and doc:
          stats.note("long_documents", f"{name} line {lineno}")
          yield doc
          doc, chars = [], 0
        doc.append(line)
        chars += len(line)
      elif doc:
        any_text = True
        yield doc
        doc, chars = [], 0
  if doc:
    any_text = True
    yield doc
  if not any_text and span == (0, None):
    raise CorpusError(f"corpus file '{path}' has no text (it is empty or only blank lines); "
                      "expected lines of text")


def _tab_documents(path: str, stats: CorpusStats,
                   span: tuple[int, int | None]) -> Iterator[list[str]]:
  lines_seen = skipped = 0
  first_bad = ""
  long_line = 0  # a line that came in pieces: none of it is used
  name = _where(path, span)
  for first, lines, is_piece in _read_lines(path, stats, span):
    for lineno, line in enumerate(lines, start=first):
      if lineno == long_line or not (is_piece or line.strip()):
        continue
      lines_seen += 1
      halves = [" ".join(h.split()) for h in line.split("\t")]
      if is_piece or len(halves) != 2 or not all(halves):
        long_line = lineno if is_piece else 0
        skipped += 1
        stats.note("tab_lines_skipped", f"{name} line {lineno}")
        first_bad = first_bad or f"line {lineno}: " + (
            "too long" if is_piece else f"{len(halves) - 1} tabs" if len(halves) != 2 else
            "a half is empty")
        continue
      yield halves
  if span != (0, None):  # a part: the whole corpus's counts are checked after the merge
    return
  if not lines_seen:
    raise CorpusError(f"corpus file '{path}' has no text (it is empty or only blank lines); "
                      "expected lines of text")
  if skipped == lines_seen:
    raise CorpusError(
        f"corpus file '{path}' has no 'first half<TAB>second half' line (tab format): all "
        f"{lines_seen} non-blank lines skipped, first {first_bad}; for one sentence per line "
        "use --config.data.format=plain")
