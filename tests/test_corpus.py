"""Corpus reading: formats, the built-in and TFDS sources, and every input error."""

import os

import pytest

from bert_jax.data import corpus, corpus_files
from bert_jax.errors import ConfigError, CorpusError

SHIPPED = os.path.join(os.path.dirname(__file__), os.pardir, "data", "corpus.txt")


def write(tmp_path, content, name="corpus.txt"):
  path = tmp_path / name
  if isinstance(content, str):
    content = content.encode("utf-8")
  path.write_bytes(content)
  return str(path)


def read(spec, **kwargs):
  return list(corpus.read_documents(spec, **kwargs))


# --- formats ---


def test_plain_format_splits_documents_on_blank_lines(tmp_path):
  path = write(tmp_path, "one.\ntwo.\n\n\n\nthree.\n  \nfour.\nfive.\n")
  assert read(path, fmt="plain") == [["one.", "two."], ["three."], ["four.", "five."]]


def test_tab_format_makes_each_line_a_two_sentence_document(tmp_path):
  path = write(tmp_path, "the cat sat\ton the mat\n\na dog\tran  away\n")
  assert read(path, fmt="tab") == [["the cat sat", "on the mat"], ["a dog", "ran away"]]


def test_auto_detects_tab_when_every_line_has_one_tab(tmp_path):
  path = write(tmp_path, "a b\tc d\ne f\tg h\n")
  assert corpus.detect_format(path) == "tab"
  assert read(path) == [["a b", "c d"], ["e f", "g h"]]


def test_auto_detects_plain_when_a_line_has_no_tab(tmp_path):
  path = write(tmp_path, "a b\tc d\nno tab here\n")
  assert corpus.detect_format(path) == "plain"
  assert read(path) == [["a b c d", "no tab here"]]


def test_shipped_corpus_is_tab_format_with_enough_lines():
  assert corpus.detect_format(SHIPPED) == "tab"
  docs = read(SHIPPED)
  assert 60 <= len(docs) <= 100
  assert all(len(d) == 2 and all(d) for d in docs)


def test_control_characters_are_dropped_and_counted(tmp_path):
  path = write(tmp_path, "he\x00llo\x07 world.\r\nnext\x1b line.\n")
  stats = corpus.CorpusStats()
  assert read(path, fmt="plain", stats=stats) == [["hello world.", "next line."]]
  assert stats.count("control_chars") == 3
  assert_one_line_naming(stats.warnings(), path, "line 1")


def test_max_documents_caps_the_documents(tmp_path):
  path = write(tmp_path, "".join(f"line {i}\tmore {i}\n" for i in range(10)))
  assert len(read(path, max_documents=3)) == 3


def test_file_is_read_in_blocks_not_whole(tmp_path, monkeypatch):
  monkeypatch.setattr(corpus_files, "_BLOCK_BYTES", 64)
  path = write(tmp_path, "first doc.\n\n" + "".join(f"line {i}.\n" for i in range(100)))
  docs = corpus.read_documents(path, fmt="plain")
  assert next(docs) == ["first doc."]
  with open(path, "r+b") as f:  # what the reader has not reached yet is not read
    f.truncate(100)
  assert len(next(docs)) < 20


# --- built-in ---


def test_builtin_yields_topics_as_documents_of_sentences():
  docs = read("builtin")
  assert len(docs) >= 50
  sentences = [s for d in docs for s in d]
  assert all(s.strip() == s and s for s in sentences)
  assert sum(len(s) for s in sentences) > 200_000


def test_builtin_drops_rest_decoration_and_code():
  text = " ".join(s for d in read("builtin") for s in d)
  assert "*****" not in text and "=====" not in text and ">>>" not in text


def test_split_sentences_splits_paragraphs_and_sentence_ends():
  text = "First one. Second one!\nstill second?  Third (yes).\n\nNew para\n===="
  assert corpus.split_sentences(text) == [
      "First one.", "Second one! still second?", "Third (yes).", "New para"]


# --- errors: one line, naming the file ---


def assert_names_file(error, path):
  message = str(error.value)
  assert path in message and "\n" not in message


def assert_one_line_naming(warnings, path, where):
  assert len(warnings) == 1
  assert path in warnings[0] and where in warnings[0] and "\n" not in warnings[0]


def test_missing_file_raises_naming_it(tmp_path):
  path = str(tmp_path / "missing.txt")
  with pytest.raises(CorpusError, match="does not exist") as e:
    corpus.read_documents(path)
  assert_names_file(e, path)


def test_a_folder_without_files_raises_naming_it(tmp_path):
  (tmp_path / "sub").mkdir()
  (tmp_path / "sub" / "_SUCCESS").write_text("")  # a marker, not a corpus file
  with pytest.raises(CorpusError, match="holds no files") as e:
    corpus.read_documents(str(tmp_path / "sub"))
  assert_names_file(e, str(tmp_path / "sub"))


