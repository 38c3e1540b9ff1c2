"""Prepare pre-training data once (corpus -> WordPiece or BPE ids -> examples ->
array_record), in parts, by as many workers and hosts as there are, and reuse it.
  vocabulary   trained once (process 0) on `data.vocab_sample_bytes` of text, or `vocab_file`
  parts        the corpus cut at document boundaries that depend on the corpus
               alone (prep_parts); each part prepared on its own, streaming, in
               bounded memory (prep_write), by `data.num_workers` worker processes
               (prep_workers) and, on a shared cache, by every process (`Share`)
  merge        the parts' records in part order: one dataset (prep_merge), so the
               prepared bytes are the same for any number of workers and hosts

Layout under `cache_dir`:

  <key>/                  `Prepared.directory`; key = hash of the settings.json there
    stats.json            counts: documents, sentences, tokens, repaired input, examples
    tokenizer/            vocab.txt or tokenizer.json, tokenizer_config.json; seq<L>/: shards
  .<key>.parts-seq<L>/    while preparing: tokenizer/, part-<i>/ (complete parts only)

The merge goes to `.<key>.tmp-<host>-<pid>/`, renamed to `<key>/`; a seq_len added later
through `<key>/.parts-seq<L>/` and `<key>/.seq<L>.tmp-<host>-<pid>/` to `seq<L>/`. What
exists under its final name is complete; a crash leaves finished parts and `.tmp` debris.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
from collections.abc import Iterator, Sequence
from typing import Any

from bert_jax.data import corpus, prep_parts, prep_merge, prep_workers, prep_write
from bert_jax.errors import BertJaxError, ConfigError
from bert_jax.data.prep_store import (  # noqa: F401  (re-exported: the data's public names)
    HEADER, INFO_FILE, MANIFEST_FILE, SETTINGS_FILE, STATS_FILE, TOKENIZER_DIR, ExampleSource,
    seq_dir, shard_path, write_json)
from bert_jax.data.prep_check import (  # noqa: F401
    CacheDirError, PreparedDataError, check_corpus_unchanged, check_seq_dir, is_complete, writable,
    write_manifest)
from bert_jax.data import bpe
from bert_jax.storage import fs, outputs

from bert_jax.settings.data import DataSettings  # data code takes its part, never a config
from bert_jax.settings.train import MIN_SEQ_LEN

# Bump when the way examples are made or stored changes, so old caches are not reused.
DATA_VERSION = 3  # 3: text that spells [CLS], [SEP], [MASK], [PAD] is ordinary pieces


@dataclasses.dataclass
class Prepared:
  """Prepared data: sources are random-access (`len(src)`, `src[i]` -> dict)."""
  tokenizer: bpe.AnyTokenizer
  train: dict[int, Any]
  eval: dict[int, Any]
  directory: str
  # Host-local parts (see `Share`): this host reads only its own examples, and every
  # host's eval examples per seq_len are in `eval_sizes` (eval steps stay in step).
  local: Share | None = None
  eval_sizes: dict[int, list[int]] | None = None


@dataclasses.dataclass(frozen=True)
class Share:
  """Which parts a process prepares: those with part index % count == index, or, with
  `streams` (a multiple of count), the parts of its streams: part p is stream p % streams,
  and process i has the streams [i*streams/count, (i+1)*streams/count)."""
  index: int = 0
  count: int = 1
  streams: int = 0  # 0: no streams

  def holds(self, part: int) -> bool:
    if self.streams:
      return (part % self.streams) // (self.streams // self.count) == self.index
    return part % self.count == self.index


def host_share(c: DataSettings, index: int, count: int) -> Share:
  """Host-local parts: the process's streams' if data.streams % count == 0, else every count-th."""
  return Share(index, count, c.streams if c.streams % count == 0 else 0)


@dataclasses.dataclass(frozen=True)
class Where:
  """A preparation's directory, and the settings its key was made from."""
  directory: str
  settings: dict
  complete: bool  # every seq_len asked for is there
  local: Share | None = None  # a preparation of this share's parts only
  parts_root: str = ""  # the parts folder this process prepared into ('' if none)


