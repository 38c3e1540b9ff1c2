"""Data set-up of a run: prepare once, and agree on it across processes.

With several processes, process 0 makes the vocabulary (trained once, on its
sample) and every other process uses it. Then, when every process sees the
same cache (a probe file process 0 writes in it), they prepare the
parts of the corpus together, process i the parts with index % P == i, each
with its host's workers, and process 0 merges them and makes the data visible
once all are done. Otherwise (a cache per host) process i prepares and reads
only the parts of its example streams when data.streams S is a multiple of P
(part p is stream p % S; process i has streams [i*S/P, (i+1)*S/P): batches
as on a shared cache), else the parts i, i+P, ... (`dataset.host_share`;
input_pipeline's `per_host`), or, for a corpus of fewer parts than
processes, the whole corpus, all hosts at the same time. Any process's failure stops every process with one line (`_agree`).
"""

import dataclasses
import json
import os
import shutil
import secrets
import tempfile
from typing import Callable

import jax
import numpy as np
from jax.experimental import multihost_utils

from bert_jax import console
from bert_jax.data import dataset, prep_merge
from bert_jax.data.prep_store import MANIFEST_FILE as MANIFEST
from bert_jax.errors import BertJaxError, ConfigError
from bert_jax.storage import fs, outputs
from bert_jax.storage.workdir import Workdir, opened
from bert_jax.settings import DataSettings
from bert_jax.data import bpe
from bert_jax.data.bpe import AnyTokenizer


def prepare_data(data: DataSettings, seq_lens: list[int], seed: int,
                 workdir: Workdir) -> dataset.Prepared:
  """The prepared examples of every seq_len (prepared now if not stored yet)."""
  cache_dir = data.cache_dir or opened(workdir).prepared
  data = local_inputs(data)
  local_copy = fs.local_copy_dir(cache_dir)
  if local_copy is not None:  # a bucket: prepared once into it, read from each host's copy
    return _check_streams(data, _prepare_through_bucket(data, seq_lens, seed, cache_dir,
                                                        local_copy))
  if jax.process_count() == 1:
    return _check_streams(data, dataset.prepare(data, seq_lens, cache_dir, seed))
  return _check_streams(data, _prepare_data_multiprocess(data, seq_lens, cache_dir, seed))


def local_inputs(data: DataSettings) -> DataSettings:
  """A corpus (file, glob or folder of objects) or vocabulary in a bucket, copied to this
  host's disk first (fs.local_mirror: only what is missing or changed), since the data
  code reads local files; the copies keep the objects' sizes and times, so the prepared
  data's key is the same on every host."""
  note = lambda: console.log(f"copying {data.corpus} to this host (once; kept in "
                             f"{fs.mirror_root()})")
  corpus = fs.local_mirror(data.corpus, before_copy=note)
  vocab_file = fs.local_mirror(data.vocab_file) if data.vocab_file else data.vocab_file
  return dataclasses.replace(data, corpus=corpus, vocab_file=vocab_file)


def _prepare_through_bucket(data: DataSettings, seq_lens: list[int], seed: int,
                            bucket_dir: str, local: str) -> dataset.Prepared:
  """Prepared once into the bucket, read from a copy on each host's disk.

  The input pipeline reads records by random access, which wants local files. So
  process 0 copies a complete preparation down from the bucket (a preempted spot VM
  lost its disk), or prepares it here and uploads it (its manifest last: a bucket
  preparation without one is never used); then every other host copies it down.
  Each copy is checked against the manifest's sizes before use (dataset.prepare's
  `is_complete`), and the bytes are those of a local preparation: resume stays exact.
  """
  key = dataset.key(data, seed)
  remote = fs.join(bucket_dir, key)
  if jax.process_index() == 0:
    _copy_down(remote, local, key)
    prepared = dataset.prepare(data, seq_lens, local, seed)
    _copy_up(prepared.directory, remote)
  if jax.process_count() == 1:
    return prepared
  multihost_utils.sync_global_devices("bert_jax:prepared_in_bucket")
  if jax.process_index() != 0:
    _copy_down(remote, local, key)
    prepared = dataset.prepare(data, seq_lens, local, seed)  # complete: read, not prepared
  return prepared