@pytest.mark.parametrize("content", ["", "\n\n  \n\t\n"], ids=["empty", "blank_lines"])
@pytest.mark.parametrize("fmt", ["auto", "plain", "tab"])
def test_file_without_text_raises_naming_it(tmp_path, content, fmt):
  path = write(tmp_path, content)
  with pytest.raises(CorpusError, match="has no text") as e:
    read(path, fmt=fmt)
  assert_names_file(e, path)


def test_bytes_that_are_not_utf8_are_replaced_and_counted(tmp_path):
  path = write(tmp_path, b"good line.\nbad \xc3\x28 here \xff.\n")
  stats = corpus.CorpusStats()
  assert read(path, fmt="plain", stats=stats) == [["good line.", "bad \ufffd( here \ufffd."]]
  assert stats.count("invalid_utf8") == 2
  assert_one_line_naming(stats.warnings(), path, "line 2")


@pytest.mark.parametrize("head,what", [
    (b"\x1f\x8b\x08\x00", "gzip"), (b"PK\x03\x04", "zip"),
    ("a line of text.\n".encode("utf-16"), "UTF-16"),
    (bytes(range(256)) * 40, "not look like UTF-8")])
def test_compressed_utf16_or_binary_file_raises_naming_it(tmp_path, head, what):
  path = write(tmp_path, head + b"\x00" * 100)
  with pytest.raises(CorpusError, match=what) as e:
    corpus.read_documents(path)
  assert_names_file(e, path)


def test_utf8_byte_order_mark_crlf_and_cr_line_ends_are_accepted(tmp_path):
  expected = [["one.", "two."], ["three."]]
  for i, content in enumerate([b"\xef\xbb\xbfone.\r\ntwo.\r\n\r\nthree.\r\n",
                               b"one.\rtwo.\r\rthree.\r"]):
    stats = corpus.CorpusStats()
    assert read(write(tmp_path, content, f"c{i}.txt"), stats=stats) == expected
    assert stats.warnings() == []


def test_crlf_split_across_read_blocks_is_one_line_end(tmp_path, monkeypatch):
  monkeypatch.setattr(corpus_files, "_BLOCK_BYTES", 5)
  path = write(tmp_path, b"abcd\r\nefgh\r\nij\r\n\r\nkl\r\n")
  assert read(path, fmt="plain") == [["abcd", "efgh", "ij"], ["kl"]]


def test_a_10_megabyte_line_is_cut_into_pieces_and_counted(tmp_path):
  words = ("word " * 2_000_000).encode()  # 10 MB, one line
  path = write(tmp_path, b"short.\n" + words + "\u00e9 end.\n".encode() + b"\nnext doc.\n")
  stats = corpus.CorpusStats()
  docs = read(path, fmt="plain", stats=stats)
  # Each 1 MiB piece is a sentence, and a document of its own (documents are cut at 1 MiB).
  assert docs[0] == ["short."] and docs[-1] == ["next doc."]
  assert all(len(d) == 1 for d in docs[1:-1])
  pieces = [d[0] for d in docs[1:-1]]
  assert len(pieces) == 10 and max(len(p.encode()) for p in pieces) <= corpus_files.MAX_LINE_BYTES
  assert pieces[-1].endswith("\u00e9 end.") and stats.count("invalid_utf8") == 0
  assert stats.count("long_lines") == 1
  long_lines = [w for w in stats.warnings() if "cut into pieces" in w]
  assert_one_line_naming(long_lines, path, "line 2")


def test_tab_line_without_exactly_one_tab_is_skipped_and_counted(tmp_path):
  path = write(tmp_path, "a\tb\n\nc\td\te\nno tab\nf\tg\n")
  stats = corpus.CorpusStats()
  assert read(path, fmt="tab", stats=stats) == [["a", "b"], ["f", "g"]]
  assert stats.count("tab_lines_skipped") == 2
  assert_one_line_naming(stats.warnings(), path, "line 3")


def test_tab_line_with_an_empty_half_is_skipped_and_counted(tmp_path):
  path = write(tmp_path, "a\tb\nc\t  \nd\te\n")
  stats = corpus.CorpusStats()
  assert read(path, fmt="tab", stats=stats) == [["a", "b"], ["d", "e"]]
  assert_one_line_naming(stats.warnings(), path, "line 2")


def test_tab_line_over_the_line_limit_is_skipped_whole(tmp_path):
  path = write(tmp_path, "a\tb\n" + "x" * (2 * corpus_files.MAX_LINE_BYTES + 5) + "\ty\nc\td\n")
  stats = corpus.CorpusStats()
  assert read(path, fmt="tab", stats=stats) == [["a", "b"], ["c", "d"]]
  assert stats.count("tab_lines_skipped") == 1


def test_tab_format_without_any_tab_line_raises_naming_file_and_first_line(tmp_path):
  path = write(tmp_path, "one sentence.\nanother one.\n")
  with pytest.raises(CorpusError, match="no 'first half<TAB>second half' line.*line 1") as e:
    read(path, fmt="tab")
  assert_names_file(e, path)