def prepare(data_config: DataSettings, seq_lens: Sequence[int], cache_dir: str,
            seed: int, local: Share | None = None,
            tokenizer: bpe.AnyTokenizer | None = None) -> Prepared:
  """Returns the data for every seq_len, preparing (only) what is not stored yet.

  With `local`, the data holds only that share's parts (a host-local cache:
  the hosts' data together are the whole corpus's).
  """
  seq_lens = _checked_seq_lens(seq_lens)
  made_cache_dir = not os.path.exists(cache_dir)
  try:
    where = prepare_parts(data_config, seq_lens, cache_dir, seed, tokenizer=tokenizer,
                          local=local)
    directory = finish(data_config, seq_lens, where, seed)
  except BaseException:
    if made_cache_dir:  # a failed run leaves no trace, not even an empty folder
      with contextlib.suppress(OSError):
        os.rmdir(cache_dir)
    raise
  return dataclasses.replace(load(directory, seq_lens), local=local)


def parts_count(c: DataSettings) -> int:
  """How many parts the corpus has."""
  return len(prep_parts.plan(c.corpus, corpus.resolve_format(c.corpus, c.format),
                               c.max_documents))


def _checked_seq_lens(seq_lens: Sequence[int]) -> list[int]:
  seq_lens = sorted({int(l) for l in seq_lens})
  for l in seq_lens:
    if l < MIN_SEQ_LEN:
      raise ConfigError(f"--config.train.seq_lens: {l} is too short; expected every seq_len "
                        f">= {MIN_SEQ_LEN}")
  return seq_lens


def load(directory: str, seq_lens: Sequence[int]) -> Prepared:
  """The complete preparation in `directory`."""
  tokenizer = bpe.load(os.path.join(directory, TOKENIZER_DIR))
  train, eval_ = {}, {}
  for l in seq_lens:
    train[l], eval_[l] = open_split(directory, l, "train"), open_split(directory, l, "eval")
  return Prepared(tokenizer=tokenizer, train=train, eval=eval_, directory=directory)


def vocabulary(c: DataSettings, seq_lens: Sequence[int], cache_dir: str, seed: int,
               hosts: int = 1) -> tuple[bpe.AnyTokenizer, str]:
  """The preparation's vocabulary (trained now if not stored) and the folder it is in.

  Stored means in the complete preparation, or in process 0's host-local one of
  `hosts` processes (a resumed run must not train it again), or in the parts folder.
  """
  cache_dir = os.path.abspath(cache_dir)
  key = _hash(_settings(c, seed))
  directory = os.path.join(cache_dir, key)
  complete = is_complete(directory)
  first_host = os.path.join(cache_dir, _hash(_key_settings(c, seed, host_share(c, 0, hosts))))
  if not complete and hosts > 1 and is_complete(first_host, repair=False):
    directory, complete = first_host, True
  if complete:
    where = os.path.join(directory, TOKENIZER_DIR)
    return bpe.load(where), where
  made_cache_dir = not os.path.exists(cache_dir)
  parts_root = _parts_root(cache_dir, directory, key,
                           _missing(directory, _checked_seq_lens(seq_lens), complete), complete)
  try:
    with writable(cache_dir):
      os.makedirs(parts_root, exist_ok=True)
      where = _shared_tokenizer(c, seed, parts_root, None)
  except BaseException:
    with contextlib.suppress(OSError):  # bad input leaves no empty folders
      os.rmdir(parts_root)
      if made_cache_dir:
        os.rmdir(cache_dir)
    raise
  return bpe.load(where), where


