"""prepare(): stores via TFDS once, reuses it, and leaves nothing behind on failure."""

import os
import random
import subprocess
import sys

import numpy as np
import pytest

from bert_jax import settings
from bert_jax.data import corpus, dataset, prep_write, pretraining_data
from bert_jax.errors import ConfigError, CorpusError
from bert_jax.data.input_pipeline import TrainIterator
from bert_jax.data.tokenizer import Tokenizer
from configs import default

SHIPPED = os.path.join(os.path.dirname(__file__), os.pardir, "data", "corpus.txt")
WORDS = ("the a cat dog sat ran over under warm cold mat field ball tree river boat "
         "small big red green old new quick slow bird fish sings swims reads writes").split()


def write_plain_corpus(path, num_docs=12, seed=0):
  """Documents of 5-9 made-up sentences, blank line between documents."""
  rng = random.Random(seed)
  docs = []
  for _ in range(num_docs):
    sentences = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 10))) + "."
                 for _ in range(rng.randint(5, 9))]
    docs.append("\n".join(s.capitalize() for s in sentences))
  path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
  return str(path)


def data_config(corpus_path, **overrides):
  config = default.get_config()
  c = config.data
  c.corpus = corpus_path
  c.vocab_size = 120
  c.dupe_factor = 2
  c.eval_fraction = 0.2
  c.max_eval_examples = 100
  for key, value in overrides.items():
    setattr(config if key == "objective" else c, key, value)
  return settings.data_settings(config)


@pytest.fixture
def plain(tmp_path):
  return write_plain_corpus(tmp_path / "corpus.txt")


@pytest.fixture
def cache(tmp_path):
  return str(tmp_path / "cache")


def forbid(monkeypatch, obj, name):
  def boom(*args, **kwargs):
    raise AssertionError(f"{name} must not be called")
  monkeypatch.setattr(obj, name, boom)


def all_examples(source):
  return [source[i] for i in range(len(source))]


def test_prepare_stores_each_seq_len_with_fixed_shape_int32_features(plain, cache):
  prepared = dataset.prepare(data_config(plain), [16, 32], cache, seed=0)
  assert sorted(prepared.train) == sorted(prepared.eval) == [16, 32]
  for seq_len in (16, 32):
    for source in (prepared.train[seq_len], prepared.eval[seq_len]):
      assert len(source) > 0
      ex = source[0]
      assert sorted(ex) == sorted(pretraining_data.FEATURES)
      for key in ("input_ids", "segment_ids", "input_mask"):
        assert ex[key].shape == (seq_len,) and ex[key].dtype == np.int32
      assert int(ex["next_sentence_label"]) in (0, 1)


def test_prepare_saves_the_tokenizer_it_used_next_to_the_data(plain, cache):
  prepared = dataset.prepare(data_config(plain), [16], cache, seed=0)
  assert prepared.directory.startswith(os.path.abspath(cache))
  saved = Tokenizer.load(os.path.join(prepared.directory, "tokenizer"))
  assert saved.vocab == prepared.tokenizer.vocab
  assert os.path.isfile(os.path.join(prepared.directory, "settings.json"))


def test_example_ids_are_within_the_vocabulary(plain, cache):
  prepared = dataset.prepare(data_config(plain), [16], cache, seed=0)
  ids = np.stack([ex["input_ids"] for ex in all_examples(prepared.train[16])])
  assert ids.max() < prepared.tokenizer.vocab_size
  assert (ids[:, 0] == prepared.tokenizer.cls_id).all()


def test_second_prepare_reuses_stored_data_without_reading_the_corpus(plain, cache,
                                                                       monkeypatch):
  first = dataset.prepare(data_config(plain), [16], cache, seed=0)
  forbid(monkeypatch, corpus, "read_documents")
  forbid(monkeypatch, Tokenizer, "train")
  again = dataset.prepare(data_config(plain), [16], cache, seed=0)
  assert again.directory == first.directory
  assert again.tokenizer.vocab == first.tokenizer.vocab
  assert [e["input_ids"].tolist() for e in all_examples(again.train[16])] == [
      e["input_ids"].tolist() for e in all_examples(first.train[16])]


def test_a_changed_setting_prepares_into_a_new_directory(plain, cache):
  first = dataset.prepare(data_config(plain), [16], cache, seed=0)
  other = dataset.prepare(data_config(plain, dupe_factor=3), [16], cache, seed=0)
  assert other.directory != first.directory
  assert len(other.train[16]) > len(first.train[16])


