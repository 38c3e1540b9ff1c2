"""Corpora as published (bert_jax/data/records.py): JSONL and Parquet, compressed or not,
found from their content, read as documents, cut into parts, prepared to the same
examples as the same text in plain form; odd shapes repaired and counted, bad input one
line naming the file and the record. The files are made here from the built-in corpus."""

import gzip
import hashlib
import json
import os

import pytest

from bert_jax.data import corpus, dataset, prep_parts, prep_workers
from bert_jax.errors import CorpusError
from bert_jax.settings import DataSettings
from corpus_shapes import (builtin_documents, builtin_texts, compress, jsonl_bytes,
                           write_jsonl, write_parquet, write_plain)

SUFFIXES = ("", ".gz", ".zst", ".bz2", ".xz")


def read(spec, **kw):
  return list(corpus.read_documents(spec, **kw))


def one_line(e) -> str:
  text = str(e.value)
  assert "\n" not in text, text
  return text


@pytest.fixture(scope="module")
def docs():
  return builtin_documents()


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_jsonl_of_any_compression_reads_a_record_a_document(tmp_path, docs, suffix):
  path = write_jsonl(str(tmp_path / "c.jsonl"), builtin_texts(), suffix)
  assert corpus.resolve_format(path, "auto") == "jsonl"
  assert read(path) == docs


def test_parquet_reads_its_text_column_a_row_a_document(tmp_path, docs):
  path = write_parquet(str(tmp_path / "c.parquet"), builtin_texts())
  assert corpus.resolve_format(path, "auto") == "parquet"
  assert read(path) == docs


@pytest.mark.parametrize("suffix", (".gz", ".zst", ".bz2", ".xz"))
def test_compressed_plain_text_reads_as_the_text(tmp_path, docs, suffix):
  plain = write_plain(str(tmp_path / "c.txt"), docs)
  with open(plain, "rb") as f:
    (tmp_path / f"c{suffix}").write_bytes(compress(f.read(), suffix))
  assert read(str(tmp_path / f"c{suffix}")) == read(plain)


def test_compression_and_format_come_from_the_content_not_the_name(tmp_path, docs):
  path = tmp_path / "misnamed.txt"
  path.write_bytes(compress(jsonl_bytes([{"text": t} for t in builtin_texts()]), ".zst"))
  assert corpus.resolve_format(str(path), "auto") == "jsonl" and read(str(path)) == docs


def test_concatenated_gzip_members_are_read_on(tmp_path):
  a, b = jsonl_bytes([{"text": "One."}]), jsonl_bytes([{"text": "Two."}])
  (tmp_path / "c.jsonl.gz").write_bytes(gzip.compress(a) + gzip.compress(b))
  assert read(str(tmp_path / "c.jsonl.gz")) == [["One."], ["Two."]]


def test_a_chosen_field_names_the_text(tmp_path):
  path = write_jsonl(str(tmp_path / "c.jsonl"), ["def f(): pass", "x = 1"], field="content")
  assert read(path, field="content") == [["def f(): pass"], ["x = 1"]]


def test_a_record_of_one_line_is_split_into_sentences_and_code_is_kept(tmp_path):
  path = write_jsonl(str(tmp_path / "c.jsonl"), ["First one. Second one! A third?",
                                                  "for i in range(3):\n    print(i)"])
  assert read(path) == [["First one.", "Second one!", "A third?"],
                        ["for i in range(3):", "print(i)"]]


def test_a_folder_is_its_files_in_order_without_hidden_ones_or_markers(tmp_path, docs):
  texts = builtin_texts()
  write_parquet(str(tmp_path / "b.parquet"), texts[40:])
  write_parquet(str(tmp_path / "a.parquet"), texts[:40])
  (tmp_path / "_SUCCESS").write_text("")
  (tmp_path / ".a.parquet.crc").write_bytes(b"\0\1")
  assert read(str(tmp_path)) == docs


# --- parts: the unit of parallel preparation ---


def test_parquet_parts_are_row_groups_and_read_as_the_whole(tmp_path, monkeypatch, docs):
  path = write_parquet(str(tmp_path / "c.parquet"), builtin_texts(), row_group_size=8)
  monkeypatch.setattr(prep_parts, "PART_BYTES", 30_000)
  parts = prep_parts.plan(path, "parquet", 0)
  # Sized by the text inside: the row groups' uncompressed bytes, not the file's.
  assert sum(p.bytes for p in parts) == prep_parts.work_size(path)
  assert len(parts) >= 4 and prep_parts.work_size(path) > os.path.getsize(path)
  stats = corpus.CorpusStats()
  assert [d for p in parts for d in corpus.read_ranges(p.ranges, "parquet", stats)] == docs