def prepare_parts(c: DataSettings, seq_lens: list[int], cache_dir: str, seed: int,
                  share: Share = Share(), tokenizer: bpe.AnyTokenizer | None = None,
                  local: Share | None = None) -> Where:
  """Prepares this process's share of the parts that are missing.

  `finish` then makes the preparation complete, once every share is done.
  `tokenizer` (another process's vocabulary) is used instead of training one.
  With `local`, the preparation holds that share's parts only (see `prepare`).
  """
  cache_dir = os.path.abspath(cache_dir)
  share = local or share
  settings = _key_settings(c, seed, local)
  key = _hash(settings)
  directory = os.path.join(cache_dir, key)
  outputs.remove_stale(cache_dir, f".{key}.tmp-")
  complete = is_complete(directory)
  if not complete and os.path.exists(directory):
    shutil.rmtree(directory)  # not made by this version's atomic rename: debris
  if complete:
    outputs.remove_stale(directory, ".seq")
  missing = _missing(directory, seq_lens, complete)
  if not missing:
    return Where(directory, settings, True, local)
  parts_root = _parts_root(cache_dir, directory, key, missing, complete)
  if share.index == 0:
    print(f"Preparing pre-training data from '{c.corpus}' for seq_len "
          f"{', '.join(map(str, missing))} in {directory}", flush=True)
  try:
    with writable(cache_dir):
      os.makedirs(parts_root, exist_ok=True)
      outputs.remove_stale(parts_root, "part-")
      tokenizer_dir = os.path.join(directory, TOKENIZER_DIR) if complete else (
          _shared_tokenizer(c, seed, parts_root, tokenizer))
      jobs = prep_merge.jobs(c, tokenizer_dir, parts_root, missing, seed)
      mine = _share_of(jobs, share)
      workers = prep_workers.worker_count(c.num_workers, len(mine))
      label = f" (process {share.index} of {share.count})" if share.count > 1 else ""
      others = [j for j in jobs if j not in mine] if local is None else []
      prep_workers.run(mine, workers, label, others)
  except BaseException as e:
    # Finished parts are kept for a rerun, unless the input is bad (nothing to resume).
    bad_input = isinstance(e, BertJaxError) and not isinstance(
        e, (prep_workers.PreparationError, CacheDirError))
    if bad_input or not any(n.startswith("part-") and ".tmp-" not in n
                            for n in (os.listdir(parts_root) if os.path.isdir(parts_root)
                                      else ())):
      shutil.rmtree(parts_root, ignore_errors=True)
    raise
  return Where(directory, settings, False, local, parts_root)


def _share_of(jobs: list[prep_write.PartJob], share: Share) -> list[prep_write.PartJob]:
  return [j for j in jobs if share.holds(j.part.index)]


def _missing(directory: str, seq_lens: list[int], complete: bool) -> list[int]:
  return [l for l in seq_lens if not (complete and os.path.isdir(seq_dir(directory, l)))]


def _parts_root(cache_dir: str, directory: str, key: str, seq_lens: list[int],
                complete: bool) -> str:
  """The hidden folder of the parts: one name for every process and every rerun."""
  name = f".parts-seq{'-'.join(map(str, seq_lens))}"
  return os.path.join(directory, name) if complete else os.path.join(cache_dir, f".{key}{name}")


def _shared_tokenizer(c: DataSettings, seed: int, parts_root: str,
                      given: bpe.AnyTokenizer | None) -> str:
  """The vocabulary every part is made with, stored once in the parts folder."""
  where = os.path.join(parts_root, TOKENIZER_DIR)
  if not os.path.isdir(where):
    tokenizer = given or make_tokenizer(c, seed)
    staging = f"{where}.tmp-{outputs.owner()}"
    tokenizer.save(staging)
    try:
      fs.rename(staging, where)
    except OSError:  # another process saved it first
      shutil.rmtree(staging, ignore_errors=True)
  return where


def finish(c: DataSettings, seq_lens: list[int], where: Where, seed: int) -> str:
  """Merges the complete parts into the preparation and makes it visible (atomic)."""
  if where.complete:
    return where.directory
  directory, settings = where.directory, where.settings
  cache_dir, key = os.path.split(directory)
  complete = is_complete(directory, repair=False)
  missing = _missing(directory, seq_lens, complete)
  if not missing:  # another run finished it first: the parts this one made are no one's
    if where.parts_root:
      shutil.rmtree(where.parts_root, ignore_errors=True)
    return directory
  parts_root = _parts_root(cache_dir, directory, key, missing, complete)
  tokenizer_dir = os.path.join(directory if complete else parts_root, TOKENIZER_DIR)
  jobs = prep_merge.jobs(c, tokenizer_dir, parts_root, missing, seed)
  if where.local is not None:
    jobs = _share_of(jobs, where.local)
  try:
    with writable(cache_dir):
      if complete:
        _add_seq_lens(c, directory, jobs, missing)
      else:
        _finish_fresh(c, settings, cache_dir, directory, jobs, missing)
  finally:  # merged, or the corpus fails a check of the whole: nothing to resume
    shutil.rmtree(parts_root, ignore_errors=True)
  return directory


