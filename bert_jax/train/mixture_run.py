"""A mixture in a run (`config.data.sources`): its vocabulary, its sources prepared, the
mixed data, and the tokens drawn from each source.

- Vocabulary: `data.vocab_file`, or one trained by process 0 on a sample of every
  source (`data.vocab_sample_bytes` shared by weight), stored once under the cache
  (keyed by the sources' data keys and weights) and sent to the other processes.
- Sources: each prepared as a corpus of its own (`data_setup.prepare_data`, with that
  vocabulary as its `vocab_file`), so each is keyed by its own content, and a new
  weight or temperature needs no new preparation.
- Mixed: `data/mixture.MixedSource` per sequence length; the shares
  p_i ∝ weight_i * tokens_i ** temperature, from each source's corpus tokens
  (stats.json), and the rows that give them from its mean tokens per example.
- Report: `MixtureTokens` counts the real tokens of each source in each batch, summed
  over processes at the log points, for metrics.jsonl and the console.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import shutil
from collections.abc import Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils

from bert_jax import console
from bert_jax.data import bpe, corpus, dataset, mixture
from bert_jax.data.prep_store import STATS_FILE
from bert_jax.errors import ConfigError
from bert_jax.settings import DataSettings, Phase
from bert_jax.settings.data import SourceSettings
from bert_jax.storage import fs, outputs
from bert_jax.storage.workdir import Workdir, opened
from bert_jax.train import data_setup

_MEAN_SAMPLE = 16_384  # examples read to measure a source's mean tokens per example


def prepare(data: DataSettings, seq_lens: list[int], seed: int, workdir: Workdir,
            phases: Sequence[Phase] = ()) -> dataset.Prepared:
  """The mixed data of every seq_len: each source prepared (if not stored) as a corpus
  of its own, all with one vocabulary."""
  sources = data.mixture
  # Bucket sources copied to this host first: the vocabulary's key and sample read them.
  local = tuple(dataclasses.replace(s, corpus=data_setup.local_inputs(
      data.of_source(s, data.vocab_file)).corpus) for s in sources)
  vocab_file = data.vocab_file or _vocabulary(data, local, seed, workdir)
  prepared = []
  for src, here in zip(sources, local):
    console.log(f"mixture source '{src.name}': {src.corpus}")
    prepared.append(data_setup.prepare_data(data.of_source(here, vocab_file), seq_lens, seed,
                                            workdir))
  return combine(data, prepared, seq_lens, phases)


def combine(data: DataSettings, prepared: Sequence[dataset.Prepared],
            seq_lens: Sequence[int], phases: Sequence[Phase] = ()) -> dataset.Prepared:
  """The sources' prepared data as one: per seq_len a MixedSource of their train splits
  (drawn by weight; each of `phases` by its own weights and temperature, where
  data.phase_weights or data.phase_temperatures give them) and of their eval splits
  (read in order)."""
  sources = data.mixture
  names = [s.name for s in sources]
  local = {p.local for p in prepared}
  if len(local) > 1:
    raise ConfigError("--config.data.sources on several hosts without a shared cache: some "
                      "sources are prepared per host and some whole; expected a cache_dir "
                      "every host shares (or a bucket)")
  tokens = [_corpus_tokens(p.directory) for p in prepared]
  shares = mixture.token_shares([s.weight for s in sources], tokens, data.temperature)
  train, eval_, means = {}, {}, {}
  for l in sorted(set(seq_lens)):
    means[l] = [_mean_tokens(p.train[l], p.directory, l) for p in prepared]
    counts = mixture.block_counts(mixture.row_shares(shares, means[l]))
    train[l] = mixture.MixedSource([p.train[l] for p in prepared], names, shares, counts)
    eval_[l] = mixture.MixedSource([p.eval[l] for p in prepared], names, shares)
  if data.phase_weights or data.phase_temperatures:
    for ph in phases:
      weights, temperature = data.phase_mix(ph.index)
      p = mixture.token_shares(weights, tokens, temperature)
      train[ph.seq_len].phases[ph.index] = (
          p, mixture.block_counts(mixture.row_shares(p, means[ph.seq_len])))
      console.log(f"mixture in phase {ph.index}: tokens asked {mixture.describe(names, p)} "
                  f"(temperature {temperature:g})")
  eval_sizes = None
  if prepared[0].eval_sizes is not None:
    eval_sizes = {l: [sum(x) for x in zip(*(p.eval_sizes[l] for p in prepared))]
                  for l in prepared[0].eval_sizes}
  console.log(f"mixture of {len(sources)} sources, tokens asked: "
              f"{mixture.describe(names, shares)} (temperature {data.temperature:g})")
  return dataclasses.replace(prepared[0], train=train, eval=eval_, eval_sizes=eval_sizes)


def _corpus_tokens(directory: str) -> float:
  with fs.open(os.path.join(directory, STATS_FILE), encoding="utf-8") as f:
    return float(json.load(f)["tokens"])


def _mean_tokens(source, directory: str, seq_len: int) -> float:
  """Mean real tokens per training example: all of them, or an even sample of 16,384."""
  n = len(source)
  if n == 0:
    raise ConfigError(f"mixture source {directory} has no training examples at length "
                      f"{seq_len}; expected a corpus that makes some (a larger one)")
  at = np.unique(np.linspace(0, n - 1, min(n, _MEAN_SAMPLE)).astype(np.int64))
  mask = mixture.read_examples(source, at.tolist()).input_mask_BxL
  return float(np.asarray(mask).sum()) / len(at)


# --- the vocabulary ---


def _vocabulary(data: DataSettings, sources: Sequence[SourceSettings], seed: int,
                workdir: Workdir) -> str:
  """The path of the mixture's trained vocabulary on this host (made by process 0). On a
  bucket cache it is kept in the bucket too: a host that lost its disk gets the same one
  (a WordPiece vocabulary trained again can differ: huggingface/tokenizers#1794)."""
  cache_dir = data.cache_dir or opened(workdir).prepared
  copy = fs.local_copy_dir(cache_dir)  # a bucket cache: this host's copy of it
  home = copy or os.path.abspath(cache_dir)
  settings = [data.of_source(s, "") for s in sources]
  key = hashlib.sha256(json.dumps([[dataset.key(c, seed) for c in settings],
                                   [s.weight for s in sources]]).encode()).hexdigest()[:12]
  folder = f"mixture-vocab-{key}"
  name = bpe.TOKENIZER_JSON if data.tokenizer == bpe.KIND else "vocab.txt"
  where = os.path.join(home, folder)
  path = os.path.join(where, name)
  remote = fs.join(cache_dir, folder, name) if copy is not None else None
  text = ""
  if jax.process_index() == 0:
    if not os.path.isfile(path) and remote and fs.exists(remote):
      os.makedirs(where, exist_ok=True)
      fs.download(remote, path)
    if not os.path.isfile(path):
      _train(data, settings, seed, where)
      if remote:
        fs.upload(path, remote)
    text = fs.read_text(path)
  if jax.process_count() > 1:
    text = data_setup.broadcast_from_process_0(text)
    if jax.process_index() != 0 and not os.path.isfile(path):
      os.makedirs(where, exist_ok=True)
      fs.write_atomic_local(path, lambda f: f.write(text.encode()))
  return path


def _train(data: DataSettings, settings: list[DataSettings], seed: int, where: str) -> None:
  weights = np.asarray([s.weight for s in data.mixture], np.float64)
  budget = [max(1, int(data.vocab_sample_bytes * w / weights.sum())) for w in weights]
  console.log(f"training a {data.tokenizer} vocabulary of {data.vocab_size} on "
              f"{data.vocab_sample_bytes} characters of the {len(settings)} sources, by weight")

  def texts():
    return itertools.chain.from_iterable(
        dataset.vocab_sample(dataset.documents(c, seed, corpus.CorpusStats()), n)
        for c, n in zip(settings, budget))

  tokenizer = bpe.train(data.tokenizer, texts, data.vocab_size, data.lowercase)
  staging = f"{where}.tmp-{outputs.owner()}"
  try:
    tokenizer.save(staging)
    try:
      fs.rename(staging, where)
    except OSError:  # another run saved it first: the same vocabulary
      if not os.path.isdir(where):
        raise
  finally:
    shutil.rmtree(staging, ignore_errors=True)


# --- what was drawn ---


class MixtureTokens:
  """Real tokens drawn from each source: this interval's, and the session's."""

  def __init__(self, source: mixture.MixedSource):
    self.names, self.shares = source.names, source.shares  # the phase's (`add`)
    self.interval = np.zeros(len(source.names), np.float64)
    self.total = np.zeros(len(source.names), np.float64)
    self.asked = np.zeros(len(source.names), np.float64)  # each interval's total by its shares

  def add(self, source: mixture.MixedSource, indices: np.ndarray,
          input_mask_BxL: np.ndarray) -> None:
    """A host's batch: its rows' indices in `source` (the phase's), and their masks."""
    which = source.source_of(indices)
    self.shares = source.shares  # a phase may have a mixture of its own
    self.interval += np.bincount(which, weights=np.asarray(input_mask_BxL).sum(1),
                                 minlength=len(self.interval))

  def metrics(self) -> dict[str, float]:
    """The interval's tokens per source (every process's), for the log row; starts the next."""
    drawn = self.interval
    if jax.process_count() > 1:
      drawn = np.asarray(multihost_utils.process_allgather(drawn)).reshape(-1, len(drawn)).sum(0)
    self.total += drawn
    self.asked += drawn.sum() * np.asarray(self.shares)
    self.interval = np.zeros_like(self.interval)
    share = drawn / max(drawn.sum(), 1.0)
    out = {}
    for name, n, s, asked in zip(self.names, drawn, share, self.shares):
      out |= {f"tokens_{name}": float(n), f"token_share_{name}": float(s),
              f"token_share_asked_{name}": float(asked)}
    return out

  def describe(self) -> str:
    return mixture.describe(self.names, self.asked / max(self.asked.sum(), 1.0), self.total)
