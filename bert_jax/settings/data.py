"""`config.data`, `config.masking` and `config.objective`: what data preparation reads
and the name lists its choices come from (data/ imports them from here).
"""

from __future__ import annotations

import dataclasses

import ml_collections

from bert_jax.errors import ConfigError
from bert_jax.settings.checks import fail, is_int
from bert_jax.storage import retries

FORMATS = ("auto", "plain", "tab", "jsonl", "parquet")  # `config.data.format` (data/corpus)
OBJECTIVES = ("mlm+nsp", "mlm", "mlm+sop")  # `config.objective` (data/pretraining_data)
TOKENIZERS = ("wordpiece", "bpe")  # `config.data.tokenizer`: the kind of a trained vocabulary (data/bpe)


@dataclasses.dataclass(frozen=True)
class DataSettings:
  """What data preparation reads (`config.data`, and `config.objective`)."""
  corpus: str = "builtin"
  format: str = "auto"
  field: str = "text"  # the text of a JSONL record or Parquet row (data/records)
  vocab_file: str = ""
  vocab_size: int = 30522
  vocab_sample_bytes: int = 100_000_000
  lowercase: bool = True
  tokenizer: str = "wordpiece"  # a trained vocabulary's kind (TOKENIZERS)
  short_seq_prob: float = 0.1
  dupe_factor: int = 5
  eval_dupe_factor: int = 0  # 0 = dupe_factor
  eval_fraction: float = 0.05
  max_eval_examples: int = 2048
  max_documents: int = 0
  cache_dir: str = ""
  num_workers: int = 0  # 0 = the host's usable cores; not part of the data's key
  streams: int = 1  # example streams (parts p with p % streams == s): how batches are drawn
  objective: str = "mlm+nsp"  # `config.objective`: which examples are made
  packing: bool = False  # 'mlm' rows hold several documents' spans (data/packing)

  @property
  def eval_passes(self) -> int:
    """Passes over the eval documents, each with fresh pairs and split points."""
    return self.eval_dupe_factor or self.dupe_factor

  def __post_init__(self):
    if self.objective not in OBJECTIVES:
      raise fail("objective", self.objective,
                  f"one of {', '.join(map(repr, OBJECTIVES))}")
    if self.packing not in (True, False) or (self.packing and self.objective != "mlm"):
      raise fail("data.packing", self.packing, "True only with --config.objective='mlm' (a "
                  "row of NSP/SOP is one sentence pair: nothing to pack), or False")
    if not 0.0 < self.eval_fraction < 1.0:
      raise fail("data.eval_fraction", self.eval_fraction, "a fraction in (0, 1)")
    if self.max_eval_examples < 0:
      raise fail("data.max_eval_examples", self.max_eval_examples, ">= 0 (0 = no cap)")
    if self.dupe_factor < 1:
      raise fail("data.dupe_factor", self.dupe_factor, ">= 1")
    if not is_int(self.eval_dupe_factor) or self.eval_dupe_factor < 0:
      raise fail("data.eval_dupe_factor", self.eval_dupe_factor, ">= 0 (0 = data.dupe_factor)")
    if not 0.0 <= self.short_seq_prob <= 1.0:
      raise fail("data.short_seq_prob", self.short_seq_prob, "a probability in [0, 1]")
    if self.max_documents < 0:
      raise fail("data.max_documents", self.max_documents, ">= 0 (0 = all)")
    if not is_int(self.num_workers) or self.num_workers < 0:
      raise fail("data.num_workers", self.num_workers, ">= 0 (0 = this host's cores)")
    if not is_int(self.streams) or self.streams < 1:
      raise fail("data.streams", self.streams, "an integer >= 1")
    if self.format not in FORMATS:
      raise fail("data.format", self.format, f"one of {', '.join(FORMATS)}")
    if not isinstance(self.field, str) or not self.field:
      raise fail("data.field", self.field, "the name of the records' text field (JSONL) or "
                 "column (Parquet)")
    if self.tokenizer not in TOKENIZERS:
      raise fail("data.tokenizer", self.tokenizer, f"one of {', '.join(map(repr, TOKENIZERS))}")
    if self.vocab_sample_bytes < 1:
      raise fail("data.vocab_sample_bytes", self.vocab_sample_bytes, ">= 1")
    if not self.vocab_file and self.vocab_size < 1:
      raise fail("data.vocab_size", self.vocab_size, "a positive integer")
    problem = retries.local_file_problem(self.vocab_file) if self.vocab_file else ""
    if problem:
      raise ConfigError(f"--config.data.vocab_file: '{self.vocab_file}' {problem}; expected a "
                        "vocab.txt file (one token per line, or a HuggingFace tokenizer.json)")

  @property
  def is_bpe(self) -> bool:  # a tokenizer.json given, or a vocabulary trained as 'bpe'
    return self.vocab_file.endswith(".json") if self.vocab_file else self.tokenizer == "bpe"


@dataclasses.dataclass(frozen=True)
class MaskingSettings:
  """`config.masking`: the share of tokens chosen, and whole-word masking."""
  mask_prob: float = 0.15
  whole_word: bool = False

  def __post_init__(self):
    if not 0.0 < self.mask_prob < 1.0:
      raise fail("masking.mask_prob", self.mask_prob, "0 < p < 1")


def data_settings(config: ml_collections.ConfigDict) -> DataSettings:
  """The checked data settings of `config` alone: what `dataset.prepare` takes."""
  data = config.data.to_dict()
  data.pop("extend_vocab", None)  # read by InitSettings: it changes the vocabulary file
  return DataSettings(**data, objective=config.get("objective", "mlm+nsp"))