def _finish_fresh(c: DataSettings, settings: dict, cache_dir: str, directory: str,
                  jobs: list[prep_write.PartJob], seq_lens: list[int]) -> None:
  staging = os.path.join(cache_dir, f".{os.path.basename(directory)}.tmp-{outputs.owner()}")
  try:
    os.makedirs(staging)
    stats = prep_merge.merge(c, jobs, {l: seq_dir(staging, l) for l in seq_lens})
    write_json(os.path.join(staging, STATS_FILE), stats)
    write_json(os.path.join(staging, SETTINGS_FILE), settings)
    shutil.copytree(jobs[0].tokenizer_dir, os.path.join(staging, TOKENIZER_DIR))
    check_corpus_unchanged(c, settings["corpus"])
    write_manifest(staging)
    try:
      fs.rename(staging, directory)  # atomic: the whole preparation appears at once
    except OSError:
      if not is_complete(directory, repair=False):  # not another process's finished copy
        raise
  finally:
    shutil.rmtree(staging, ignore_errors=True)


def _add_seq_lens(c: DataSettings, directory: str, jobs: list[prep_write.PartJob],
                  seq_lens: list[int]) -> None:
  """Adds seq_lens to a complete preparation, made with its stored tokenizer."""
  with fs.open(os.path.join(directory, SETTINGS_FILE), encoding="utf-8") as f:
    started_from = json.load(f)["corpus"]  # what the preparation's key was made from
  stagings = {l: os.path.join(directory, f".seq{l}.tmp-{outputs.owner()}") for l in seq_lens}
  try:
    prep_merge.merge(c, jobs, stagings)
    check_corpus_unchanged(c, started_from)
    for l, staging in stagings.items():
      fs.rename(staging, seq_dir(directory, l))
  finally:
    for staging in stagings.values():
      shutil.rmtree(staging, ignore_errors=True)


# --- settings ---


def _settings(c: DataSettings, seed: int) -> dict:
  """Everything that determines the data (checked in DataSettings); hashed into the cache key.

  Not `num_workers` nor `streams`: the examples are the same for any of them.
  """
  if c.vocab_file:
    with fs.open(c.vocab_file, "rb") as f:
      vocab = {"file_sha256": hashlib.sha256(f.read()).hexdigest()}
  else:
    vocab = {"trained_size": int(c.vocab_size), "sample_bytes": int(c.vocab_sample_bytes),
             **({"kind": c.tokenizer} if c.tokenizer != "wordpiece" else {})}
  vocab["lowercase"] = bool(c.lowercase)
  fingerprint = corpus.fingerprint(c.corpus)
  w = prep_write
  return {
      "data_version": DATA_VERSION,
      "corpus": fingerprint,
      "format": c.format, **({"field": c.field} if c.field != "text" else {}),
      "max_documents": int(c.max_documents),
      "vocab": vocab,
      "short_seq_prob": float(c.short_seq_prob),
      "dupe_factor": int(c.dupe_factor),
      # Absent when equal to dupe_factor (as before it existed), so older data stays valid.
      **({"eval_dupe_factor": c.eval_passes} if c.eval_passes != c.dupe_factor else {}),
      "eval_fraction": float(c.eval_fraction),
      "max_eval_examples": int(c.max_eval_examples),
      "seed": int(seed),
      # Absent for the defaults, so data prepared before these options existed stays valid.
      **({"objective": c.objective} if c.objective != "mlm+nsp" else {}),
      **({"packing": True} if c.packing else {}),
      "blocks": {"split_documents": w.SPLIT_BLOCK_DOCUMENTS, "split_chars": w.SPLIT_BLOCK_CHARS,
                 "window_documents": w.WINDOW_DOCUMENTS, "window_tokens": w.WINDOW_TOKENS,
                 **_part_size(c, fingerprint)},
  }


