"""`config.data`, `config.masking` and `config.objective`: what data preparation reads
and the name lists its choices come from (data/ imports them from here).
"""

from __future__ import annotations

import dataclasses

import ml_collections

from bert_jax.errors import ConfigError
from bert_jax.settings.checks import fail, is_int
from bert_jax.storage import urls

FORMATS = ("auto", "plain", "tab", "jsonl", "parquet")  # `config.data.format` (data/corpus)
OBJECTIVES = ("mlm+nsp", "mlm", "mlm+sop")  # `config.objective` (data/pretraining_data)
TOKENIZERS = ("wordpiece", "bpe")  # `config.data.tokenizer`: the kind of a trained vocabulary (data/bpe)


@dataclasses.dataclass(frozen=True)
class SourceSettings:
  """One source of a mixture (`config.data.sources`): a corpus spec and its share."""
  name: str
  corpus: str
  weight: float = 1.0
  field: str = "text"
  format: str = "auto"


_SOURCE_KEYS = ("weight", "field", "format")
_SOURCE_FORM = ("'NAME=SPEC[,weight=W][,field=F][,format=X]', e.g. "
                "'web=gs://b/fineweb/*.parquet,weight=0.7'")


def parse_source(entry: str) -> SourceSettings:
  """'NAME=SPEC[,weight=W][,field=F][,format=X]' -> SourceSettings (a spec holds no ',')."""
  where = f"--config.data.sources entry {entry!r}"
  if not isinstance(entry, str) or "=" not in entry:
    raise ConfigError(f"{where}: expected {_SOURCE_FORM}")
  name, _, rest = entry.partition("=")
  spec, *options = rest.split(",")
  if not name.strip() or not name.replace("_", "").replace("-", "").isalnum() or not spec:
    raise ConfigError(f"{where}: expected a name of letters, digits, '_' or '-', then "
                      f"'=' and a corpus: {_SOURCE_FORM}")
  given: dict = {}
  for option in options:
    key, eq, value = option.partition("=")
    if key not in _SOURCE_KEYS or not eq or key in given:
      raise ConfigError(f"{where}: option {option!r}; expected each of "
                        f"{', '.join(_SOURCE_KEYS)} at most once, as key=value")
    given[key] = value
  if "weight" in given:
    raw = given["weight"]
    try:
      given["weight"] = float(raw)
    except ValueError:
      given["weight"] = float("nan")
    if not 0 < given["weight"] < float("inf"):
      raise ConfigError(f"{where}: weight={raw!r}; expected a positive number")
  if given.get("format", "auto") not in FORMATS:
    raise ConfigError(f"{where}: format={given['format']!r}; expected one of "
                      f"{', '.join(FORMATS)}")
  return SourceSettings(name.strip(), spec, **given)


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
  # A mixture (data/mixture): named sources, each prepared on its own, drawn by weight.
  sources: tuple[str, ...] = ()
  temperature: float = 0.0  # p_i ∝ weight_i * tokens_i ** temperature (0: the weights)
  # Per phase (a stage's mixture): the sources' weights, one tuple per phase, and the
  # temperature, one per phase; () = the sources' weights and `temperature` throughout.
  phase_weights: tuple = ()
  phase_temperatures: tuple = ()

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
    if not isinstance(self.sources, (tuple, list)):
      raise fail("data.sources", self.sources, f"a tuple of {_SOURCE_FORM}")
    mixture = self.mixture  # parsed: a bad entry is one line now
    if mixture and self.corpus != "builtin":
      raise ConfigError(f"--config.data.corpus={self.corpus!r} and --config.data.sources: "
                        "expected one of them (a mixture's corpora are its sources)")
    if len({m.name for m in mixture}) != len(mixture):
      raise fail("data.sources", tuple(self.sources), "each source's NAME once")
    if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) \
        or not 0 <= self.temperature <= 1:
      raise fail("data.temperature", self.temperature, "a number in [0, 1] (p_i ∝ weight_i * "
                 "tokens_i ** temperature; 0 = the weights alone, 1 = the sizes)")
    self._check_phase_mixture(mixture)
    if mixture and self.streams != 1:
      raise fail("data.streams", self.streams, "1 with --config.data.sources (a mixture "
                 "draws each batch's rows by weight, not by stream)")
    if mixture and self.max_documents:
      raise fail("data.max_documents", self.max_documents, "0 with --config.data.sources")
    if self.vocab_sample_bytes < 1:
      raise fail("data.vocab_sample_bytes", self.vocab_sample_bytes, ">= 1")
    if not self.vocab_file and self.vocab_size < 1:
      raise fail("data.vocab_size", self.vocab_size, "a positive integer")
    problem = urls.local_file_problem(self.vocab_file) if self.vocab_file else ""
    if problem:
      raise ConfigError(f"--config.data.vocab_file: '{self.vocab_file}' {problem}; expected a "
                        "vocab.txt file (one token per line, or a HuggingFace tokenizer.json)")

  def _check_phase_mixture(self, mixture: tuple) -> None:
    if (self.phase_weights or self.phase_temperatures) and not mixture:
      raise fail("data.phase_weights", tuple(self.phase_weights), "() without "
                 "--config.data.sources (they weigh a mixture's sources in each phase)")
    # A weight may be 0: the source is not drawn in that phase (mmBERT adds languages in
    # later stages); every phase draws from at least one.
    weight = lambda w: (isinstance(w, (int, float)) and not isinstance(w, bool)
                        and 0 <= w < float("inf"))
    for weights in self.phase_weights:
      if not isinstance(weights, (tuple, list)) or len(weights) != len(mixture) or not all(
          weight(w) for w in weights) or not any(w > 0 for w in weights):
        raise fail("data.phase_weights", tuple(self.phase_weights), f"one tuple per phase of "
                   f"{len(mixture)} weights >= 0 (at least one positive), one per source in "
                   "order, e.g. '((0.7, 0.3, 0), (0.5, 0.3, 0.2))'")
    for t in self.phase_temperatures:
      if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= 1:
        raise fail("data.phase_temperatures", tuple(self.phase_temperatures),
                   "one number in [0, 1] per phase, e.g. '(0.7, 0.5, 0.3)'")

  def phase_mix(self, phase: int) -> tuple[tuple[float, ...], float]:
    """(the sources' weights, the temperature) of phase `phase`."""
    weights = (tuple(self.phase_weights[phase]) if self.phase_weights
               else tuple(m.weight for m in self.mixture))
    temperature = self.phase_temperatures[phase] if self.phase_temperatures else self.temperature
    return tuple(float(w) for w in weights), float(temperature)

  @property
  def mixture(self) -> tuple[SourceSettings, ...]:
    """The parsed sources; () for a single corpus."""
    return tuple(parse_source(e) for e in self.sources)

  def of_source(self, source: SourceSettings, vocab_file: str) -> "DataSettings":
    """The settings that prepare one source: its corpus, with the mixture's vocabulary."""
    return dataclasses.replace(self, corpus=source.corpus, field=source.field,
                               format=source.format, sources=(), temperature=0.0,
                               phase_weights=(), phase_temperatures=(), vocab_file=vocab_file)

  @property
  def is_bpe(self) -> bool:  # a tokenizer.json given, or a vocabulary trained as 'bpe'
    return self.vocab_file.endswith(".json") if self.vocab_file else self.tokenizer == "bpe"


