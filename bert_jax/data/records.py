"""Corpus files as they are published: compressed streams, JSONL records, Parquet rows.

- Compression is found from a file's first bytes, never its name: gzip (1f 8b), zstd
  (28 b5 2f fd), bzip2 ("BZh") and xz (fd "7zXZ" 00). `open_bytes` gives any corpus
  file's bytes, decompressed, as a buffered stream; concatenated members or frames are
  read on, and a stream that ends inside one (a truncated download) is one CorpusError,
  never a short read: the zstd reader checks each frame's end itself, as the library
  does not.
- JSONL: one JSON object per line, its `field` (config.data.field) a document. Parquet:
  its `field` column, read with pyarrow a batch of a row group at a time, so memory
  holds one batch, not the file.
- A record's text is one document: its non-blank lines are its sentences, or, for
  text of one line, the sentence splitter's pieces (`record_documents`). Code and
  tables are kept, unlike the built-in corpus's prose filter: they are what a record is.

What is repaired or skipped is counted in CorpusStats (bert_jax.data.corpus_files): a
null field (skipped), bytes that are not UTF-8 or lone surrogates in JSON strings
(replaced by U+FFFD), control characters (dropped), sentences over 1 MiB (cut) and
documents over 1 MiB (cut into several). Everything else that is not the expected
record is one CorpusError naming the file and the record.
"""

from __future__ import annotations

import bz2
import io
import json
import lzma
import re
import zlib
from collections.abc import Callable, Iterator
from typing import Any

from bert_jax.errors import CorpusError
from bert_jax.storage import fs

COMPRESSIONS = {"gzip": b"\x1f\x8b", "zstd": b"\x28\xb5\x2f\xfd", "bzip2": b"BZh",
                "xz": b"\xfd7zXZ\x00"}
PARQUET_MAGIC = b"PAR1"
# Limits of every format (corpus_files reads text files by them too). A document over 1 MiB
# (a book, a file that is one record) is cut: a part then has documents to split into
# train and eval and to draw NotNext partners from.
MAX_SENTENCE_CHARS = 1 << 20
MAX_DOCUMENT_SENTENCES = 50_000
MAX_DOCUMENT_CHARS = 1 << 20
_CHUNK = 1 << 20
_PARQUET_BATCH = 1024
# Where one sentence ends and the next starts, in prose: also the built-in corpus's rule.
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(\"'])")
# Control characters other than tab/newline (NUL, C1, DEL...): dropped, not fatal.
CONTROL_CHARS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ufeff]")
_SURROGATES = re.compile("[\ud800-\udfff]")
_ODD = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ufeff\ud800-\udfff]")


def head(path: str, n: int = 8) -> bytes:
  with fs.open(path, "rb") as f:
    return f.read(n)


def compression(first_bytes: bytes) -> str | None:
  """'gzip', 'zstd', 'bzip2', 'xz' or None, from a file's first bytes."""
  return next((name for name, magic in COMPRESSIONS.items()
               if first_bytes.startswith(magic)), None)


def is_parquet(path: str) -> bool:
  return head(path, 4) == PARQUET_MAGIC


def open_bytes(path: str, start: int = 0, end: int | None = None,
               buffer: int = _CHUNK) -> io.BufferedReader:
  """The bytes [start, end) of `path`, decompressed if it is compressed (then only the
  whole file: a compressed stream cannot be entered in its middle). What is not asked
  for yet is not read, beyond one `buffer`."""
  raw = fs.open(path, "rb", buffering=0)
  try:
    kind = compression(raw.read(8))
    raw.seek(start)
    if kind is not None:
      if (start, end) != (0, None):
        raise ValueError(f"{path}: a {kind} file is read whole, not from byte {start}")
      return io.BufferedReader(_Decompressed(raw, path, kind), buffer)
    return io.BufferedReader(_Limited(raw, None if end is None else end - start), buffer)
  except BaseException:
    raw.close()
    raise


class _Limited(io.RawIOBase):
  """At most `left` bytes of `raw` (None: all of it)."""

  def __init__(self, raw: Any, left: int | None):
    self.raw, self.left = raw, left

  def readable(self) -> bool:
    return True

  def readinto(self, b) -> int:
    want = len(b) if self.left is None else min(len(b), self.left)
    data = self.raw.read(want) if want else b""
    b[:len(data)] = data
    if self.left is not None:
      self.left -= len(data)
    return len(data)

  def close(self) -> None:
    self.raw.close()
    super().close()


def _decompressor(kind: str) -> Any:
  if kind == "gzip":
    return zlib.decompressobj(wbits=31)
  if kind == "bzip2":
    return bz2.BZ2Decompressor()
  if kind == "xz":
    return lzma.LZMADecompressor()
  import zstandard  # pylint: disable=import-outside-toplevel  (only for .zst corpora)
  return zstandard.ZstdDecompressor().decompressobj()


