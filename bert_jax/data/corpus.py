"""Raw text -> documents, each a list of sentence strings, streamed.

Sources: the built-in corpus (CPython's pydoc topics), text files (`plain`:
one sentence per line, blank line between documents; `tab`: `A<TAB>B` per
line, each line a two-sentence document), a glob of such files (read in
sorted order), or a TFDS dataset stored as array_record
(`tfds:<name>:<feature>`). Nothing is held but the current document: files
are read in 1 MiB blocks.

Reading text files (the checks, the repair of odd input counted in
`CorpusStats`, plain and tab parsing) is bert_jax.data.corpus_files; this module
owns the sources: which files a spec names, the built-in corpus, TFDS, and
splitting prose into sentences.
"""

from __future__ import annotations

import glob as globlib
import hashlib
import itertools
import os
import re
from collections.abc import Iterator, Sequence
from pydoc_data.topics import topics

from bert_jax.data import records
from bert_jax.data.corpus_files import (CONTROL_CHARS, CorpusStats, check_file, detect_format,
                                   file_documents)
from bert_jax.errors import ConfigError, CorpusError
from bert_jax.settings.data import FORMATS
from bert_jax.storage import fs

BUILTIN = "builtin"
TFDS_PREFIX = "tfds:"
_TFDS_BATCH = 256

# reST decoration: underlines (`*****`, `=====`) and table borders/rows.
_DECORATION = re.compile(r"^\s*(?:([*=\-~^#+_])\1{2,}|[+|].*[+|])\s*$")
_PROSE_CHARS = frozenset(" .,;:'\"()-?!\u2018\u2019\u201c\u201d")
_GLOB_CHARS = frozenset("*?[")


def read_documents(spec: str, fmt: str = "auto", max_documents: int = 0,
                   tfds_data_dir: str | None = None,
                   stats: CorpusStats | None = None, field: str = "text") -> Iterator[list[str]]:
  """Yields documents (lists of non-empty sentences) from `spec`.

  `spec` is 'builtin', a file path, a folder (its files), a glob ('wiki/*.txt') or
  'tfds:<name>[:<feature>]' (feature defaults to 'text'). Files are text (plain or tab),
  JSONL or Parquet (`field`: the records' text), any of them compressed. `max_documents` > 0
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
      check_file(path)
    fmt = detect_format(paths[0]) if fmt == "auto" else fmt
    docs = itertools.chain.from_iterable(file_documents(p, fmt, stats, field=field)
                                         for p in paths)
  docs = _counted(docs, stats)
  return itertools.islice(docs, max_documents) if max_documents else docs


def read_ranges(ranges: Sequence[tuple[str, int, int | None]], fmt: str,
                stats: CorpusStats, field: str = "text") -> Iterator[list[str]]:
  """The documents of ranges (path, start, end or None = to the end: bytes, or a Parquet
  file's row groups) of files already checked, in order: one part of a corpus (see
  `prep_parts`). `fmt` is resolved."""
  docs = itertools.chain.from_iterable(file_documents(p, fmt, stats, start, end, field)
                                       for p, start, end in ranges)
  return _counted(docs, stats)


def files(spec: str) -> list[str]:
  """The files a path, folder or glob names: [spec] for a file; for a folder, every file
  under it but hidden ones and markers ('.x', '_SUCCESS'); sorted matches for a glob."""
  if not _GLOB_CHARS & set(spec):
    if os.path.isdir(spec):
      found = [p for p in fs.find(spec) if not any(
          n.startswith((".", "_")) for n in os.path.relpath(p, spec).split(os.sep))]
      if not found:
        raise CorpusError(f"corpus folder '{spec}' holds no files; expected text, JSONL or "
                          "Parquet files")
      return found
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
  """'plain', 'tab', 'jsonl' or 'parquet': `fmt`, or for 'auto' what the (first) file
  looks like."""
  if fmt not in FORMATS:
    raise ConfigError(f"data.format must be one of {', '.join(FORMATS)}; got {fmt!r}")
  if fmt != "auto":
    return fmt
  return detect_format(files(spec)[0]) if is_files(spec) else "plain"


def split_sentences(text: str, paragraph_sep: str = r"\n\s*\n") -> list[str]:
  """Prose -> sentences: paragraphs split on `paragraph_sep`, then on sentence ends.

  Paragraphs that look like code/grammar/tables (few prose characters) are
  dropped, as are reST underlines; this is a heuristic, kept cheap.
  """
  sentences: list[str] = []
  for para in re.split(paragraph_sep, CONTROL_CHARS.sub("", text)):
    lines = [l for l in para.splitlines() if not _DECORATION.match(l)]
    flat = " ".join(" ".join(lines).split())
    if not flat or _looks_like_code(flat):
      continue
    sentences.extend(s for s in records.SENTENCE_END.split(flat) if s)
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
  for name in sorted(topics):
    sentences = split_sentences(topics[name])
    if sentences:
      yield sentences


def _builtin_fingerprint() -> str:
  # The topics change with the Python version, so hash the text itself.
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
    check_file(path)
    st = os.stat(path)
    out.append({"file": os.path.abspath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns})
  return out[0] if len(out) == 1 and out[0]["file"] == os.path.abspath(spec) else {
      "glob": spec, "files": out}


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


def _tfds_documents(spec: str, data_dir: str | None, start: int = 0,
                    end: int | None = None) -> Iterator[list[str]]:
  name, feature = parse_tfds_spec(spec)
  source = _open_tfds(name, data_dir)
  if len(source) == 0:
    raise CorpusError(f"TFDS dataset '{name}' has no examples in its 'train' split")
  first = source[0]
  if feature not in first:
    raise CorpusError(f"TFDS dataset '{name}' has no feature '{feature}' "
                      f"(it has: {', '.join(sorted(first))})")
  return _tfds_iter(source, feature, start, len(source) if end is None else end)


def tfds_size(spec: str, tfds_data_dir: str | None = None) -> int:
  """Examples in the 'train' split of a `tfds:` corpus."""
  return len(_open_tfds(parse_tfds_spec(spec)[0], tfds_data_dir))


def read_tfds_range(spec: str, start: int, end: int, stats: CorpusStats,
                    tfds_data_dir: str | None = None) -> Iterator[list[str]]:
  """The documents of examples [start, end) of a `tfds:` corpus: one part of it."""
  return _counted(_tfds_documents(spec, tfds_data_dir, start, end), stats)


def _tfds_data_dir(data_dir: str | None) -> str:
  # Resolved here, not by TFDS (which reads TFDS_DATA_DIR once, at import).
  return os.path.abspath(os.path.expanduser(
      data_dir or os.environ.get("TFDS_DATA_DIR") or "~/tensorflow_datasets"))


def _open_tfds(name: str, data_dir: str | None):
  import tensorflow_datasets as tfds  # heavy (imports TensorFlow): only for tfds: corpora
  from tensorflow_datasets.core import registered  # as heavy, as rarely needed
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


def _tfds_iter(source, feature: str, first: int, end: int) -> Iterator[list[str]]:
  getitems = getattr(source, "__getitems__", None)
  for start in range(first, end, _TFDS_BATCH):
    indices = list(range(start, min(start + _TFDS_BATCH, end)))
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