@dataclasses.dataclass(frozen=True)
class MaskingSettings:
  """`config.masking`: the share of tokens chosen, and whole-word masking; and
  `config.eval.mask_prob`, the share an evaluation masks (0: the phase's training rate)."""
  mask_prob: float = 0.15
  whole_word: bool = False
  eval_mask_prob: float = 0.15

  def __post_init__(self):
    if not 0.0 < self.mask_prob < 1.0:
      raise fail("masking.mask_prob", self.mask_prob, "0 < p < 1")
    if isinstance(self.eval_mask_prob, bool) or not isinstance(
        self.eval_mask_prob, (int, float)) or not 0.0 <= self.eval_mask_prob < 1.0:
      raise fail("eval.mask_prob", self.eval_mask_prob, "0 < p < 1, or 0 for the training rate")

  def eval_rate(self, phase) -> float:
    """The rate an evaluation in `phase` masks: eval.mask_prob, or the phase's last."""
    return self.eval_mask_prob or phase.mask_prob_at(phase.end - 1, self.mask_prob)


def data_settings(config: ml_collections.ConfigDict) -> DataSettings:
  """The checked data settings of `config` alone: what `dataset.prepare` takes."""
  data = config.data.to_dict()
  data.pop("extend_vocab", None)  # read by InitSettings: it changes the vocabulary file
  for k in ("sources", "phase_weights", "phase_temperatures"):
    data[k] = tuple(tuple(v) if isinstance(v, list) else v for v in (data.get(k) or ()))
  return DataSettings(**data, objective=config.get("objective", "mlm+nsp"))