def test_a_changed_corpus_file_prepares_anew(tmp_path, cache):
  path = write_plain_corpus(tmp_path / "c.txt", seed=0)
  first = dataset.prepare(data_config(path), [16], cache, seed=0)
  write_plain_corpus(tmp_path / "c.txt", num_docs=14, seed=1)
  assert dataset.prepare(data_config(path), [16], cache, seed=0).directory != first.directory


def test_a_new_seq_len_reuses_the_stored_tokenizer(plain, cache, monkeypatch):
  first = dataset.prepare(data_config(plain), [16], cache, seed=0)
  forbid(monkeypatch, Tokenizer, "train")
  both = dataset.prepare(data_config(plain), [16, 32], cache, seed=0)
  assert both.directory == first.directory
  assert len(both.train[32]) > 0


def test_too_small_corpus_raises_with_counts_and_leaves_nothing(tmp_path, cache):
  path = tmp_path / "small.txt"
  path.write_text("One.\nTwo.\n\nThree.\n\nFour.\n", encoding="utf-8")
  with pytest.raises(CorpusError, match=r"small\.txt.*3 document\(s\), 4 sentence\(s\); "
                                        r"need at least 4 documents") as e:
    dataset.prepare(data_config(str(path)), [16], cache, seed=0)
  assert "\n" not in str(e.value)
  assert not os.path.exists(cache) or os.listdir(cache) == []


def test_failure_while_writing_leaves_nothing_and_the_next_run_starts_clean(plain, cache,
                                                                            monkeypatch):
  real = pretraining_data.document_spans

  def fails_midway(*args, **kwargs):
    for i, span in enumerate(real(*args, **kwargs)):
      if i == 5:
        raise RuntimeError("interrupted")
      yield span

  monkeypatch.setattr(pretraining_data, "document_spans", fails_midway)
  with pytest.raises(RuntimeError, match="interrupted"):
    dataset.prepare(data_config(plain), [16], cache, seed=0)
  assert not os.path.exists(cache)
  monkeypatch.setattr(pretraining_data, "document_spans", real)
  assert len(dataset.prepare(data_config(plain), [16], cache, seed=0).train[16]) > 5


def test_failure_adding_a_seq_len_keeps_the_earlier_data(plain, cache, monkeypatch):
  first = dataset.prepare(data_config(plain), [16], cache, seed=0)

  def fails(*args, **kwargs):
    raise RuntimeError("interrupted")
    yield  # pragma: no cover

  monkeypatch.setattr(pretraining_data, "document_spans", fails)
  with pytest.raises(RuntimeError):
    dataset.prepare(data_config(plain), [16, 32], cache, seed=0)
  leftovers = [d for _, dirs, _ in os.walk(cache) for d in dirs if ".tmp-" in d]
  assert leftovers == [] and not os.path.exists(os.path.join(first.directory, "seq32"))
  forbid(monkeypatch, corpus, "read_documents")
  assert len(dataset.prepare(data_config(plain), [16], cache, seed=0).train[16]) == len(
      first.train[16])


def test_a_killed_preparation_leaves_only_debris_that_is_never_used(plain, cache, tmp_path):
  # A hard kill (no cleanup runs) half way through writing examples.
  code = (
      "import os, sys; sys.path.insert(0, os.getcwd())\n"
      "from bert_jax.data import dataset, pretraining_data\n"
      "from tests.test_dataset import data_config\n"
      "real = pretraining_data.document_spans\n"
      "def dies(*a, **k):\n"
      "  for i, s in enumerate(real(*a, **k)):\n"
      "    if i == 5: os._exit(9)\n"
      "    yield s\n"
      "pretraining_data.document_spans = dies\n"
      f"dataset.prepare(data_config({plain!r}), [16], {cache!r}, seed=0)\n")
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  assert subprocess.run([sys.executable, "-c", code], cwd=repo).returncode == 9
  debris = os.listdir(cache)
  # Only the hidden parts folder (what a rerun resumes from), never the final name.
  assert len(debris) == 1 and debris[0].startswith(".")
  prepared = dataset.prepare(data_config(plain), [16], cache, seed=0)
  assert os.listdir(cache) == [os.path.basename(prepared.directory)]
  assert len(prepared.train[16]) > 5