def test_a_huge_document_is_cut_into_several_and_counted(tmp_path, monkeypatch):
  monkeypatch.setattr(corpus_files, "MAX_DOCUMENT_SENTENCES", 3)
  path = write(tmp_path, "".join(f"s{i}.\n" for i in range(7)) + "\nother.\n")
  stats = corpus.CorpusStats()
  assert [len(d) for d in read(path, fmt="plain", stats=stats)] == [3, 3, 1, 1]
  assert stats.count("long_documents") == 2
  assert_one_line_naming(stats.warnings(), path, "line 4")


def test_stats_count_documents_sentences_and_one_sentence_documents(tmp_path):
  path = write(tmp_path, "a.\nb.\n\nc.\n\nd.\n")
  stats = corpus.CorpusStats()
  read(path, fmt="plain", stats=stats)
  assert (stats.documents, stats.sentences, stats.one_sentence_documents) == (3, 4, 2)


def test_symlink_loop_raises_naming_it(tmp_path):
  loop = tmp_path / "loop.txt"
  os.symlink(loop, loop)
  with pytest.raises(CorpusError, match="symlink") as e:
    corpus.read_documents(str(loop))
  assert_names_file(e, str(loop))


def test_a_pipe_raises_naming_it(tmp_path):
  fifo = str(tmp_path / "fifo")
  os.mkfifo(fifo)
  with pytest.raises(CorpusError, match="not a regular file") as e:
    corpus.read_documents(fifo)
  assert_names_file(e, fifo)


def test_glob_reads_matching_files_in_sorted_order(tmp_path):
  write(tmp_path, "b1.\n\nb2.\n", "b.txt")
  write(tmp_path, "a1.\n", "a.txt")
  write(tmp_path, "ignored.\n", "c.md")
  assert read(str(tmp_path / "*.txt")) == [["a1."], ["b1."], ["b2."]]


def test_glob_matching_nothing_raises_naming_it(tmp_path):
  spec = str(tmp_path / "*.txt")
  with pytest.raises(CorpusError, match="matches no files") as e:
    corpus.read_documents(spec)
  assert_names_file(e, spec)


def test_unknown_format_is_a_config_error(tmp_path):
  with pytest.raises(ConfigError, match="data.format"):
    corpus.read_documents(write(tmp_path, "a\n"), fmt="csv")


# --- TFDS ---


def build_toy_tfds(data_dir, n: int = 3):
  """A tiny array_record TFDS dataset (`n` articles) with a wikipedia-like `text` feature."""
  import tensorflow_datasets as tfds

  class ToyWiki(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    VERSION = tfds.core.Version("1.0.0")

    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls):
      return None

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
          {"text": tfds.features.Text(), "title": tfds.features.Text()}),
                                   disable_shuffling=True)

    def _split_generators(self, dl_manager):
      return {"train": self._generate_examples()}

    def _generate_examples(self):
      for i in range(n):
        yield i, {"title": f"t{i}",
                  "text": f"Article {i} starts. It goes on!\nA second paragraph {i}."}

  builder = ToyWiki(data_dir=str(data_dir), file_format="array_record")
  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
      compute_stats=tfds.download.ComputeStatsMode.SKIP))
  return builder.name


@pytest.fixture(scope="module")
def toy_tfds(tmp_path_factory):
  data_dir = tmp_path_factory.mktemp("tfds")
  return build_toy_tfds(data_dir), str(data_dir)


def test_tfds_corpus_splits_text_into_paragraph_sentences(toy_tfds):
  name, data_dir = toy_tfds
  docs = read(f"tfds:{name}:text", tfds_data_dir=data_dir)
  assert docs == [[f"Article {i} starts.", "It goes on!", f"A second paragraph {i}."]
                  for i in range(3)]


def test_tfds_feature_defaults_to_text(toy_tfds):
  name, data_dir = toy_tfds
  assert len(read(f"tfds:{name}", tfds_data_dir=data_dir, max_documents=2)) == 2


def test_tfds_unknown_feature_raises_naming_it(toy_tfds):
  name, data_dir = toy_tfds
  with pytest.raises(CorpusError, match="no feature 'body'"):
    corpus.read_documents(f"tfds:{name}:body", tfds_data_dir=data_dir)


def test_tfds_unknown_dataset_raises_naming_it(tmp_path):
  with pytest.raises(CorpusError, match="unknown TFDS dataset 'xyz_no_such_set'") as e:
    corpus.read_documents("tfds:xyz_no_such_set:text", tfds_data_dir=str(tmp_path))
  assert "\n" not in str(e.value)


def test_fingerprint_changes_when_the_file_changes(tmp_path):
  path = write(tmp_path, "a\tb\n")
  before = corpus.fingerprint(path)
  write(tmp_path, "a\tb\nc\td\n")
  assert corpus.fingerprint(path) != before