def _copy_down(remote: str, local: str, key: str) -> None:
  here = os.path.join(local, key)
  if dataset.is_complete(here, repair=False) or not fs.exists(fs.join(remote, MANIFEST)):
    return
  console.log(f"copying prepared data {remote} to {here}")
  staging = os.path.join(local, f".{key}.tmp-{outputs.owner()}")
  copied = fs.local_mirror(remote, root=staging)
  shutil.rmtree(here, ignore_errors=True)
  fs.replace(copied, here)  # whole, or not at all
  shutil.rmtree(staging, ignore_errors=True)


def _copy_up(directory: str, remote: str) -> None:
  """The files the bucket lacks (a seq_len added later: its folder), the manifest last."""
  have = set(_objects(remote)) if fs.listdir_or_empty(remote) else set()
  names = sorted(os.path.relpath(os.path.join(d, f), directory)
                 for d, _, files in os.walk(directory) for f in files)
  todo = [n for n in names if n not in have
          and not any(part.startswith(".") for part in n.split(os.sep))]  # no debris
  if not todo:
    return
  console.log(f"copying prepared data {directory} to {remote}")
  for name in sorted(todo, key=lambda n: n == MANIFEST):
    fs.upload(os.path.join(directory, name), fs.join(remote, name))


def _objects(remote: str) -> list[str]:
  return [os.path.relpath(p, remote) for p in fs.find(remote)]


def _check_streams(data: DataSettings, prepared: dataset.Prepared) -> dataset.Prepared:
  """Every example stream has parts in the merged data (host-local: checked before)."""
  if data.streams == 1 or prepared.local is not None:
    return prepared
  parts = getattr(next(iter(prepared.train.values())), "parts", None)
  if parts and len(parts) < data.streams:
    raise ConfigError(f"--config.data.streams={data.streams}: corpus '{data.corpus}' has "
                      f"{len(parts)} part(s), fewer than the streams; expected at least one "
                      "part per stream (use fewer streams)")
  return prepared


def _prepare_data_multiprocess(data: DataSettings, seq_lens: list[int], cache_dir: str,
                               seed: int) -> dataset.Prepared:
  """Process 0's vocabulary for all; the parts shared out on a shared cache."""
  me, count = jax.process_index(), jax.process_count()
  mine, error = {}, None
  if me == 0:
    try:
      mine = _vocabulary_message(data, seq_lens, cache_dir, seed)
    except Exception as e:  # pylint: disable=broad-except
      mine, error = _failure(e), e
  # Every process waits here for process 0's vocabulary, and a failure there
  # stops them all instead of leaving them blocked in the next collective.
  msg = json.loads(broadcast_from_process_0(json.dumps(mine)))
  if error is not None:
    raise error
  if "error" in msg:
    cls = BertJaxError if msg["user_error"] else RuntimeError
    raise cls(f"process 0 could not prepare the data: {msg['error']}")
  # Shared only if every process finds process 0's probe in its own cache_dir.
  probe = os.path.join(os.path.abspath(cache_dir), f".probe-{msg['probe']}")
  shared = all(m["sees"] for m in _gather_json({"sees": os.path.exists(probe)}))
  if me == 0:
    os.remove(probe)
  tokenizer = bpe.from_meta(msg, "process 0's tokenizer")
  if shared:
    share = dataset.Share(me, count)
    where = _agree(lambda: dataset.prepare_parts(data, seq_lens, cache_dir, seed, share,
                                                 tokenizer))
    directory = _agree(lambda: dataset.finish(data, seq_lens, where, seed) if me == 0 else "")
    directory = broadcast_from_process_0(directory)
    return dataset.load(directory, sorted(set(seq_lens)))
  if data.streams % count == 0 and data.streams > 1:
    if msg["parts"] < data.streams:
      raise ConfigError(f"--config.data.streams={data.streams}: corpus '{data.corpus}' has "
                        f"{msg['parts']} part(s), fewer than the streams; expected at least "
                        "one part per stream (use fewer streams)")
    return _prepare_host_local(data, seq_lens, cache_dir, seed, msg, tokenizer)
  if msg["parts"] >= count:  # every host prepares and reads only its own parts
    if me == 0:
      console.warn(f"warning: --config.data.streams={data.streams} is not a multiple of the "
                   f"{count} processes: host-local caches sample per host, so batches differ "
                   "from a shared cache's and from other process counts; set "
                   "--config.data.streams to a multiple of the process count")
    return _prepare_host_local(data, seq_lens, cache_dir, seed, msg, tokenizer)
  if me == 0 or data.vocab_file:
    prepared = _agree(lambda: dataset.prepare(data, seq_lens, cache_dir, seed))
  else:
    with tempfile.TemporaryDirectory() as tmp:
      vocab_file = tokenizer.save(tmp)
      mine = dataclasses.replace(data, vocab_file=vocab_file, lowercase=tokenizer.lowercase)
      prepared = _agree(lambda: dataset.prepare(mine, seq_lens, cache_dir, seed))
  if prepared.tokenizer.vocab != msg["vocab"]:
    raise ConfigError(
        f"config.data.cache_dir: process {me}'s prepared data {prepared.directory} has another "
        "vocabulary than process 0's; share the cache directory between hosts, delete it on "
        "this host, or set config.data.vocab_file")
  return prepared


