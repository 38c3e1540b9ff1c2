"""Corpora in their published shapes, written by the tests from the built-in corpus:
JSONL (plain, gzip, zstd, bzip2, xz) and Parquet (pyarrow). Nothing is downloaded."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
from typing import Any, Sequence

from bert_jax.data import corpus

COMPRESS = {"": lambda b: b, ".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress}


def compress(data: bytes, suffix: str) -> bytes:
  if suffix == ".zst":
    import zstandard  # pylint: disable=import-outside-toplevel
    return zstandard.ZstdCompressor().compress(data)
  return COMPRESS[suffix](data)


def builtin_documents() -> list[list[str]]:
  return list(corpus.read_documents(corpus.BUILTIN))


def builtin_texts() -> list[str]:
  """The built-in corpus as records' texts: a document's sentences, a line each."""
  return ["\n".join(d) for d in builtin_documents()]


def jsonl_bytes(records: Sequence[dict[str, Any]]) -> bytes:
  return "".join(json.dumps(r) + "\n" for r in records).encode()


def write_jsonl(path: str, texts: Sequence[Any], suffix: str = "", field: str = "text") -> str:
  """`texts` as records {"id": i, field: text} in `path` + `suffix` (compressed by it)."""
  out = path + suffix
  with open(out, "wb") as f:
    f.write(compress(jsonl_bytes([{"id": i, field: t} for i, t in enumerate(texts)]), suffix))
  return out


def write_parquet(path: str, texts: Sequence[Any], row_group_size: int = 64,
                  field: str = "text", binary: bool = False) -> str:
  import pyarrow as pa  # pylint: disable=import-outside-toplevel
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
  kind = pa.binary() if binary else pa.string()
  values = [t.encode() if binary and isinstance(t, str) else t for t in texts]
  table = pa.table({"id": pa.array(range(len(texts)), pa.int64()),
                    field: pa.array(values, kind)})
  pq.write_table(table, path, row_group_size=row_group_size)
  return path


def write_plain(path: str, documents: Sequence[Sequence[str]]) -> str:
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n\n".join("\n".join(d) for d in documents) + "\n")
  return path


def size(path: str) -> int:
  return os.path.getsize(path)