def _part_size(c: DataSettings, fingerprint: dict) -> dict:
  """The part size, in the key of a corpus that may have several parts: a corpus of
  text files over one part's size, and every TFDS corpus (its size is only known by
  opening it, which a start with complete data should not have to do)."""
  if c.max_documents:
    return {}
  if "tfds" in fingerprint:
    return {"tfds_part_examples": prep_parts.TFDS_PART_EXAMPLES}
  total = _corpus_bytes(c, fingerprint)
  return {"part_bytes": prep_parts.part_bytes(total)} if total > prep_parts.part_bytes_limit() else {}


def key(c: DataSettings, seed: int) -> str:  # the folder name in cache_dir of a whole corpus
  return _hash(_key_settings(c, seed, None))


def _key_settings(c: DataSettings, seed: int, local: Share | None) -> dict:
  settings = _settings(c, seed)
  if local is not None:  # another key: the data of one share
    settings["host_share"] = {"index": local.index, "count": local.count}
    if local.streams and local.streams != local.count:  # else the parts of index % count
      settings["host_share"]["streams"] = local.streams
  return settings


def _corpus_bytes(c: DataSettings, fingerprint: dict) -> int:
  if c.max_documents or not corpus.is_files(c.corpus):
    return 0
  files = [fingerprint] if "file" in fingerprint else fingerprint["files"]
  return sum(prep_parts.work_size(f["file"]) for f in files)  # as parts count it


def _hash(obj: Any) -> str:
  return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:12]


# --- documents: split, vocabulary ---


def documents(c: DataSettings, seed: int,
              stats: corpus.CorpusStats) -> Iterator[tuple[bool, list[str]]]:
  """(is_eval, document) for the whole corpus, part after part, as preparation splits it."""
  fmt = corpus.resolve_format(c.corpus, c.format)
  for part in prep_parts.plan(c.corpus, fmt, c.max_documents):
    yield from prep_write.part_documents(c, part, fmt, seed, stats)


def make_tokenizer(c: DataSettings, seed: int) -> bpe.AnyTokenizer:
  if c.vocab_file:
    return bpe.from_file(c.vocab_file, c.lowercase)
  # Train split only: the eval text must stay unseen, vocabulary included.
  def texts() -> Iterator[str]:  # read twice by Tokenizer.train, streamed both times
    return vocab_sample(documents(c, seed, corpus.CorpusStats()), c.vocab_sample_bytes)
  return bpe.train(c.tokenizer, texts, c.vocab_size, c.lowercase)


def vocab_sample(docs: Iterator[tuple[bool, list[str]]], max_chars: int) -> Iterator[str]:
  """Training sentences until `max_chars` of text; reading stops there."""
  n = 0
  for is_eval, doc in docs:
    if is_eval:
      continue
    for sentence in doc:
      yield sentence
      n += len(sentence)
    if n >= max_chars:
      return


# --- reading back ---


def open_split(directory: str, seq_len: int, split: str) -> ExampleSource:
  """The stored examples of one split at one seq_len (a complete preparation).

  Its info.json and shards are checked first (presence and recorded sizes):
  a mismatch is one PreparedDataError line naming the file.
  """
  where = seq_dir(directory, seq_len)
  problem = check_seq_dir(where)
  if problem is not None:
    raise PreparedDataError(f"prepared data {problem}; expected the files its preparation "
                            f"recorded: rerun (dataset.prepare prepares a damaged seq_len "
                            f"again) or delete {where}")
  with fs.open(os.path.join(where, INFO_FILE), encoding="utf-8") as f:
    info = json.load(f)
  prefix = os.path.join(where, split)
  counts = info["shards"][split]
  source = ExampleSource([shard_path(prefix, i) for i in range(len(counts))], counts, seq_len,
                         info["dtype"])
  if split == "train" and "train_parts" in info:  # absent in data prepared before streams
    source.parts = list(zip(info["train_parts"]["index"], info["train_parts"]["records"]))
  return source
