"""Raw text -> documents, each a list of sentence strings, streamed.

Sources: the built-in corpus (CPython's pydoc topics), text files (`plain`:
one sentence per line, blank line between documents; `tab`: `A<TAB>B` per
line, each line a two-sentence document), a glob of such files (read in
sorted order), or a TFDS dataset stored as array_record
(`tfds:<name>:<feature>`). Nothing is held but the current document: files
are read in 1 MiB blocks.

Input that cannot be meant as text fails with a one-line CorpusError naming
the file: missing, a directory, a symlink loop, compressed, UTF-16, binary,
empty or only blank lines. Input that is merely odd is repaired and counted
in `CorpusStats`, whose `warnings()` are one line each naming the file and
the first place: bytes that are not UTF-8 (replaced by U+FFFD), control
characters such as NUL (dropped), lines over 1 MiB (cut into pieces, each a
sentence), tab-format lines without exactly one tab or with an empty half
(skipped), documents over 50 000 sentences or 16 MiB (cut into several).
A UTF-8 byte order mark, CRLF and CR line ends are simply accepted.
"""

from __future__ import annotations

import dataclasses
import glob as globlib
import hashlib
import itertools
import os
import re
from collections.abc import Iterator

from bert_jax.errors import ConfigError, CorpusError

BUILTIN = "builtin"
TFDS_PREFIX = "tfds:"
FORMATS = ("auto", "plain", "tab")
_SNIFF_LINES = 1000
_SNIFF_BYTES = 1 << 16
_BLOCK_BYTES = 1 << 20
MAX_LINE_BYTES = 1 << 20
MAX_DOCUMENT_SENTENCES = 50_000
MAX_DOCUMENT_CHARS = 16 << 20
_TFDS_BATCH = 256

# Control characters other than tab/newline (NUL, C1, DEL...): dropped, not fatal.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ufeff]")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(\"'])")
# reST decoration: underlines (`*****`, `=====`) and table borders/rows.
_DECORATION = re.compile(r"^\s*(?:([*=\-~^#+_])\1{2,}|[+|].*[+|])\s*$")
_PROSE_CHARS = frozenset(" .,;:'\"()-?!\u2018\u2019\u201c\u201d")
_GLOB_CHARS = frozenset("*?[")
_BOM = b"\xef\xbb\xbf"
_MAGIC = ((b"\x1f\x8b", "gzip-compressed"), (b"BZh", "bzip2-compressed"),
          (b"\xfd7zXZ\x00", "xz-compressed"), (b"\x28\xb5\x2f\xfd", "zstd-compressed"),
          (b"PK\x03\x04", "a zip archive"), (b"\xff\xfe", "UTF-16/32 (byte order mark)"),
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
}


def read_documents(spec: str, fmt: str = "auto", max_documents: int = 0,
                   tfds_data_dir: str | None = None,
                   stats: CorpusStats | None = None) -> Iterator[list[str]]:
  """Yields documents (lists of non-empty sentences) from `spec`.

  `spec` is 'builtin', a file path, a glob ('wiki/*.txt') or
  'tfds:<name>[:<feature>]' (feature defaults to 'text'). `max_documents` > 0
  stops after that many documents. `stats`, if given, is filled as documents
  are read. Problems with the input raise CorpusError; path/format problems
  are found here, before the first document is asked for.
  """
  if max_documents < 0:
    raise ConfigError(f"data.max_documents must be >= 0, got {max_documents}")
  stats = stats if stats is not None else CorpusStats()
  if spec == BUILTIN:
    docs = _builtin_documents()
  elif spec.startswith(TFDS_PREFIX):
    docs = _tfds_documents(spec, tfds_data_dir)
  else:
    paths = files(spec)
    if fmt not in FORMATS:
      raise ConfigError(f"data.format must be one of {', '.join(FORMATS)}; got {fmt!r}")
    for path in paths:
      _check_file(path)
    fmt = detect_format(paths[0]) if fmt == "auto" else fmt
    docs = itertools.chain.from_iterable(_file_documents(p, fmt, stats) for p in paths)
  docs = _counted(docs, stats)
  return itertools.islice(docs, max_documents) if max_documents else docs