class _Decompressed(io.RawIOBase):
  """The decompressed bytes of a gzip, bzip2, xz or zstd file: every member (frame) in
  turn; input that ends inside one, or that is not a stream, is a CorpusError."""

  def __init__(self, raw: Any, path: str, kind: str):
    self.raw, self.path, self.kind = raw, path, kind
    self._d = _decompressor(kind)
    self._inside = False  # input given to the current member, which has not ended
    self._out = b""
    self._done = 0  # decompressed bytes returned so far
    self._ended = False

  def readable(self) -> bool:
    return True

  def readinto(self, b) -> int:
    while not self._out and not self._ended:
      self._fill()
    n = min(len(b), len(self._out))
    b[:n] = self._out[:n]
    self._out = self._out[n:]
    self._done += n
    return n

  def _fill(self) -> None:
    chunk = self.raw.read(_CHUNK)
    if not chunk:
      if self._inside:
        self._fail("it ends inside a compressed stream (truncated)")
      self._ended = True
      return
    out = []
    try:
      while chunk:
        out.append(self._d.decompress(chunk))
        self._inside = True
        if not self._d.eof:
          break
        chunk, self._inside = self._d.unused_data, False
        self._d = _decompressor(self.kind)  # for another member, if one follows
        if not chunk.strip(b"\x00"):  # zero padding after the last member is fine
          chunk = b""
    except Exception as e:  # zlib.error, OSError, LZMAError, zstd.ZstdError
      self._fail(f"its data is damaged ({str(e).strip() or type(e).__name__})")
    self._out = b"".join(out)

  def _fail(self, what: str) -> None:
    raise CorpusError(f"corpus file '{self.path}' is {self.kind}-compressed and {what} after "
                      f"{self._done + len(self._out)} decompressed bytes; expected a whole "
                      f"{self.kind} file (copy or download it again)")

  def close(self) -> None:
    self.raw.close()
    super().close()


# --- records -> documents ---


def record_documents(text: str, stats: Any, where: str) -> Iterator[list[str]]:
  """The document(s) of one record's text: its non-blank lines, or the sentences of its
  one line; a document over MAX_DOCUMENT_CHARS or MAX_DOCUMENT_SENTENCES is cut in several."""
  if "\r" in text:  # line ends as in text files: CRLF and CR are line ends
    text = text.replace("\r\n", "\n").replace("\r", "\n")
  if _ODD.search(text):  # one search for both: most records have neither
    if _SURROGATES.search(text):  # "\udc80" in JSON: not text, and not encodable as UTF-8
      text, n = _SURROGATES.subn("\ufffd", text)
      stats.note("invalid_utf8", where, n)
    if CONTROL_CHARS.search(text):
      text, n = CONTROL_CHARS.subn("", text)
      stats.note("control_chars", where, n)
  lines = []
  for line in text.split("\n"):  # as a text file's line: stripped, runs of spaces joined
    line = line.strip()
    if line:
      lines.append(" ".join(line.split()) if "  " in line or "\t" in line else line)
  if len(lines) == 1:
    lines = [s for s in SENTENCE_END.split(lines[0]) if s]
  doc: list[str] = []
  chars = 0
  for line in lines:
    for i in range(0, len(line), MAX_SENTENCE_CHARS):
      if len(line) > MAX_SENTENCE_CHARS and i == 0:
        stats.note("long_lines", where)
      piece = line[i:i + MAX_SENTENCE_CHARS]
      if doc and (len(doc) >= MAX_DOCUMENT_SENTENCES or chars + len(piece) > MAX_DOCUMENT_CHARS):
        stats.note("long_documents", where)
        yield doc
        doc, chars = [], 0
      doc.append(piece)
      chars += len(piece)
  if doc:
    yield doc


def _text_of(value: Any, field: str, where: str, stats: Any) -> str | None:
  """A record's field as text; None for a null (counted, skipped)."""
  if value is None:
    stats.note("null_fields", where)
    return None
  if isinstance(value, bytes):
    try:
      return value.decode("utf-8")
    except UnicodeDecodeError:
      text = value.decode("utf-8", errors="replace")
      stats.note("invalid_utf8", where, max(1, text.count("\ufffd")
                                            - value.count("\ufffd".encode())))
      return text
  if not isinstance(value, str):
    raise CorpusError(f"corpus {where}: field '{field}' is {_kind(value)}; expected a string "
                      "(the record's text)")
  return value


def _kind(value: Any) -> str:
  return {bool: "a boolean", int: "a number", float: "a number", list: "a list",
          dict: "an object"}.get(type(value), f"a {type(value).__name__}")