def test_a_failing_other_corpus_leaves_a_complete_cache_intact(plain, cache, tmp_path):
  first = dataset.prepare(data_config(plain), [16], cache, seed=0)
  before = all_examples(first.train[16])
  bad = tmp_path / "bad.txt"
  bad.write_text("Only one.\n\nTwo docs.\n", encoding="utf-8")
  with pytest.raises(CorpusError):
    dataset.prepare(data_config(str(bad)), [16], cache, seed=0)
  assert os.listdir(cache) == [os.path.basename(first.directory)]
  again = dataset.prepare(data_config(plain), [16], cache, seed=0)
  assert [e["input_ids"].tolist() for e in all_examples(again.train[16])] == [
      e["input_ids"].tolist() for e in before]


def test_shipped_tab_corpus_makes_train_and_eval_examples(cache):
  prepared = dataset.prepare(data_config(SHIPPED, vocab_size=300), [32], cache, seed=0)
  assert len(prepared.train[32]) >= 100 and len(prepared.eval[32]) >= 20


def test_eval_documents_are_held_out_from_training(cache):
  prepared = dataset.prepare(data_config(SHIPPED, vocab_size=300), [32], cache, seed=0)

  def first_halves(source):
    out = set()
    for ex in all_examples(source):
      ids = ex["input_ids"].tolist()
      out.add(tuple(ids[1:ids.index(prepared.tokenizer.sep_id)]))
    return out

  assert first_halves(prepared.train[32]).isdisjoint(first_halves(prepared.eval[32]))


def test_max_eval_examples_caps_the_eval_split(plain, cache):
  prepared = dataset.prepare(data_config(plain, max_eval_examples=7), [16], cache, seed=0)
  assert len(prepared.eval[16]) == 7


def test_eval_dupe_factor_multiplies_the_eval_passes(plain, cache):
  one = dataset.prepare(data_config(plain, eval_dupe_factor=1, max_eval_examples=0), [16],
                        cache, seed=0)
  four = dataset.prepare(data_config(plain, eval_dupe_factor=4, max_eval_examples=0), [16],
                         cache, seed=0)
  assert 3 * len(one.eval[16]) < len(four.eval[16]) <= 5 * len(one.eval[16])


def test_eval_dupe_factor_leaves_the_train_split_unchanged(plain, cache, tmp_path):
  vocab = write_vocab(tmp_path)  # a trained vocabulary could differ between the two
  base = dataset.prepare(data_config(plain, vocab_file=vocab), [16], cache, seed=0)
  more = dataset.prepare(data_config(plain, vocab_file=vocab, eval_dupe_factor=5), [16],
                         cache, seed=0)
  assert [e["input_ids"].tolist() for e in all_examples(more.train[16])] == [
      e["input_ids"].tolist() for e in all_examples(base.train[16])]


def test_eval_dupe_factor_equal_to_dupe_factor_keeps_the_prepared_data(plain, cache):
  # 0 means dupe_factor: data prepared before the setting existed is reused.
  zero = dataset.prepare(data_config(plain, eval_dupe_factor=0), [16], cache, seed=0)
  same = dataset.prepare(data_config(plain, eval_dupe_factor=2), [16], cache, seed=0)
  assert same.directory == zero.directory