def files(spec: str) -> list[str]:
  """The files a path or glob names: [spec] for a path, sorted matches for a glob."""
  if not _GLOB_CHARS & set(spec):
    return [spec]
  matches = sorted(p for p in globlib.glob(os.path.expanduser(spec), recursive=True)
                   if not os.path.isdir(p))
  if not matches:
    raise CorpusError(f"corpus glob '{spec}' matches no files; expected at least one")
  return matches


def is_files(spec: str) -> bool:
  """True when `spec` names text files (a path or a glob), not builtin or TFDS."""
  return spec != BUILTIN and not spec.startswith(TFDS_PREFIX)


def resolve_format(spec: str, fmt: str) -> str:
  """'plain' or 'tab': `fmt`, or for 'auto' what the (first) file looks like."""
  if fmt not in FORMATS:
    raise ConfigError(f"data.format must be one of {', '.join(FORMATS)}; got {fmt!r}")
  if fmt != "auto":
    return fmt
  return detect_format(files(spec)[0]) if is_files(spec) else "plain"


def detect_format(path: str) -> str:
  """'tab' if each of the first ~1000 non-blank lines has exactly one tab, else 'plain'."""
  _check_file(path)
  lines = itertools.islice((l for _, block, _ in _read_lines(path, CorpusStats())
                            for l in block if l.strip()), _SNIFF_LINES)
  seen = False
  for line in lines:
    seen = True
    if line.count("\t") != 1:
      return "plain"
  return "tab" if seen else "plain"


def split_sentences(text: str, paragraph_sep: str = r"\n\s*\n") -> list[str]:
  """Prose -> sentences: paragraphs split on `paragraph_sep`, then on sentence ends.

  Paragraphs that look like code/grammar/tables (few prose characters) are
  dropped, as are reST underlines; this is a heuristic, kept cheap.
  """
  sentences: list[str] = []
  for para in re.split(paragraph_sep, _CONTROL.sub("", text)):
    lines = [l for l in para.splitlines() if not _DECORATION.match(l)]
    flat = " ".join(" ".join(lines).split())
    if not flat or _looks_like_code(flat):
      continue
    sentences.extend(s for s in _SENTENCE_END.split(flat) if s)
  return sentences


def _looks_like_code(flat: str) -> bool:
  if ">>>" in flat or "::=" in flat:
    return True
  prose = sum(c.isalnum() or c in _PROSE_CHARS for c in flat)
  return prose < 0.9 * len(flat)


def _counted(docs: Iterator[list[str]], stats: CorpusStats) -> Iterator[list[str]]:
  for doc in docs:
    stats.documents += 1
    stats.sentences += len(doc)
    stats.one_sentence_documents += len(doc) == 1
    yield doc


# --- built-in ---


def _builtin_documents() -> Iterator[list[str]]:
  # Ships with CPython, so a first run needs no download and no third-party text.
  from pydoc_data.topics import topics
  for name in sorted(topics):
    sentences = split_sentences(topics[name])
    if sentences:
      yield sentences


def _builtin_fingerprint() -> str:
  # The topics change with the Python version, so hash the text itself.
  from pydoc_data.topics import topics
  h = hashlib.sha256()
  for name in sorted(topics):
    h.update(name.encode())
    h.update(topics[name].encode())
  return h.hexdigest()


