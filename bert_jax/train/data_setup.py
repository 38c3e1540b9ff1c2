"""Data set-up of a run: prepare once, and agree on it across processes.

Process 0 prepares; with several processes the others then use its
vocabulary, whatever their storage (see `_prepare_data_multiprocess`).
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
from bert_jax.data.tokenizer import VOCAB_FILE, Tokenizer


def prepare_data(data: DataSettings, seq_lens: list[int], seed: int,
                 workdir: str) -> dataset.Prepared:
  """The prepared examples of every seq_len (prepared now if not stored yet)."""
  cache_dir = data.cache_dir or os.path.join(workdir, "prepared")
  prepare = lambda d: dataset.prepare(d, seq_lens, cache_dir, seed)
  if jax.process_count() == 1:
    return prepare(data)
  return _prepare_data_multiprocess(data, cache_dir, prepare)


def _prepare_data_multiprocess(data: DataSettings, cache_dir: str,
                               prepare: Callable) -> dataset.Prepared:
  """Process 0 prepares; the others then use its vocabulary, whatever their storage.

  No other process trains its own vocabulary (another host's `tokenizers`
  version could learn another one): on
  shared storage they load process 0's files; on a host-local cache they
  build the same (seeded) examples from process 0's vocabulary.
  """
  prepared, error = None, None
  if jax.process_index() == 0:
    try:
      prepared = prepare(data)
    except Exception as e:  # pylint: disable=broad-except
      error = e
  # Every process waits here for process 0's result, and a failure there
  # stops them all instead of leaving them blocked in the next collective.
  if error is not None:
    mine = {"error": f"{type(error).__name__}: {' '.join(str(error).split())}",
            "user_error": isinstance(error, BertJaxError)}
  elif prepared is not None:
    mine = {"key": os.path.basename(prepared.directory), "vocab": prepared.tokenizer.vocab,
            "lowercase": prepared.tokenizer.lowercase}
  else:
    mine = {}  # not process 0: only its message is read
  msg = json.loads(_broadcast_from_process_0(json.dumps(mine)))
  if error is not None:
    raise error
  if "error" in msg:
    cls = BertJaxError if msg["user_error"] else RuntimeError
    raise cls(f"process 0 could not prepare the data: {msg['error']}")
  if jax.process_index() != 0:
    own = os.path.join(os.path.abspath(cache_dir), msg["key"], dataset.TOKENIZER_DIR, VOCAB_FILE)
    if data.vocab_file or os.path.isfile(own):
      prepared = prepare(data)  # process 0's files on shared storage, or this host's own
    else:
      with tempfile.TemporaryDirectory() as tmp:
        vocab_file = Tokenizer(msg["vocab"], msg["lowercase"]).save(tmp)
        prepared = prepare(dataclasses.replace(data, vocab_file=vocab_file,
                                               lowercase=msg["lowercase"]))
    if prepared.tokenizer.vocab != msg["vocab"]:
      raise ConfigError(
          f"config.data.cache_dir: process {jax.process_index()}'s prepared data "
          f"{prepared.directory} has another vocabulary than process 0's; share the cache "
          "directory between hosts, delete it on this host, or set config.data.vocab_file")
  return prepared


def _broadcast_from_process_0(text: str) -> str:
  """Process 0's `text` on every process (a collective: all must call it)."""
  data = np.frombuffer(text.encode(), np.uint8)
  n = int(multihost_utils.broadcast_one_to_all(np.int32(data.size)))
  buf = data if jax.process_index() == 0 else np.zeros(n, np.uint8)
  return bytes(np.asarray(multihost_utils.broadcast_one_to_all(buf))).decode()