def test_a_vocab_file_is_used_as_is(plain, cache, tmp_path, monkeypatch):
  vocab = (["[PAD]"] + [f"[unused{i}]" for i in range(9)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
           + sorted(set(WORDS)) + ["."])
  path = tmp_path / "vocab.txt"
  path.write_text("\n".join(vocab) + "\n", encoding="utf-8")
  forbid(monkeypatch, Tokenizer, "train")
  prepared = dataset.prepare(data_config(plain, vocab_file=str(path)), [16], cache, seed=0)
  assert prepared.tokenizer.vocab == vocab
  ex = prepared.train[16][0]
  assert ex["input_ids"][0] == 11  # [CLS] keeps the file's id
  assert prepared.tokenizer.unk_id not in ex["input_ids"]


def test_builtin_corpus_prepares(cache):
  c = data_config("builtin", vocab_size=1000, dupe_factor=1, eval_fraction=0.05)
  prepared = dataset.prepare(c, [64], cache, seed=0)
  assert len(prepared.train[64]) > 1000 and len(prepared.eval[64]) > 10


def test_prepared_source_feeds_the_train_iterator(plain, cache):
  source = dataset.prepare(data_config(plain), [16], cache, seed=0).train[16]
  it = TrainIterator(source, 8, seed=0, prefetch=0)
  indices = it.batch_indices(0)
  batch = next(it)
  assert batch.input_ids_BxL.tolist() == [source[int(i)]["input_ids"].tolist() for i in indices]
  assert batch.next_sentence_label_B.dtype == np.int32


def test_missing_corpus_file_raises_naming_it_and_leaves_nothing(tmp_path, cache):
  with pytest.raises(CorpusError, match="nope.txt"):
    dataset.prepare(data_config(str(tmp_path / "nope.txt")), [16], cache, seed=0)
  assert not os.path.exists(cache) or os.listdir(cache) == []


def build_toy_tfds(data_dir, num_articles=8):
  """A tiny array_record TFDS dataset with a wikipedia-like `text` feature."""
  import tensorflow_datasets as tfds

  class ToyArticles(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    VERSION = tfds.core.Version("1.0.0")

    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls):
      return None

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
          {"text": tfds.features.Text()}))

    def _split_generators(self, dl_manager):
      return {"train": self._generate_examples()}

    def _generate_examples(self):
      for i in range(num_articles):
        yield i, {"text": f"Article {i} is about a cat. The cat sat on a mat.\n"
                          f"Then the dog {i} ran over the field. It was warm."}

  builder = ToyArticles(data_dir=str(data_dir), file_format="array_record")
  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
      compute_stats=tfds.download.ComputeStatsMode.SKIP))
  return builder.name


def test_tfds_corpus_prepares_from_tfds_data_dir(tmp_path, cache, monkeypatch):
  name = build_toy_tfds(tmp_path / "tfds")
  monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "tfds"))
  prepared = dataset.prepare(data_config(f"tfds:{name}:text"), [16], cache, seed=0)
  assert len(prepared.train[16]) > 0 and len(prepared.eval[16]) > 0


def test_unknown_tfds_corpus_raises_naming_it(cache):
  with pytest.raises(CorpusError, match="unknown TFDS dataset 'xyz_no_such_set'"):
    dataset.prepare(data_config("tfds:xyz_no_such_set:text"), [16], cache, seed=0)
  assert not os.path.exists(cache) or os.listdir(cache) == []


@pytest.mark.parametrize("field,value", [("eval_fraction", 0.0), ("dupe_factor", 0),
                                         ("eval_dupe_factor", -1),
                                         ("short_seq_prob", 1.5), ("format", "csv")])
def test_bad_data_settings_are_config_errors_naming_the_field(plain, cache, field, value):
  with pytest.raises(ConfigError, match=f"data.{field}"):
    dataset.prepare(data_config(plain, **{field: value}), [16], cache, seed=0)


def test_seq_len_below_the_minimum_is_a_config_error(plain, cache):
  with pytest.raises(ConfigError, match="seq_len"):
    dataset.prepare(data_config(plain), [7], cache, seed=0)


# --- streaming: windows, determinism, bounded vocabulary sample ---


def write_vocab(tmp_path):
  vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(set(WORDS)) + ["."]
  path = tmp_path / "vocab.txt"
  path.write_text("\n".join(vocab) + "\n", encoding="utf-8")
  return str(path)


def test_same_corpus_seed_and_vocab_give_identical_examples_in_another_cache(plain, tmp_path):
  # A fixed vocabulary: the examples alone are compared (training one is tested in test_tokenizer).
  c = data_config(plain, vocab_file=write_vocab(tmp_path))
  first = dataset.prepare(c, [16], str(tmp_path / "a"), seed=0)
  second = dataset.prepare(c, [16], str(tmp_path / "b"), seed=0)
  for split in ("train", "eval"):
    a, b = getattr(first, split)[16], getattr(second, split)[16]
    assert [e["input_ids"].tolist() for e in all_examples(a)] == [
        e["input_ids"].tolist() for e in all_examples(b)]