def _prepare_host_local(data: DataSettings, seq_lens: list[int], cache_dir: str, seed: int,
                        msg: dict, tokenizer: AnyTokenizer) -> dataset.Prepared:
  """Host-local caches: process i prepares and reads its streams' parts, or, without
  streams (data.streams not a multiple of P), the parts i, i+P, ... only."""
  me, count = jax.process_index(), jax.process_count()

  def mine() -> dataset.Prepared:
    if me == 0:
      prep_merge.discard_unused(msg["where"])  # its vocabulary goes into the share's data
    elif dataset.parts_count(data) != msg["parts"]:
      raise ConfigError(f"config.data.corpus: '{data.corpus}' on process {me} has "
                        f"{dataset.parts_count(data)} parts, on process 0 {msg['parts']}; "
                        "expected the same corpus on every host")
    return dataset.prepare(data, seq_lens, cache_dir, seed,
                           dataset.host_share(data, me, count), tokenizer)

  prepared = _agree(mine)
  if prepared.tokenizer.vocab != msg["vocab"]:
    raise ConfigError(
        f"config.data.cache_dir: process {me}'s prepared data {prepared.directory} has another "
        "vocabulary than process 0's; delete it on this host, or set config.data.vocab_file")
  sizes = _gather_json({str(l): len(src) for l, src in prepared.eval.items()})
  return dataclasses.replace(prepared, eval_sizes={l: [s[str(l)] for s in sizes]
                                                   for l in prepared.eval})


def _vocabulary_message(data: DataSettings, seq_lens: list[int], cache_dir: str,
                        seed: int) -> dict:
  tokenizer, where = dataset.vocabulary(data, seq_lens, cache_dir, seed, jax.process_count())
  probe = secrets.token_hex(8)  # a file only processes that share this cache_dir see
  with fs.open(os.path.join(os.path.abspath(cache_dir), f".probe-{probe}"), "w",
            encoding="utf-8"):
    pass
  return {**bpe.to_meta(tokenizer), "where": where,
          "parts": dataset.parts_count(data), "probe": probe}


def _failure(e: BaseException) -> dict:
  """A failure as a message to the other processes."""
  return {"error": f"{type(e).__name__}: {' '.join(str(e).split())}",
          "user_error": isinstance(e, BertJaxError)}


def _agree(fn: Callable):
  """fn()'s result on every process, or, if any process failed, its error everywhere.

  A collective: all processes call it, so none is left waiting in the next one.
  """
  result, error = None, None
  try:
    result = fn()
  except Exception as e:  # pylint: disable=broad-except
    error = e
  everyone = _gather_json({} if error is None else _failure(error))
  if error is not None:
    raise error
  for i, msg in enumerate(everyone):
    if "error" in msg:
      cls = BertJaxError if msg["user_error"] else RuntimeError
      raise cls(f"process {i} could not prepare the data: {msg['error']}")
  return result


def broadcast_from_process_0(text: str) -> str:
  """Process 0's `text` on every process (a collective: all must call it)."""
  data = np.frombuffer(text.encode(), np.uint8)
  n = int(multihost_utils.broadcast_one_to_all(np.int32(data.size)))
  buf = data if jax.process_index() == 0 else np.zeros(n, np.uint8)
  return bytes(np.asarray(multihost_utils.broadcast_one_to_all(buf))).decode()


def _gather_json(obj) -> list:
  """Every process's `obj` (JSON-able), in process order (a collective)."""
  data = np.frombuffer(json.dumps(obj).encode(), np.uint8)
  sizes = np.asarray(multihost_utils.process_allgather(np.int32(data.size))).reshape(-1)
  buf = np.zeros(int(sizes.max()), np.uint8)
  buf[:data.size] = data
  rows = np.asarray(multihost_utils.process_allgather(buf)).reshape(len(sizes), -1)
  return [json.loads(bytes(row[:n]).decode()) for row, n in zip(rows, sizes.tolist())]
