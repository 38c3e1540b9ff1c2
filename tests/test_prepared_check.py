"""Prepared data is checked before it is trusted: recorded sizes, corpus stability,
storage that cannot be written (issue 12, section 4)."""

import errno
import json
import os
import shutil

import pytest

from bert_jax.data import corpus, dataset, pretraining_data
from bert_jax.errors import ConfigError, CorpusError
from tests.test_dataset import data_config, write_plain_corpus


@pytest.fixture
def plain(tmp_path):
  return write_plain_corpus(tmp_path / "corpus.txt")


@pytest.fixture
def cache(tmp_path):
  return str(tmp_path / "cache")


def _ids(source):
  return [source[i]["input_ids"].tolist() for i in range(len(source))]


def _tokens(prepared, seq_len=16):
  """The examples as token strings (a vocabulary trained again may order ties otherwise)."""
  tok = prepared.tokenizer
  return [tok.convert_ids_to_tokens(ids) for ids in _ids(prepared.train[seq_len])]


def _warnings(capsys):
  return [l for l in capsys.readouterr().err.splitlines() if l.startswith("warning:")]


def _shard(prepared, seq_len=16, split="train", index=0):
  return dataset.shard_path(os.path.join(prepared.directory, f"seq{seq_len}", split), index)


def _truncate(path, keep=0.5):
  with open(path, "r+b") as f:
    f.truncate(int(os.path.getsize(path) * keep))


def _count_reads(monkeypatch):
  reads = []
  real = corpus.read_documents

  def counted(*args, **kwargs):
    reads.append(1)
    return real(*args, **kwargs)

  monkeypatch.setattr(corpus, "read_documents", counted)
  return reads


def test_preparation_records_every_file_and_its_size(plain, cache):
  prepared = dataset.prepare(data_config(plain), [16], cache, seed=0)
  with open(os.path.join(prepared.directory, dataset.MANIFEST_FILE)) as f:
    files = json.load(f)["files"]
  assert {"settings.json", "stats.json", "tokenizer/vocab.txt",
          "tokenizer/tokenizer_config.json"} == set(files)
  for name, size in files.items():
    assert os.path.getsize(os.path.join(prepared.directory, name)) == size
  seq_dir = os.path.join(prepared.directory, "seq16")
  with open(os.path.join(seq_dir, dataset.INFO_FILE)) as f:
    info = json.load(f)
  shards = [n for n in os.listdir(seq_dir) if n.endswith(".array_record")]
  assert sorted(info["files"]) == sorted(shards)
  for name, size in info["files"].items():
    assert os.path.getsize(os.path.join(seq_dir, name)) == size
  assert dataset.check_seq_dir(seq_dir) is None


@pytest.mark.parametrize("damage", ["truncated-shard", "missing-shard", "missing-info",
                                    "info-not-json", "grown-shard"])
def test_a_damaged_seq_len_is_prepared_again_with_one_warning(plain, cache, capsys, monkeypatch,
                                                              damage):
  first = dataset.prepare(data_config(plain), [16, 32], cache, seed=0)
  want16, want32 = _ids(first.train[16]), _ids(first.train[32])
  capsys.readouterr()
  shard, info = _shard(first), os.path.join(first.directory, "seq16", dataset.INFO_FILE)
  if damage == "truncated-shard":
    _truncate(shard)
    named = shard
  elif damage == "missing-shard":
    os.remove(shard)
    named = shard
  elif damage == "grown-shard":
    with open(shard, "ab") as f:
      f.write(b"\0" * 10)
    named = shard
  elif damage == "missing-info":
    os.remove(info)
    named = info
  else:
    with open(info, "w") as f:
      f.write('{"seq_len": 16, "dty')
    named = info
  reads = _count_reads(monkeypatch)
  again = dataset.prepare(data_config(plain), [16, 32], cache, seed=0)
  warnings = _warnings(capsys)
  assert len(warnings) == 1 and named in warnings[0] and "again" in warnings[0], warnings
  assert _ids(again.train[16]) == want16 and _ids(again.train[32]) == want32
  assert reads == [1]  # one pass over the corpus for seq 16 alone; the vocabulary is kept
  assert dataset.check_seq_dir(os.path.dirname(shard)) is None
  dataset.prepare(data_config(plain), [16, 32], cache, seed=0)
  assert _warnings(capsys) == []  # repaired for good


@pytest.mark.parametrize("damage", ["vocab-changed", "manifest-missing", "settings-missing"])
def test_damaged_top_level_files_rebuild_the_whole_preparation(plain, cache, capsys, damage):
  first = dataset.prepare(data_config(plain), [16], cache, seed=0)
  want = _tokens(first)
  capsys.readouterr()
  if damage == "vocab-changed":
    named = os.path.join(first.directory, "tokenizer", "vocab.txt")
    with open(named, "a") as f:
      f.write("extra\n")
  elif damage == "manifest-missing":  # what a folder of an older version looks like
    named = os.path.join(first.directory, dataset.MANIFEST_FILE)
    os.remove(named)
  else:
    named = os.path.join(first.directory, dataset.SETTINGS_FILE)
    os.remove(named)
  again = dataset.prepare(data_config(plain), [16], cache, seed=0)
  warnings = _warnings(capsys)
  assert len(warnings) == 1 and named in warnings[0], warnings
  assert _tokens(again) == want and again.directory == first.directory
  assert os.listdir(cache) == [os.path.basename(first.directory)]


