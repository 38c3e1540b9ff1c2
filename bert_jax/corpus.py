"""Raw text -> documents, each a list of sentence strings.

Sources: the built-in corpus (CPython's pydoc topics), a text file (`plain`:
one sentence per line, blank line between documents; `tab`: `A<TAB>B` per
line, each line a two-sentence document) or a TFDS dataset stored as
array_record (`tfds:<name>:<feature>`). Files are streamed line by line.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
from collections.abc import Iterable, Iterator

from bert_jax.errors import ConfigError, CorpusError

BUILTIN = "builtin"
TFDS_PREFIX = "tfds:"
FORMATS = ("auto", "plain", "tab")
_SNIFF_LINES = 1000

# Control characters other than tab/newline (NUL, C1, DEL...): dropped, not fatal.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ufeff]")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(\"'])")
# reST decoration: underlines (`*****`, `=====`) and table borders/rows.
_DECORATION = re.compile(r"^\s*(?:([*=\-~^#+_])\1{2,}|[+|].*[+|])\s*$")
_PROSE_CHARS = frozenset(" .,;:'\"()-?!\u2018\u2019\u201c\u201d")


def read_documents(spec: str, fmt: str = "auto", max_documents: int = 0,
                   tfds_data_dir: str | None = None) -> Iterator[list[str]]:
  """Yields documents (lists of non-empty sentences) from `spec`.

  `spec` is 'builtin', a file path or 'tfds:<name>[:<feature>]' (feature
  defaults to 'text'). `max_documents` > 0 stops after that many documents.
  Problems with the input raise CorpusError; path/format problems are found
  here, before the first document is asked for.
  """
  if max_documents < 0:
    raise ConfigError(f"data.max_documents must be >= 0, got {max_documents}")
  if spec == BUILTIN:
    docs = _builtin_documents()
  elif spec.startswith(TFDS_PREFIX):
    docs = _tfds_documents(spec, tfds_data_dir)
  else:
    docs = _file_documents(spec, fmt)
  return itertools.islice(docs, max_documents) if max_documents else docs


def detect_format(path: str) -> str:
  """'tab' if each of the first ~1000 non-blank lines has exactly one tab, else 'plain'."""
  _check_file(path)
  lines = itertools.islice((l for _, l in _read_lines(path) if l.strip()), _SNIFF_LINES)
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

  A file is identified by absolute path, size and mtime; the built-in corpus
  by a hash of its text; a TFDS corpus by its spec and data dir.
  """
  if spec == BUILTIN:
    return {"builtin": _builtin_fingerprint()}
  if spec.startswith(TFDS_PREFIX):
    name, feature = parse_tfds_spec(spec)
    return {"tfds": name, "feature": feature, "data_dir": _tfds_data_dir(tfds_data_dir)}
  _check_file(spec)
  st = os.stat(spec)
  return {"file": os.path.abspath(spec), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


# --- files ---


def _check_file(path: str) -> None:
  if not os.path.exists(path):
    raise CorpusError(f"corpus file '{path}' does not exist")
  if os.path.isdir(path):
    raise CorpusError(f"corpus file '{path}' is a directory; expected a text file")


def _file_documents(path: str, fmt: str) -> Iterator[list[str]]:
  if fmt not in FORMATS:
    raise ConfigError(f"data.format must be one of {', '.join(FORMATS)}; got {fmt!r}")
  _check_file(path)
  if fmt == "auto":
    fmt = detect_format(path)
  return _tab_documents(path) if fmt == "tab" else _plain_documents(path)


def _read_lines(path: str) -> Iterator[tuple[int, str]]:
  """(line number, text) with newline and control characters removed; strict UTF-8."""
  offset = 0
  with open(path, "rb") as f:
    for lineno, raw in enumerate(f, start=1):
      try:
        line = raw.decode("utf-8")
      except UnicodeDecodeError as e:
        raise CorpusError(
            f"corpus file '{path}' is not UTF-8: byte 0x{raw[e.start]:02x} at line {lineno} "
            f"(byte offset {offset + e.start})") from None
      offset += len(raw)
      yield lineno, _CONTROL.sub("", line.rstrip("\r\n"))


def _plain_documents(path: str) -> Iterator[list[str]]:
  doc: list[str] = []
  any_text = False
  for _, line in _read_lines(path):
    line = " ".join(line.split())
    if line:
      doc.append(line)
    elif doc:
      any_text = True
      yield doc
      doc = []
  if doc:
    any_text = True
    yield doc
  if not any_text:
    raise CorpusError(f"corpus file '{path}' has no text (only blank lines or empty)")


def _tab_documents(path: str) -> Iterator[list[str]]:
  any_text = False
  for lineno, line in _read_lines(path):
    if not line.strip():
      continue
    halves = [" ".join(h.split()) for h in line.split("\t")]
    if len(halves) != 2:
      raise CorpusError(
          f"corpus file '{path}' line {lineno}: expected 'first half<TAB>second half' "
          f"(tab format), found {len(halves) - 1} tabs")
    if not all(halves):
      raise CorpusError(f"corpus file '{path}' line {lineno}: a half of 'A<TAB>B' is empty")
    any_text = True
    yield halves
  if not any_text:
    raise CorpusError(f"corpus file '{path}' has no text (only blank lines or empty)")


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


def _tfds_iter(source, feature: str) -> Iterable[list[str]]:
  for i in range(len(source)):
    text = source[i][feature]
    if isinstance(text, bytes):
      text = text.decode("utf-8", errors="replace")
    # Wikipedia-style text: one paragraph per line.
    sentences = split_sentences(str(text), paragraph_sep=r"\n")
    if sentences:
      yield sentences