def test_a_compressed_file_is_never_cut_and_a_glob_of_them_is_cut_between_files(
    tmp_path, monkeypatch, docs):
  texts = builtin_texts()
  for i in range(4):
    write_jsonl(str(tmp_path / f"c{i}.jsonl"), texts[i * 20:(i + 1) * 20], ".zst")
  monkeypatch.setattr(prep_parts, "PART_BYTES", 1000)
  parts = prep_parts.plan(str(tmp_path / "*.zst"), "jsonl", 0)
  assert [r for p in parts for r in p.ranges] == [
      (str(tmp_path / f"c{i}.jsonl.zst"), 0, None) for i in range(4)]
  stats = corpus.CorpusStats()
  assert [d for p in parts for d in corpus.read_ranges(p.ranges, "jsonl", stats)] == docs


def test_uncompressed_jsonl_is_cut_at_line_ends(tmp_path, monkeypatch, docs):
  path = write_jsonl(str(tmp_path / "c.jsonl"), builtin_texts())
  monkeypatch.setattr(prep_parts, "PART_BYTES", 30_000)
  parts = prep_parts.plan(path, "jsonl", 0)
  assert len(parts) >= 4
  with open(path, "rb") as f:
    data = f.read()
  assert all(data[p.ranges[0][1] - 1:p.ranges[0][1]] == b"\n" for p in parts[1:])
  stats = corpus.CorpusStats()
  assert [d for p in parts for d in corpus.read_ranges(p.ranges, "jsonl", stats)] == docs


# --- prepared: the same examples as the same text ---


def settings(spec, **kw) -> DataSettings:
  return DataSettings(**{"corpus": spec, "vocab_size": 400, "dupe_factor": 2,
                         "max_eval_examples": 300, **kw})


def examples(directory: str) -> dict[str, str]:
  """sha256 of every prepared file but those that record the input's identity or timing."""
  out = {}
  for root, _, files in os.walk(directory):
    for f in files:
      if f not in ("stats.json", "manifest.json", "settings.json"):
        with open(os.path.join(root, f), "rb") as fh:
          out[os.path.relpath(os.path.join(root, f), directory)] = hashlib.sha256(
              fh.read()).hexdigest()
  return out


def test_parquet_and_zstd_jsonl_prepare_the_examples_of_the_same_plain_text(tmp_path, docs):
  plain = write_plain(str(tmp_path / "c.txt"), docs)
  found = {}
  for spec in (plain, write_parquet(str(tmp_path / "c.parquet"), builtin_texts()),
               write_jsonl(str(tmp_path / "c.jsonl"), builtin_texts(), ".zst")):
    p = dataset.prepare(settings(spec, num_workers=1), [64], str(tmp_path / "cache"), seed=0)
    found[spec] = examples(p.directory)
  assert len({json.dumps(v, sort_keys=True) for v in found.values()}) == 1
  assert any(n.startswith("seq64/train") for n in found[plain])


@pytest.mark.parametrize("make", ["parquet", "zst"])
def test_the_same_bytes_for_1_and_2_workers_over_many_parts(tmp_path, monkeypatch, make):
  texts = builtin_texts()
  if make == "parquet":
    spec = write_parquet(str(tmp_path / "c.parquet"), texts, row_group_size=8)
  else:
    for i in range(4):
      write_jsonl(str(tmp_path / f"c{i}.jsonl"), texts[i * 20:(i + 1) * 20], ".zst")
    spec = str(tmp_path / "*.zst")
  monkeypatch.setattr(prep_parts, "PART_BYTES", 30_000 if make == "parquet" else 1000)
  monkeypatch.setattr(prep_workers, "usable_cores", lambda: 2)
  got = [examples(dataset.prepare(settings(spec, num_workers=w), [64],
                                  str(tmp_path / f"cache{w}"), seed=0).directory)
         for w in (1, 2)]
  assert got[0] == got[1] and sum(n.startswith("seq64/train.") for n in got[0]) >= 4


# --- odd shapes ---