def test_open_split_refuses_a_damaged_split_in_one_line(plain, cache):
  prepared = dataset.prepare(data_config(plain), [16], cache, seed=0)
  shard = _shard(prepared, split="eval")
  _truncate(shard)
  with pytest.raises(dataset.PreparedDataError) as e:
    dataset.open_split(prepared.directory, 16, "eval")
  msg = str(e.value)
  assert "\n" not in msg and shard in msg and "recorded" in msg and "expected" in msg


def test_a_corpus_that_changes_while_prepared_is_not_cached(plain, cache, monkeypatch):
  real = pretraining_data.document_spans

  def grows_corpus(*args, **kwargs):
    with open(plain, "a", encoding="utf-8") as f:
      f.write("\nA late sentence.\n")
    monkeypatch.setattr(pretraining_data, "document_spans", real)
    return real(*args, **kwargs)

  monkeypatch.setattr(pretraining_data, "document_spans", grows_corpus)
  with pytest.raises(CorpusError) as e:
    dataset.prepare(data_config(plain), [16], cache, seed=0)
  msg = str(e.value)
  assert "\n" not in msg and plain in msg and "changed while" in msg and "size" in msg
  assert not os.path.exists(cache)  # nothing cached, not even debris
  assert len(dataset.prepare(data_config(plain), [16], cache, seed=0).train[16]) > 0


def test_a_corpus_touched_while_a_seq_len_is_added_keeps_the_rest(plain, cache, monkeypatch):
  first = dataset.prepare(data_config(plain), [16], cache, seed=0)
  real = pretraining_data.document_spans
  st = os.stat(plain)

  def touches_corpus(*args, **kwargs):
    os.utime(plain, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # same size, newer mtime
    return real(*args, **kwargs)

  monkeypatch.setattr(pretraining_data, "document_spans", touches_corpus)
  with pytest.raises(CorpusError, match="modification time changed"):
    dataset.prepare(data_config(plain), [16, 32], cache, seed=0)
  assert sorted(os.listdir(first.directory)) == sorted(
      ["manifest.json", "settings.json", "stats.json", "tokenizer", "seq16"])
  assert dataset.check_seq_dir(os.path.join(first.directory, "seq16")) is None


def _read_only(monkeypatch, cache, *names):
  """Simulates a read-only cache for the named os/shutil calls (tests run as root,
  for whom chmod does not stop a write)."""
  for module, name in names:
    real = getattr(module, name)

    def refuse(path, *args, _real=real, **kwargs):
      if os.path.abspath(str(path)).startswith(os.path.abspath(cache)):
        raise OSError(errno.EROFS, "Read-only file system", str(path))
      return _real(path, *args, **kwargs)

    monkeypatch.setattr(module, name, refuse)


def test_a_read_only_cache_that_needs_preparing_is_one_config_error(plain, cache, monkeypatch):
  _read_only(monkeypatch, cache, (os, "makedirs"))
  with pytest.raises(ConfigError) as e:
    dataset.prepare(data_config(plain), [16], cache, seed=0)
  msg = str(e.value)
  assert "\n" not in msg and "config.data.cache_dir" in msg and "Read-only" in msg
  assert not os.path.exists(cache)


def test_a_read_only_cache_with_a_damaged_file_names_it_in_one_line(plain, cache, monkeypatch):
  prepared = dataset.prepare(data_config(plain), [16], cache, seed=0)
  shard = _shard(prepared)
  _truncate(shard)
  _read_only(monkeypatch, cache, (shutil, "rmtree"))
  with pytest.raises(ConfigError) as e:
    dataset.prepare(data_config(plain), [16], cache, seed=0)
  msg = str(e.value)
  assert "\n" not in msg and "config.data.cache_dir" in msg and shard in msg


def test_a_read_only_complete_cache_is_read_without_writing(plain, cache, monkeypatch):
  first = dataset.prepare(data_config(plain), [16], cache, seed=0)
  for module, name in ((os, "makedirs"), (os, "rename"), (os, "replace"), (shutil, "rmtree")):
    _read_only(monkeypatch, cache, (module, name))
  assert _ids(dataset.prepare(data_config(plain), [16], cache, seed=0).train[16]) == _ids(
      first.train[16])


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through chmod")
def test_a_really_read_only_cache_folder(plain, tmp_path):
  ro = tmp_path / "ro"
  ro.mkdir()
  os.chmod(ro, 0o555)
  try:
    with pytest.raises(ConfigError, match="config.data.cache_dir"):
      dataset.prepare(data_config(plain), [16], str(ro / "cache"), seed=0)
  finally:
    os.chmod(ro, 0o755)