def test_not_next_partners_come_from_the_same_window(tmp_path, cache, monkeypatch):
  monkeypatch.setattr(prep_write, "WINDOW_DOCUMENTS", 3)
  num_docs = 40
  path = tmp_path / "docs.txt"  # document i is made of the word d<i> only
  path.write_text("\n\n".join("\n".join(f"d{i} " * 3 + "." for _ in range(4))
                              for i in range(num_docs)) + "\n", encoding="utf-8")
  vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "."] + [f"d{i}" for i in range(num_docs)]
  (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
  prepared = dataset.prepare(data_config(str(path), vocab_file=str(tmp_path / "vocab.txt"),
                                         dupe_factor=3), [16], cache, seed=0)
  doc_of = lambda ids: {i - 6 for i in ids if i >= 6}
  train = all_examples(prepared.train[16])
  rank = {d: r for r, d in enumerate(sorted({min(doc_of(e["input_ids"][1:3])) for e in train}))}
  last = (len(rank) - 2) // 3
  window = lambda d: min(rank[d] // 3, last)
  not_next = [e for e in train if e["next_sentence_label"] == 1]
  assert len(rank) > 20 and last >= 5 and not_next
  for ex in not_next:
    n_a = int((ex["segment_ids"] == 0).sum() - (ex["input_mask"] == 0).sum())
    (a,), (b,) = doc_of(ex["input_ids"][:n_a]), doc_of(ex["input_ids"][n_a:])
    assert a != b and window(a) == window(b)


def test_stored_examples_decode_to_a_consistent_layout(plain, cache):
  prepared = dataset.prepare(data_config(plain), [32], cache, seed=0)
  tok = prepared.tokenizer
  batch = prepared.train[32].__getitems__(range(len(prepared.train[32])))
  for ex in batch:
    n = int(ex["input_mask"].sum())
    seps = np.flatnonzero(ex["input_ids"] == tok.sep_id).tolist()
    assert ex["input_ids"][0] == tok.cls_id and seps[-1] == n - 1 and len(seps) == 2
    assert ex["segment_ids"].tolist() == [0] * (seps[0] + 1) + [1] * (n - seps[0] - 1) + [
        0] * (32 - n)
    assert (ex["input_ids"][n:] == 0).all() and (ex["input_mask"][:n] == 1).all()


def test_a_trained_vocabulary_reads_only_its_sample(plain, cache, monkeypatch):
  seen = []
  real = Tokenizer.train.__func__

  def spy(cls, texts, vocab_size, lowercase):
    texts = list(texts())  # dataset streams the sample: a function giving a fresh iterable
    seen.extend(texts)
    return real(cls, texts, vocab_size, lowercase)

  monkeypatch.setattr(Tokenizer, "train", classmethod(spy))
  dataset.prepare(data_config(plain, vocab_sample_bytes=200), [16], cache, seed=0)
  assert 200 <= sum(map(len, seen)) < 200 + 9 * 60  # stops after the document that crosses it


def test_prepare_records_counts_in_stats_json(plain, cache):
  import json
  prepared = dataset.prepare(data_config(plain), [16], cache, seed=0)
  with open(os.path.join(prepared.directory, "stats.json")) as f:
    stats = json.load(f)
  assert stats["documents"] == 12 and stats["tokens"] > 0
  assert stats["examples"]["16"] == {"train": len(prepared.train[16]),
                                     "eval": len(prepared.eval[16])}


# --- hostile input through prepare: one-line error, nothing left in the cache ---


def _bad_inputs(tmp_path):
  loop = tmp_path / "loop.txt"
  os.symlink(loop, loop)
  empty = tmp_path / "empty.txt"
  empty.write_bytes(b"")
  blank = tmp_path / "blank.txt"
  blank.write_text("\n \n\t\n\r\n", encoding="utf-8")
  gz = tmp_path / "corpus.txt.gz"
  gz.write_bytes(b"\x1f\x8b\x08\x00" + bytes(200))
  tab = tmp_path / "tab.txt"
  tab.write_text("no tab here.\nnor here.\n", encoding="utf-8")
  dup = tmp_path / "vocab_dup.txt"
  dup.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\ncat\ncat\n", encoding="utf-8")
  nomask = tmp_path / "vocab_nomask.txt"
  nomask.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\ncat\n", encoding="utf-8")
  (tmp_path / "nothing").mkdir()
  return {
      "missing": (dict(corpus=str(tmp_path / "nope.txt")), "nope.txt", "does not exist"),
      "directory": (dict(corpus=str(tmp_path / "nothing")), "nothing", "holds no files"),
      "symlink loop": (dict(corpus=str(loop)), "loop.txt", "symlink"),
      "empty": (dict(corpus=str(empty)), "empty.txt", "no text"),
      "blank lines": (dict(corpus=str(blank)), "blank.txt", "no text"),
      "gzip": (dict(corpus=str(gz)), "corpus.txt.gz", "gzip-compressed and its data is damaged"),
      "glob": (dict(corpus=str(tmp_path / "*.nothing")), "*.nothing", "matches no files"),
      "tab without tabs": (dict(corpus=str(tab), format="tab"), "tab.txt", "no 'first half"),
      "vocab duplicate": (dict(vocab_file=str(dup)), "vocab_dup.txt", "repeats token 'cat'"),
      "vocab without [MASK]": (dict(vocab_file=str(nomask)), "vocab_nomask.txt", r"\[MASK\]"),
  }


@pytest.mark.parametrize("case", ["missing", "directory", "symlink loop", "empty", "blank lines",
                                  "gzip", "glob", "tab without tabs", "vocab duplicate",
                                  "vocab without [MASK]"])
def test_bad_input_is_one_line_error_naming_it_and_leaves_nothing(plain, cache, tmp_path,
                                                                  case):
  from bert_jax.errors import BertJaxError
  overrides, name, what = _bad_inputs(tmp_path)[case]
  c = data_config(overrides.pop("corpus", plain), **overrides)
  with pytest.raises(BertJaxError, match=what) as e:
    dataset.prepare(c, [16], cache, seed=0)
  assert name in str(e.value) and "\n" not in str(e.value)
  assert not os.path.exists(cache)


def test_odd_input_is_repaired_counted_and_warned_on_one_line(tmp_path, cache, capsys):
  text = write_plain_corpus(tmp_path / "base.txt")
  odd = tmp_path / "odd.txt"
  with open(text, "rb") as f:
    body = f.read()
  odd.write_bytes(b"\xef\xbb\xbf" + body.replace(b"\n", b"\r\n").replace(b"cat", b"c\x00at", 3)
                  + b"single bad \xff byte.\r\n\r\n" + b"word " * 250_000 + b"\r\n")
  c = data_config(str(odd), vocab_file=write_vocab(tmp_path))  # training one costs seconds
  prepared = dataset.prepare(c, [16], cache, seed=0)
  assert len(prepared.train[16]) > 50
  warnings = [l for l in capsys.readouterr().err.splitlines() if l.startswith("warning:")]
  # The 1.25 MB line is also a document over 1 MiB, cut (2 more: the cut, and its
  # one-sentence documents).
  assert len(warnings) == 5 and all("odd.txt'" in w for w in warnings)
  assert {"not UTF-8", "control character", "over 1 MiB"} == {
      k for k in ("not UTF-8", "control character", "over 1 MiB") for w in warnings if k in w}


def test_sharded_records_read_back_the_same_examples(plain, tmp_path, monkeypatch):
  c = data_config(plain, vocab_file=write_vocab(tmp_path))
  whole = dataset.prepare(c, [16], str(tmp_path / "one"), seed=0).train[16]
  monkeypatch.setattr(prep_write, "SHARD_RECORDS", 7)
  sharded = dataset.prepare(c, [16], str(tmp_path / "many"), seed=0).train[16]
  assert len(sharded.paths) == -(-len(whole) // 7) > 3
  order = np.random.default_rng(0).permutation(len(whole))
  assert [e["input_ids"].tolist() for e in sharded.__getitems__(order)] == [
      whole[int(i)]["input_ids"].tolist() for i in order]


def test_two_runs_preparing_one_fresh_cache_at_once_leave_no_parts_folder(plain, cache):
  """Run B looks before run A has finished (so it prepares parts too), A finishes and
  removes its parts folder, then B's parts are made again there and B finishes, finding
  the preparation complete (issue 41: B's `.<key>.parts-seq32` was left behind)."""
  c = data_config(plain)
  a = dataset.prepare_parts(c, [32], cache, seed=0)
  b = dataset.prepare_parts(c, [32], cache, seed=0)  # before A finishes: not complete
  assert not a.complete and not b.complete and a.parts_root == b.parts_root
  dataset.finish(c, [32], a, seed=0)
  again = dataset.prepare_parts(c, [32], cache, seed=0)
  assert again.complete  # a run starting now reuses it
  os.makedirs(os.path.join(b.parts_root, "part-0"), exist_ok=True)  # B's workers, still writing
  dataset.finish(c, [32], b, seed=0)
  assert sorted(os.listdir(cache)) == [os.path.basename(a.directory)], os.listdir(cache)