def jsonl_documents(path: str, field: str, stats: Any, start: int = 0,
                    end: int | None = None) -> Iterator[list[str]]:
  """The documents of a JSONL file (or of its lines in bytes [start, end)): each
  non-blank line one JSON object, whose `field` is a document."""
  name = f"file '{path}'" if start == 0 else f"file '{path}' (from byte {start})"
  any_record = False
  with open_bytes(path, start, end) as f:
    for lineno, raw in enumerate(f, start=1):
      if not raw.strip():
        continue
      any_record = True
      where = f"{name} line {lineno}"
      try:
        line = raw.decode("utf-8")
      except UnicodeDecodeError:
        line = raw.decode("utf-8", errors="replace")
        stats.note("invalid_utf8", where, max(1, line.count("\ufffd")
                                              - raw.count("\ufffd".encode())))
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        cut = " (the file may be truncated)" if not raw.endswith(b"\n") else ""
        raise CorpusError(f"corpus {where}: not JSON ({e.msg} at column {e.colno}){cut}; "
                          "expected one JSON object per line (JSONL)") from None
      if not isinstance(record, dict):
        raise CorpusError(f"corpus {where}: {_kind(record)}, not a JSON object; expected one "
                          "JSON object per line (JSONL)")
      if field not in record:
        keys = ", ".join(sorted(record)[:12]) or "none"
        raise CorpusError(f"corpus {where}: the record has no field '{field}' (it has: {keys}); "
                          "expected --config.data.field to name the text field")
      text = _text_of(record[field], field, where, stats)
      if text is not None:
        yield from record_documents(text, stats, where)
  if not any_record and (start, end) == (0, None):
    raise CorpusError(f"corpus file '{path}' has no records (it is empty or only blank "
                      "lines); expected JSON objects, one per line")


# --- Parquet ---


def parquet_file(path: str) -> Any:
  """The pyarrow ParquetFile of `path` (its footer read and checked), or a CorpusError."""
  import pyarrow  # pylint: disable=import-outside-toplevel  (only for Parquet corpora)
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
  try:
    return pq.ParquetFile(fs.open(path, "rb"))
  except (pyarrow.ArrowException, OSError) as e:
    raise CorpusError(f"corpus file '{path}' starts as Parquet but cannot be read as Parquet "
                      f"({str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__})"
                      "; expected a whole Parquet file (copy it again)") from None


def parquet_column(pf: Any, field: str, path: str) -> None:
  """Checks that `field` is a text column of the file: strings, or bytes (read as UTF-8)."""
  import pyarrow as pa  # pylint: disable=import-outside-toplevel
  schema = pf.schema_arrow
  if schema.get_field_index(field) < 0:
    names = ", ".join(schema.names[:12]) or "none"
    raise CorpusError(f"corpus file '{path}' has no column '{field}' (it has: {names}); "
                      "expected --config.data.field to name the text column")
  kind = schema.field(field).type
  if pa.types.is_dictionary(kind):
    kind = kind.value_type
  text = (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind)
          or pa.types.is_large_binary(kind) or getattr(pa.types, "is_string_view", bool)(kind))
  if not text:
    raise CorpusError(f"corpus file '{path}': column '{field}' holds {kind}; expected strings "
                      "(the records' text)")


def row_group_sizes(path: str) -> list[int]:
  """The uncompressed bytes of each row group of a Parquet file (from its footer)."""
  meta = parquet_file(path).metadata
  return [meta.row_group(g).total_byte_size for g in range(meta.num_row_groups)]


def parquet_documents(path: str, field: str, stats: Any, start: int = 0,
                      end: int | None = None) -> Iterator[list[str]]:
  """The documents of a Parquet file's `field` column, or of its row groups [start, end)."""
  import pyarrow  # pylint: disable=import-outside-toplevel
  pf = parquet_file(path)
  parquet_column(pf, field, path)
  meta = pf.metadata
  end = meta.num_row_groups if end is None else end
  row = sum(meta.row_group(g).num_rows for g in range(start))
  if (start, end) == (0, meta.num_row_groups) and meta.num_rows == 0:
    raise CorpusError(f"corpus file '{path}' has no rows; expected records with a "
                      f"'{field}' column")
  for group in range(start, end):
    try:
      for batch in pf.iter_batches(batch_size=_PARQUET_BATCH, row_groups=[group],
                                   columns=[field]):
        for value in batch.column(0).to_pylist():
          row += 1
          where = f"file '{path}' row {row}"
          text = _text_of(value, field, where, stats)
          if text is not None:
            yield from record_documents(text, stats, where)
    except (pyarrow.ArrowException, OSError) as e:
      raise CorpusError(f"corpus file '{path}': row group {group} cannot be read "
                        f"({str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__})"
                        "; expected a whole Parquet file (copy it again)") from None


Reader = Callable[..., Iterator[list[str]]]
READERS: dict[str, Reader] = {"jsonl": jsonl_documents, "parquet": parquet_documents}
