"""Data set-up of a run: prepare once, and agree on it across processes.

With several processes, process 0 makes the vocabulary (trained once, on its
sample) and every other process uses it. Then, when every process sees the
same cache (process 0's vocabulary file is visible to all), they prepare the
parts of the corpus together, process i the parts with index % P == i, each
with its host's workers, and process 0 merges them and makes the data visible
once all are done. Otherwise (a cache per host) every host prepares the whole
corpus with process 0's vocabulary, all at the same time. Any process's
failure stops every process with one line (see `_agree`).
"""

import dataclasses
import json
import os
import tempfile
from typing import Callable

import jax
import numpy as np
from jax.experimental import multihost_utils

from bert_jax.data import dataset
from bert_jax.errors import BertJaxError, ConfigError
from bert_jax.settings import DataSettings
from bert_jax.data.tokenizer import Tokenizer


def prepare_data(data: DataSettings, seq_lens: list[int], seed: int,
                 workdir: str) -> dataset.Prepared:
  """The prepared examples of every seq_len (prepared now if not stored yet)."""
  cache_dir = data.cache_dir or os.path.join(workdir, "prepared")
  if jax.process_count() == 1:
    return dataset.prepare(data, seq_lens, cache_dir, seed)
  return _prepare_data_multiprocess(data, seq_lens, cache_dir, seed)


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
  msg = json.loads(_broadcast_from_process_0(json.dumps(mine)))
  if error is not None:
    raise error
  if "error" in msg:
    cls = BertJaxError if msg["user_error"] else RuntimeError
    raise cls(f"process 0 could not prepare the data: {msg['error']}")
  # Every process's view of the cache: shared only if all see process 0's vocabulary.
  shared = all(m["sees"] for m in _gather_json({"sees": os.path.isdir(msg["where"])}))
  tokenizer = Tokenizer(msg["vocab"], msg["lowercase"])
  if shared:
    share = dataset.Share(me, count)
    where = _agree(lambda: dataset.prepare_parts(data, seq_lens, cache_dir, seed, share,
                                                 tokenizer))
    directory = _agree(lambda: dataset.finish(data, seq_lens, where, seed) if me == 0 else "")
    directory = _broadcast_from_process_0(directory)
    return dataset.load(directory, sorted(set(seq_lens)))
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


def _vocabulary_message(data: DataSettings, seq_lens: list[int], cache_dir: str,
                        seed: int) -> dict:
  tokenizer, where = dataset.vocabulary(data, seq_lens, cache_dir, seed)
  return {"vocab": tokenizer.vocab, "lowercase": tokenizer.lowercase, "where": where}


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


def _broadcast_from_process_0(text: str) -> str:
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
