"""What a downstream task is: examples, labels, splits, metrics, and GLUE's file layouts.

The types the loaders (bert_jax.eval.tasks, tasks_tfds, word_order), the probe
and fine-tuning share. No JAX here.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Sequence
from typing import Optional, Union

CLASSIFICATION, REGRESSION = "classification", "regression"
TFDS_PREFIX = "tfds:"
BUILTIN_TASKS = ("word_order",)  # shipped with the repo: bert_jax.eval.word_order


@dataclasses.dataclass(frozen=True)
class Example:
  text_a: str
  text_b: Optional[str]  # None for single-sentence tasks
  label: Union[int, float, None]  # class id, float (regression), None (unlabelled test)


@dataclasses.dataclass(frozen=True)
class Task:
  name: str
  kind: str  # "classification" | "regression"
  labels: tuple[str, ...]  # class names in id order; () for regression
  splits: dict[str, list[Example]]  # "train", "dev" (or MNLI's two), optional "test..."
  metric_names: tuple[str, ...]
  eval_splits: tuple[str, ...]  # ("dev",) or ("dev_matched", "dev_mismatched")

  @property
  def num_classes(self) -> int:
    return 1 if self.kind == REGRESSION else len(self.labels)

  def summary(self) -> str:
    """One line: name, kind, classes and split sizes."""
    sizes = ", ".join(f"{k} {len(v)}" for k, v in self.splits.items())
    kind = (f"{len(self.labels)} classes" if self.kind == CLASSIFICATION else "regression")
    return f"{self.name}: {kind}; {sizes}"


def inputs(examples: Sequence[Example]) -> list:
  """What features.Extractor.extract takes: text_a, or (text_a, text_b) for pairs."""
  return [e.text_a if e.text_b is None else (e.text_a, e.text_b) for e in examples]


def metric_names(name: str, kind: str) -> tuple[str, ...]:
  """GLUE's metric(s) for task `name`; accuracy (classification) or Pearson/Spearman."""
  if name == "cola":
    return ("mcc",)
  if name in ("mrpc", "qqp"):
    return ("f1", "accuracy")
  return ("pearson", "spearman") if kind == REGRESSION else ("accuracy",)


# ----------------------------------------------------------------------------
# GLUE directories


@dataclasses.dataclass(frozen=True)
class Glue:
  name: str
  header: Optional[tuple[str, ...]]  # train/dev header; None: headerless (CoLA)
  text_a: str  # column names (CoLA: of its implied header)
  text_b: Optional[str]
  label_col: str  # "LAST" or a column name
  labels: tuple[str, ...]  # () for regression
  test_header: tuple[str, ...]
  eval_files: tuple[str, ...] = ("dev",)
  test_files: tuple[str, ...] = ("test",)


LAST = "LAST"
BINARY = ("0", "1")
_NLI2 = ("entailment", "not_entailment")
COLA_COLUMNS = ("source", "label", "original_label", "sentence")
_MNLI_TRAIN = ("index", "promptID", "pairID", "genre", "sentence1_binary_parse",
               "sentence2_binary_parse", "sentence1_parse", "sentence2_parse", "sentence1",
               "sentence2", "label1", "gold_label")
GLUE = {g.name: g for g in (
    Glue("cola", None, "sentence", None, "label", BINARY, ("index", "sentence")),
    Glue("sst2", ("sentence", "label"), "sentence", None, LAST, BINARY, ("index", "sentence")),
    Glue("mrpc", ("Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"), "#1 String",
          "#2 String", "Quality", BINARY, ("index", "#1 ID", "#2 ID", "#1 String", "#2 String")),
    Glue("stsb", ("index", "genre", "filename", "year", "old_index", "source1", "source2",
                   "sentence1", "sentence2", "score"), "sentence1", "sentence2", LAST, (),
          ("index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1",
           "sentence2")),
    Glue("qqp", ("id", "qid1", "qid2", "question1", "question2", "is_duplicate"), "question1",
          "question2", LAST, BINARY, ("id", "question1", "question2")),
    Glue("mnli", _MNLI_TRAIN, "sentence1", "sentence2", LAST,
          ("contradiction", "entailment", "neutral"), _MNLI_TRAIN[:10],
          ("dev_matched", "dev_mismatched"), ("test_matched", "test_mismatched")),
    Glue("qnli", ("index", "question", "sentence", "label"), "question", "sentence", LAST,
          _NLI2, ("index", "question", "sentence")),
    Glue("rte", ("index", "sentence1", "sentence2", "label"), "sentence1", "sentence2", LAST,
          _NLI2, ("index", "sentence1", "sentence2")),
    Glue("wnli", ("index", "sentence1", "sentence2", "label"), "sentence1", "sentence2", LAST,
          BINARY, ("index", "sentence1", "sentence2")),
)}
GLUE_TASKS = tuple(GLUE)
GLUE_DISPLAY = "CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE, WNLI"


def glue_name(dirname: str) -> Optional[str]:
  key = re.sub(r"[-_ ]", "", os.path.basename(os.path.normpath(dirname)).lower())
  return key if key in GLUE else None
