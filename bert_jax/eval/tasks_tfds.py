"""`tfds:glue/<task>` tasks: GLUE read from a TFDS data dir where it is already built.

Never downloads: `tfds.builder` finds the dataset in the data dir (`data_dir`,
else $TFDS_DATA_DIR, else ~/tensorflow_datasets) and `tfds.data_source`
reads it as array_record (`tfds build glue/cola --file_format=array_record`),
so TensorFlow is not needed. Splits train, validation(_matched/_mismatched)
become dev(_...), test(_...); the text features of each GLUE config map to
text_a/text_b; labels are the dataset's ClassLabel names in its id order,
and label -1 (test) is None. No JAX here.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Optional

from bert_jax.errors import TaskError
from bert_jax.eval.task_types import (GLUE, CLASSIFICATION, GLUE_TASKS, REGRESSION, TFDS_PREFIX,
                                 Example, Task, metric_names)

_TFDS_SPLITS = {"train": "train", "validation": "dev", "validation_matched": "dev_matched",
                "validation_mismatched": "dev_mismatched", "test": "test",
                "test_matched": "test_matched", "test_mismatched": "test_mismatched"}
# (text_a, text_b) features of GLUE's TFDS configs, tried in order.
_TFDS_TEXTS = (("question1", "question2"), ("sentence1", "sentence2"),
               ("premise", "hypothesis"), ("question", "sentence"), ("sentence", None))


def _tfds_data_dir(data_dir: Optional[str]) -> str:
  return os.path.abspath(os.path.expanduser(
      data_dir or os.environ.get("TFDS_DATA_DIR") or "~/tensorflow_datasets"))


def tfds_examples(records: Sequence[dict], kind: str, where: str) -> list[Example]:
  """GLUE TFDS records (dicts of features) as Examples; label -1 (test) is None."""
  if not records:
    return []
  first = records[0]
  for a, b in _TFDS_TEXTS:
    if a in first and (b is None or b in first):
      break
  else:
    raise TaskError(f"{where}: no text features (it has: {', '.join(sorted(first))}); "
                    "expected GLUE's sentence/sentence1/sentence2/question/question1/"
                    "question2/premise/hypothesis")
  if "label" not in first:
    raise TaskError(f"{where}: no 'label' feature (it has: {', '.join(sorted(first))})")
  text = lambda x: x.decode("utf-8") if isinstance(x, bytes) else str(x)
  out = []
  for r in records:
    label = r["label"]
    if kind == REGRESSION:
      label = float(label)
    else:
      label = None if int(label) < 0 else int(label)
    out.append(Example(text(r[a]), text(r[b]) if b else None, label))
  return out


def load(spec: str, data_dir: Optional[str] = None) -> Task:
  """The task `tfds:glue/<task>` names, fully read; not built there is a TaskError."""
  name = spec[len(TFDS_PREFIX):]
  task = name.split("/", 1)[1] if name.startswith("glue/") else ""
  if task not in GLUE:
    raise TaskError(f"task '{spec}': expected tfds:glue/<task> with <task> one of "
                    f"{', '.join(GLUE_TASKS)}")
  import tensorflow_datasets as tfds  # heavy: only for tfds: tasks
  where = _tfds_data_dir(data_dir)
  built = f"build it once with `tfds build {name} --data_dir {where} --file_format=array_record`"
  try:
    # download=False: never starts a download-and-prepare; it must be built already.
    builder = tfds.builder(name, data_dir=where)
    if not os.path.isdir(str(builder.data_dir)) or not builder.info.splits:
      raise FileNotFoundError(builder.data_dir)
    split_names = list(builder.info.splits)
    sources = {s: tfds.data_source(name, split=s, data_dir=where, download=False)
               for s in split_names if s in _TFDS_SPLITS}
  except Exception as e:  # TFDS raises many types here; all mean "not usable as is"
    detail = (str(e).strip().splitlines() or [type(e).__name__])[0]
    raise TaskError(f"TFDS dataset '{name}' is not built as array_record in {where} "
                    f"({built}): {detail[:200]}") from None
  label = builder.info.features["label"]
  kind = REGRESSION if task == "stsb" else CLASSIFICATION
  labels = tuple(label.names) if kind == CLASSIFICATION else ()
  splits = {}
  for s, source in sources.items():
    getitems = getattr(source, "__getitems__", None)
    idx = list(range(len(source)))
    records = getitems(idx) if getitems else [source[i] for i in idx]
    splits[_TFDS_SPLITS[s]] = tfds_examples(records, kind, f"TFDS {name} split {s}")
  eval_splits = GLUE[task].eval_files
  for s in ("train",) + eval_splits:
    if not splits.get(s):
      raise TaskError(f"TFDS dataset '{name}' in {where} has no examples in its "
                      f"{'validation' + s[3:] if s.startswith('dev') else s} split")
  return Task(task, kind, labels, splits, metric_names(task, kind), eval_splits)