def test_empty_row_groups_are_no_documents(tmp_path):
  import pyarrow as pa
  import pyarrow.parquet as pq
  path = str(tmp_path / "c.parquet")
  with pq.ParquetWriter(path, pa.schema([("text", pa.string())])) as w:
    w.write_table(pa.table({"text": pa.array([], pa.string())}))
    w.write_table(pa.table({"text": ["One. Two."]}))
    w.write_table(pa.table({"text": pa.array([], pa.string())}))
  assert pq.ParquetFile(path).metadata.num_row_groups == 3
  assert read(path) == [["One.", "Two."]]


def test_a_5_megabyte_record_is_cut_into_documents_and_counted(tmp_path):
  text = "\n".join(f"Sentence number {i} of a very long record." for i in range(120_000))
  assert len(text) > 5_000_000
  path = write_jsonl(str(tmp_path / "c.jsonl"), [text], ".zst")
  stats = corpus.CorpusStats()
  got = read(path, stats=stats)
  assert len(got) >= 5 and sum(len(d) for d in got) == 120_000
  assert stats.count("long_documents") == len(got) - 1


def test_a_5_megabyte_record_of_one_line_is_cut_into_sentences_and_counted(tmp_path):
  path = write_parquet(str(tmp_path / "c.parquet"), ["x" * 5_000_000])
  stats = corpus.CorpusStats()
  got = read(path, stats=stats)
  assert "".join(s for d in got for s in d) == "x" * 5_000_000
  assert stats.count("long_lines") == 1


def test_100000_one_word_records_are_100000_documents(tmp_path):
  path = write_jsonl(str(tmp_path / "c.jsonl"), [f"w{i}" for i in range(100_000)], ".gz")
  stats = corpus.CorpusStats()
  assert len(read(path, stats=stats)) == 100_000 and stats.one_sentence_documents == 100_000


@pytest.mark.parametrize("make", ["jsonl", "parquet"])
def test_null_fields_are_skipped_and_counted_naming_the_first(tmp_path, make):
  texts = ["One.", None, "Three.", None]
  path = (write_jsonl(str(tmp_path / "c.jsonl"), texts) if make == "jsonl" else
          write_parquet(str(tmp_path / "c.parquet"), texts))
  stats = corpus.CorpusStats()
  assert read(path, stats=stats) == [["One."], ["Three."]]
  assert stats.count("null_fields") == 2
  assert ("line 2" if make == "jsonl" else "row 2") in stats.warnings()[0]


def test_bytes_that_are_not_utf8_inside_json_strings_are_replaced_and_counted(tmp_path):
  path = tmp_path / "c.jsonl"
  path.write_bytes(b'{"text": "good."}\n{"text": "bad \xff\xfe here."}\n'
                   b'{"text": "lone \\udc80 surrogate."}\n')
  stats = corpus.CorpusStats()
  assert read(str(path), stats=stats) == [["good."], ["bad \ufffd\ufffd here."],
                                          ["lone \ufffd surrogate."]]
  assert stats.count("invalid_utf8") == 3 and "line 2" in stats.warnings()[0]


def test_a_binary_parquet_column_is_read_as_utf8(tmp_path, docs):
  path = write_parquet(str(tmp_path / "c.parquet"), builtin_texts(), binary=True)
  assert read(path) == docs


def test_text_that_spells_special_tokens_prepares_as_ordinary_pieces(tmp_path):
  texts = [f"Document {i} says [CLS] and [MASK] and <|endoftext|> and [SEP] here.\n"
           f"Its second line {i} is plain." for i in range(300)]
  path = write_parquet(str(tmp_path / "c.parquet"), texts)
  for kind in ("wordpiece", "bpe"):
    c = settings(path, tokenizer=kind, vocab_size=300, num_workers=1)
    p = dataset.prepare(c, [64], str(tmp_path / f"cache-{kind}"), seed=0)
    tok, ids = p.tokenizer, p.train[64].read_batch(list(range(len(p.train[64])))).input_ids_BxL
    specials = {tok.cls_id, tok.sep_id, tok.mask_id}
    per_row = [sum(int(i) in specials for i in row) for row in ids]
    assert set(per_row) <= {2, 3}, kind  # [CLS] A [SEP] (B [SEP]): the structure only


# --- bad input: one line naming the file and the record ---