def fingerprint(spec: str, tfds_data_dir: str | None = None) -> dict:
  """JSON-able identity of the corpus text, cheap to compute (no full read).

  A file is identified by absolute path, size and mtime (a glob by all its
  files'); the built-in corpus by a hash of its text; a TFDS corpus by its
  spec and data dir.
  """
  if spec == BUILTIN:
    return {"builtin": _builtin_fingerprint()}
  if spec.startswith(TFDS_PREFIX):
    name, feature = parse_tfds_spec(spec)
    return {"tfds": name, "feature": feature, "data_dir": _tfds_data_dir(tfds_data_dir)}
  out = []
  for path in files(spec):
    _check_file(path)
    st = os.stat(path)
    out.append({"file": os.path.abspath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns})
  return out[0] if len(out) == 1 and out[0]["file"] == os.path.abspath(spec) else {
      "glob": spec, "files": out}


# --- files ---


def _check_file(path: str) -> None:
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
    with open(path, "rb") as f:
      head = f.read(_SNIFF_BYTES)
  except OSError as e:
    raise CorpusError(f"corpus file '{path}' cannot be read: {e.strerror or e}") from None
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


def _file_documents(path: str, fmt: str, stats: CorpusStats) -> Iterator[list[str]]:
  return _tab_documents(path, stats) if fmt == "tab" else _plain_documents(path, stats)


def _blocks(path: str) -> Iterator[tuple[bytes, bool]]:
  """(bytes of whole lines, is_piece); `\r\n`, `\r` and `\n` end lines.

  A line longer than MAX_LINE_BYTES comes in pieces (is_piece) cut at UTF-8
  character boundaries, so no line is ever held whole. The pieces of a line
  are followed by a block that starts with the line's last part.
  """
  with open(path, "rb", buffering=0) as f:  # blocks are big; no second buffer
    rest = f.read(len(_BOM))
    if rest == _BOM:
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


def _read_lines(path: str, stats: CorpusStats) -> Iterator[tuple[int, list[str], bool]]:
  """(number of the first line, lines, is_piece) per block, repaired and counted.

  Lines come in lists, not one by one: per-line generator steps would cost
  more than reading. A piece of a long line is a list of one, numbered as
  its line; the line's last part starts the next list.
  """
  lineno, noted = 1, 0
  for data, is_piece in _blocks(path):
    try:
      text = data.decode("utf-8")
    except UnicodeDecodeError as e:
      bad_line = lineno + data.count(b"\n", 0, e.start) + data.count(b"\r", 0, e.start)
      text = data.decode("utf-8", errors="replace")
      n_bad = text.count("\ufffd") - data.count("\ufffd".encode())
      stats.note("invalid_utf8", f"'{path}' line {bad_line}", max(n_bad, 1))
    if "\r" in text:
      text = text.replace("\r\n", "\n").replace("\r", "\n")
    found = _CONTROL.search(text)
    if found:
      where = f"'{path}' line {lineno + text.count(chr(10), 0, found.start())}"
      text, n = _CONTROL.subn("", text)
      stats.note("control_chars", where, n)
    if is_piece:
      if lineno != noted:
        noted = lineno
        stats.note("long_lines", f"'{path}' line {lineno}")
      yield lineno, [text], True
    else:
      lines = text.split("\n")
      yield lineno, lines, False
      lineno += len(lines)


def _plain_documents(path: str, stats: CorpusStats) -> Iterator[list[str]]:
  doc: list[str] = []
  chars = 0
  any_text = False
  for first, lines, _ in _read_lines(path, stats):
    for lineno, line in enumerate(lines, start=first):
      line = line.strip()
      if line:
        if "  " in line or "\t" in line:
          line = " ".join(line.split())
        if len(doc) >= MAX_DOCUMENT_SENTENCES or chars + len(line) > MAX_DOCUMENT_CHARS and doc:
          stats.note("long_documents", f"'{path}' line {lineno}")
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
  if not any_text:
    raise CorpusError(f"corpus file '{path}' has no text (it is empty or only blank lines); "
                      "expected lines of text")