@pytest.mark.parametrize("content,says", [
    (b'{"text": "a."}\n{"txt": "b."}\n', ["line 2", "no field 'text'", "it has: txt"]),
    (b'{"text": "a."}\n{"text": 7}\n', ["line 2", "'text' is a number", "expected a string"]),
    (b'{"text": "a."}\n{"text": "b.", oops}\n', ["line 2", "not JSON"]),
    (b'{"text": "a."}\n["a", "list"]\n', ["line 2", "a list, not a JSON object"]),
    (b'{"text": "a."}\n{"text": "cut sho', ["line 2", "truncated"]),
])
def test_a_bad_record_is_one_line_naming_file_and_line(tmp_path, content, says):
  path = tmp_path / "c.jsonl"
  path.write_bytes(content)
  with pytest.raises(CorpusError) as e:
    read(str(path))
  line = one_line(e)
  assert str(path) in line and all(s in line for s in says), line


@pytest.mark.parametrize("suffix", [".gz", ".zst", ".bz2", ".xz"])
def test_a_truncated_compressed_file_is_one_line_naming_it(tmp_path, suffix):
  whole = compress(jsonl_bytes([{"text": f"Record {i} of many."} for i in range(20_000)]),
                   suffix)
  path = tmp_path / f"c.jsonl{suffix}"
  path.write_bytes(whole[:len(whole) // 2])
  with pytest.raises(CorpusError) as e:
    read(str(path))
  line = one_line(e)
  assert str(path) in line and "truncated" in line, line


def test_a_parquet_file_without_the_column_is_one_line_listing_its_columns(tmp_path):
  path = write_parquet(str(tmp_path / "c.parquet"), ["a."], field="content")
  with pytest.raises(CorpusError) as e:
    read(path)
  assert "no column 'text'" in one_line(e) and "content" in one_line(e) and path in one_line(e)


def test_a_parquet_column_of_numbers_is_one_line(tmp_path):
  path = write_parquet(str(tmp_path / "c.parquet"), ["a."])
  with pytest.raises(CorpusError) as e:
    read(path, field="id")
  assert "column 'id' holds int64; expected strings" in one_line(e)


def test_a_truncated_parquet_file_is_one_line_naming_it(tmp_path):
  path = write_parquet(str(tmp_path / "c.parquet"), builtin_texts())
  with open(path, "rb") as f:
    data = f.read()
  with open(path, "wb") as f:
    f.write(data[:len(data) // 2])
  with pytest.raises(CorpusError) as e:
    read(path)
  assert path in one_line(e) and "cannot be read as Parquet" in one_line(e)


@pytest.mark.parametrize("make", ["jsonl", "parquet", "zst"])
def test_a_file_without_records_is_one_line(tmp_path, make):
  if make == "parquet":
    path = write_parquet(str(tmp_path / "c.parquet"), [])
  else:
    path = str(tmp_path / ("c.jsonl" + (".zst" if make == "zst" else "")))
    with open(path, "wb") as f:
      f.write(compress(b"\n\n", ".zst") if make == "zst" else b"")
  with pytest.raises(CorpusError) as e:
    read(path)
  assert path in one_line(e) and "no" in one_line(e)


def test_a_glob_of_parquet_and_jsonl_is_one_line_naming_the_odd_file(tmp_path):
  write_parquet(str(tmp_path / "a.parquet"), ["One."])
  write_jsonl(str(tmp_path / "b.jsonl"), ["Two."])
  with pytest.raises(CorpusError) as e:
    read(str(tmp_path / "*"))
  assert "b.jsonl" in one_line(e) and "not Parquet" in one_line(e)


def test_a_bad_record_deep_in_a_corpus_leaves_nothing_prepared(tmp_path, monkeypatch):
  texts = builtin_texts()
  for i in range(3):
    write_jsonl(str(tmp_path / f"c{i}.jsonl"), texts[i * 25:(i + 1) * 25], ".gz")
  with gzip.open(tmp_path / "c3.jsonl.gz", "wb") as f:
    f.write(jsonl_bytes([{"text": t} for t in texts[75:]]) + b'{"text": null, "x": [}\n')
  monkeypatch.setattr(prep_parts, "PART_BYTES", 1000)
  cache = tmp_path / "cache"
  with pytest.raises(CorpusError, match="c3.jsonl.gz"):
    dataset.prepare(settings(str(tmp_path / "*.gz"), num_workers=1), [64], str(cache), seed=0)
  assert not cache.exists() or not any(cache.iterdir())