def _tab_documents(path: str, stats: CorpusStats) -> Iterator[list[str]]:
  lines_seen = skipped = 0
  first_bad = ""
  long_line = 0  # a line that came in pieces: none of it is used
  for first, lines, is_piece in _read_lines(path, stats):
    for lineno, line in enumerate(lines, start=first):
      if lineno == long_line or not (is_piece or line.strip()):
        continue
      lines_seen += 1
      halves = [" ".join(h.split()) for h in line.split("\t")]
      if is_piece or len(halves) != 2 or not all(halves):
        long_line = lineno if is_piece else 0
        skipped += 1
        stats.note("tab_lines_skipped", f"'{path}' line {lineno}")
        first_bad = first_bad or f"line {lineno}: " + (
            "too long" if is_piece else f"{len(halves) - 1} tabs" if len(halves) != 2 else
            "a half is empty")
        continue
      yield halves
  if not lines_seen:
    raise CorpusError(f"corpus file '{path}' has no text (it is empty or only blank lines); "
                      "expected lines of text")
  if skipped == lines_seen:
    raise CorpusError(
        f"corpus file '{path}' has no 'first half<TAB>second half' line (tab format): all "
        f"{lines_seen} non-blank lines skipped, first {first_bad}; for one sentence per line "
        "use --config.data.format=plain")


# --- TFDS ---


def parse_tfds_spec(spec: str) -> tuple[str, str]:
  """'tfds:<name>[:<feature>]' -> (name, feature); the feature defaults to 'text'."""
  rest = spec[len(TFDS_PREFIX):]
  name, _, feature = rest.rpartition(":")
  if not name:
    name, feature = rest, "text"
  if not name or not feature:
    raise CorpusError(f"corpus {spec!r}: expected 'tfds:<name>:<feature>'")
  return name, feature


def _tfds_documents(spec: str, data_dir: str | None) -> Iterator[list[str]]:
  name, feature = parse_tfds_spec(spec)
  source = _open_tfds(name, data_dir)
  if len(source) == 0:
    raise CorpusError(f"TFDS dataset '{name}' has no examples in its 'train' split")
  first = source[0]
  if feature not in first:
    raise CorpusError(f"TFDS dataset '{name}' has no feature '{feature}' "
                      f"(it has: {', '.join(sorted(first))})")
  return _tfds_iter(source, feature)


def _tfds_data_dir(data_dir: str | None) -> str:
  # Resolved here, not by TFDS (which reads TFDS_DATA_DIR once, at import).
  return os.path.abspath(os.path.expanduser(
      data_dir or os.environ.get("TFDS_DATA_DIR") or "~/tensorflow_datasets"))


def _open_tfds(name: str, data_dir: str | None):
  import tensorflow_datasets as tfds
  from tensorflow_datasets.core import registered
  data_dir = where = _tfds_data_dir(data_dir)
  try:
    # download=False: a missing dataset must fail fast here, not start a
    # multi-hour download-and-build; users prepare it once with `tfds build`.
    return tfds.data_source(name, split="train", data_dir=data_dir, download=False)
  except registered.DatasetNotFoundError:
    raise CorpusError(
        f"unknown TFDS dataset '{name}': not registered and not prepared in {where} "
        f"(prepare it with `tfds build {name} --file_format=array_record`)") from None
  except (ValueError, AssertionError, OSError, NotImplementedError) as e:
    detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise CorpusError(
        f"TFDS dataset '{name}' in {where} cannot be read as array_record "
        f"(build it with `tfds build {name} --file_format=array_record`): {detail}") from None


def _tfds_iter(source, feature: str) -> Iterator[list[str]]:
  getitems = getattr(source, "__getitems__", None)
  for start in range(0, len(source), _TFDS_BATCH):
    indices = list(range(start, min(start + _TFDS_BATCH, len(source))))
    # Many records per call: one TFDS decode per example is slow on big corpora.
    records = getitems(indices) if getitems else [source[i] for i in indices]
    for record in records:
      text = record[feature]
      if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
      # Wikipedia-style text: one paragraph per line.
      sentences = split_sentences(str(text), paragraph_sep=r"\n")
      if sentences:
        yield sentences
