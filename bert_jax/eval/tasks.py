"""Downstream tasks: examples, labels and splits read from GLUE, plain TSV, TFDS or built-ins.

`load_task(spec)` reads one task into memory (GLUE's largest, QQP and MNLI,
are a few hundred MB of text) and returns a `Task`; the probe and fine-tuning
both take it. `spec` is one of:

- a directory in the official GLUE distribution's layout (what
  download_glue_data.py writes), recognised from its name (CoLA, SST-2, MRPC,
  STS-B, QQP, MNLI, QNLI, RTE, WNLI; case, '-' and '_' ignored) or else from
  train.tsv's header. Every file is read as GLUE ships it: tab-separated,
  UTF-8, csv.QUOTE_NONE (quotes are text), a header except CoLA's train/dev:
    CoLA   train/dev: no header, 4 columns source, label, original label, sentence;
           test: `index sentence`
    SST-2  `sentence label`; test `index sentence`
    MRPC   `Quality #1 ID #2 ID #1 String #2 String`; test `index #1 ID #2 ID #1 String #2 String`
    STS-B  10 columns `index genre filename year old_index source1 source2 sentence1
           sentence2 score` (float score 0..5: regression); test without `score`
    QQP    `id qid1 qid2 question1 question2 is_duplicate`; test `id question1 question2`
    MNLI   train 12 columns from `index promptID pairID genre ...` to `sentence1 sentence2
           label1 gold_label`; dev_matched.tsv and dev_mismatched.tsv (16 columns, five
           annotator labels before gold_label); test_matched.tsv / test_mismatched.tsv
    QNLI   `index question sentence label`
    RTE, WNLI  `index sentence1 sentence2 label`
  Texts are found by header name; the label is the last field (MRPC: the first,
  CoLA: the second), as in BERT's reference processors, so a row may carry more
  fields than the header but never fewer. Labels are GLUE's fixed label sets
  below, in sorted order (so "1" is class 1 where F1 counts it as positive).
  Test files have no labels (`Example.label` None).
- a plain task directory: train.tsv and dev.tsv (test.tsv optional), tab-separated,
  csv.QUOTE_NONE, header `label<TAB>text` or `label<TAB>text<TAB>text_b`
  (test.tsv: the same header, whose label column is ignored, or one without
  `label`). The task is a regression when every train label is a number and
  at least one is not an integer literal (`0.5`, `3.0`, `1e-2`): labels `0`/`1`/`2`
  or words are classes. Class names are the train labels, sorted (numerically
  when all are integers); a dev label not seen in train is an error.
- `tfds:glue/<task>` (e.g. `tfds:glue/cola`), read from a TFDS data dir
  (`data_dir`, else $TFDS_DATA_DIR, else ~/tensorflow_datasets) where it is
  already built as array_record (`tfds build glue/cola --file_format=array_record`):
  never downloaded. Splits train, validation(_matched/_mismatched) as dev(_...),
  test(_...); labels are the dataset's ClassLabel names in its own id order
  (bert_jax.eval.tasks_tfds).
- a built-in task shipped with the repo: `word_order` (bert_jax.eval.word_order).

A relative directory is also looked up under `data_dir`. Bad input raises
TaskError: one line naming the file (and line) and what was expected.

No JAX here: the data side of evaluation stays importable without it.
"""

from __future__ import annotations

import csv
import io
import math
import os
import sys
from collections.abc import Sequence
from typing import Optional

from bert_jax.errors import TaskError
from bert_jax.storage import fs
# The types are re-exported: callers write tasks.load_task, tasks.Task, tasks.inputs.
from bert_jax.eval.task_types import (BINARY, BUILTIN_TASKS, CLASSIFICATION, COLA_COLUMNS, GLUE,
                                GLUE_DISPLAY, GLUE_TASKS, LAST, REGRESSION, TFDS_PREFIX, Example,
                                Glue, Task, glue_name, inputs, metric_names)

def _text(path: str) -> str:
  if not os.path.isfile(path):
    raise TaskError(f"task file {path} does not exist")
  with fs.open(path, "rb") as f:
    data = f.read()
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError as e:
    line = data[:e.start].count(b"\n") + 1
    raise TaskError(f"task file {path}: line {line} is not UTF-8 (byte 0x{data[e.start]:02x}); "
                    "expected UTF-8 text") from None


def _rows(path: str) -> list[tuple[int, list[str]]]:
  """(line number, fields) of every non-blank line, read as GLUE ships TSVs."""
  reader = csv.reader(io.StringIO(_text(path), newline=""), delimiter="\t",
                      quoting=csv.QUOTE_NONE)
  out = []
  # The csv module's field limit (128 KiB) guards against runaway quoting; with quotes
  # off and the file in memory already, a long text is just long (truncated later).
  limit = csv.field_size_limit((1 << 31) - 1)
  try:
    for fields in reader:
      if fields and any(x.strip() for x in fields):
        out.append((reader.line_num, fields))
  except csv.Error as e:
    raise TaskError(f"task file {path}: line {reader.line_num}: {e}; expected "
                    "tab-separated fields") from None
  finally:
    csv.field_size_limit(limit)
  if not out:
    raise TaskError(f"task file {path} is empty; expected tab-separated examples")
  out[0][1][0] = out[0][1][0].lstrip("\ufeff")  # a byte order mark is not a column name
  return out


def _first_row(path: str) -> list[str]:
  """The first non-blank line's fields (a header, or CoLA's first example)."""
  with fs.open(path, "rb") as f:
    head = f.read(1 << 16)
  lines = [l for l in head.split(b"\n") if l.strip()]
  if not lines:
    return _rows(path)[0][1]  # raises the one-line error (empty, not UTF-8)
  try:
    first = lines[0].decode("utf-8").rstrip("\r")
  except UnicodeDecodeError:
    return _rows(path)[0][1]
  return first.lstrip("\ufeff").split("\t")


def _tsv(cells: Sequence[str]) -> str:
  return "<TAB>".join(cells)


def _columns(path: str, header: list[str], want: Sequence[str], what: str) -> dict[str, int]:
  """Index of each wanted column name in `header`, or a TaskError naming the first missing."""
  for name in want:
    if name not in header:
      raise TaskError(f"{path}: header has no column '{name}' (header: '{_tsv(header)}'); "
                      f"expected {what}")
  return {name: header.index(name) for name in want}


def _read_glue_file(g: Glue, path: str, labelled: bool) -> list[tuple[int, str, str, str]]:
  """(line, text_a, text_b or None, raw label or None) per example of one GLUE file."""
  rows = _rows(path)
  if labelled and g.header is None:  # CoLA train/dev: headerless, exactly 4 columns
    header, body = list(COLA_COLUMNS), rows
    what = "CoLA's 4 headerless columns source, label, original label, sentence"
  else:
    header, body = rows[0][1], rows[1:]
    expected = g.header if labelled else g.test_header
    what = f"{g.name.upper()}'s header '{_tsv(expected)}'"
  texts = [g.text_a] + ([g.text_b] if g.text_b else [])
  label_name = None
  if labelled:
    label_name = header[-1] if g.label_col == LAST else g.label_col
    if g.header is not None and g.label_col == LAST and header[-1] != g.header[-1]:
      raise TaskError(f"{path}: header ends with '{header[-1]}'; expected {what} "
                      f"(labels in the last column, '{g.header[-1]}')")
  cols = _columns(path, header, texts + ([label_name] if labelled else []), what)
  if not body:
    raise TaskError(f"{path}: a header but no examples; expected at least one example")
  out = []
  for line, fields in body:
    if len(fields) < len(header):
      raise TaskError(f"{path}: line {line} has {len(fields)} tab-separated fields; "
                      f"expected {len(header)} ({what})")
    label = None
    if labelled:
      label = fields[-1] if g.label_col == LAST else fields[cols[label_name]]
    out.append((line, fields[cols[g.text_a]], fields[cols[g.text_b]] if g.text_b else None,
                label))
  return out


def _parse_float(raw: str, path: str, line: int) -> float:
  try:
    x = float(raw)
  except ValueError:
    x = math.nan
  if not math.isfinite(x):
    raise TaskError(f"{path}: line {line}: label '{raw}' is not a finite number; "
                    "expected a float score")
  return x


def _labelled(rows, path: str, kind: str, labels: tuple[str, ...], where: str) -> list[Example]:
  ids = {name: i for i, name in enumerate(labels)}
  out = []
  for line, a, b, raw in rows:
    if kind == REGRESSION:
      label = _parse_float(raw, path, line)
    else:
      if raw not in ids:
        raise TaskError(f"{path}: line {line}: label '{raw}' is not one of {where} "
                        f"({', '.join(labels)})")
      label = ids[raw]
    out.append(Example(a, b, label))
  return out


def _load_glue(name: str, directory: str) -> Task:
  g = GLUE[name]
  kind = REGRESSION if not g.labels else CLASSIFICATION
  where = f"{name.upper()}'s labels"
  splits = {}
  for split in ("train",) + g.eval_files:
    path = os.path.join(directory, f"{split}.tsv")
    splits[split] = _labelled(_read_glue_file(g, path, True), path, kind, g.labels, where)
  for split in g.test_files:
    path = os.path.join(directory, f"{split}.tsv")
    if os.path.exists(path):
      splits[split] = [Example(a, b, None) for _, a, b, _ in _read_glue_file(g, path, False)]
  return Task(name, kind, g.labels, splits, metric_names(name, kind), g.eval_files)


def _recognise_header(header: list[str]) -> Optional[str]:
  """The GLUE task whose train.tsv starts with `header` (RTE/WNLI share theirs: None)."""
  # MNLI's train header is matched on its first columns (its dev files have more).
  matches = [g.name for g in GLUE.values() if g.header is not None and (
      header == list(g.header) or (g.name == "mnli" and header[:4] == list(g.header[:4])))]
  if len(matches) == 1:
    return matches[0]
  if not matches and len(header) == 4 and header[1] in BINARY:
    return "cola"  # headerless: the first line is already an example
  return None


# ----------------------------------------------------------------------------
# Plain task directories


_PLAIN_HEADERS = (["label", "text"], ["label", "text", "text_b"])


def _is_int(raw: str) -> bool:
  try:
    int(raw)
    return True
  except ValueError:
    return False


def _is_float(raw: str) -> bool:
  try:
    return math.isfinite(float(raw))
  except ValueError:
    return False


def _read_plain(path: str, pair: Optional[bool], test: bool = False):
  """(rows, pair): rows (line, text_a, text_b, raw label); `pair` must match when given."""
  rows = _rows(path)
  header = rows[0][1]
  allowed = [h for h in _PLAIN_HEADERS if pair is None or (len(h) == 3) == pair]
  if test:
    allowed += [h[1:] for h in allowed]
  if header not in allowed:
    raise TaskError(f"{path}: header '{_tsv(header)}'; expected "
                    + " or ".join(f"'{_tsv(h)}'" for h in allowed))
  if len(rows) == 1:
    raise TaskError(f"{path}: a header but no examples; expected at least one example")
  has_label = header[0] == "label"
  out = []
  for line, fields in rows[1:]:
    if len(fields) != len(header):
      raise TaskError(f"{path}: line {line} has {len(fields)} tab-separated fields; "
                      f"expected {len(header)} ('{_tsv(header)}')")
    t = fields[1:] if has_label else fields
    out.append((line, t[0], t[1] if len(t) > 1 else None, fields[0] if has_label else None))
  return out, "text_b" in header


def _load_plain(directory: str) -> Task:
  train_path = os.path.join(directory, "train.tsv")
  dev_path = os.path.join(directory, "dev.tsv")
  train, pair = _read_plain(train_path, None)
  raw = [r[3] for r in train]
  if all(_is_float(x) for x in raw) and not all(_is_int(x) for x in raw):
    kind, labels = REGRESSION, ()
  else:
    kind = CLASSIFICATION
    labels = tuple(sorted(set(raw), key=int) if all(_is_int(x) for x in raw)
                   else sorted(set(raw)))
  if not os.path.isfile(dev_path):
    raise TaskError(f"task directory {directory} has no dev.tsv; expected train.tsv and "
                    "dev.tsv (header 'label<TAB>text[<TAB>text_b]')")
  dev, _ = _read_plain(dev_path, pair)
  splits = {"train": _labelled(train, train_path, kind, labels, "the train labels"),
            "dev": _labelled(dev, dev_path, kind, labels, "the train labels")}
  test_path = os.path.join(directory, "test.tsv")
  if os.path.exists(test_path):
    splits["test"] = [Example(a, b, None) for _, a, b, _ in _read_plain(test_path, pair, True)[0]]
  name = os.path.basename(os.path.normpath(directory))
  return Task(name, kind, labels, splits, metric_names(name, kind), ("dev",))


# ----------------------------------------------------------------------------
# Entry point


# A dev split below this many examples gives an accuracy that moves in steps of over 2%.
SMALL_DEV = 50


def load_task(spec: str, data_dir: Optional[str] = None) -> Task:
  """The task `spec` names (module docstring), fully read and checked; bad input is a
  TaskError (a train split of one class), a dev split too small to tell is a warning."""
  if isinstance(spec, str):  # a task folder in a bucket is read from a local copy
    spec = fs.local_mirror(spec)
  task = _load_task(spec, data_dir)
  check_usable(task)
  return task


def check_usable(task: Task) -> None:
  """Refuses a classification task whose train split has one class (a head of one
  output scores 1.0 on anything); warns of a dev split too small to tell models apart."""
  if task.kind == CLASSIFICATION:
    seen = {e.label for e in task.splits.get("train", ())}
    if len(seen) < 2:
      only = f" ('{task.labels[next(iter(seen))]}')" if seen else ""
      raise TaskError(f"task {task.name}: its train split has {len(seen)} class{only}; "
                      "expected examples of at least two classes")
  for split in task.eval_splits:
    n = len(task.splits.get(split, ()))
    if n < SMALL_DEV:
      print(f"warning: task {task.name}: {split} has {n} example(s), so its accuracy moves "
            f"in steps of {1 / max(n, 1):.2f} (± {0.5 / max(n, 1) ** 0.5:.2f} at best); "
            f"expected at least {SMALL_DEV}", file=sys.stderr, flush=True)


def _load_task(spec: str, data_dir: Optional[str] = None) -> Task:
  if not isinstance(spec, str) or not spec.strip():
    raise TaskError(f"task {spec!r}: expected a task directory, tfds:glue/<task> or a "
                    "built-in task name")
  if spec.startswith(TFDS_PREFIX):
    from bert_jax.eval import tasks_tfds  # TFDS is heavy: imported for tfds: tasks only
    return tasks_tfds.load(spec, data_dir)
  directory = os.path.expanduser(spec)
  if not os.path.isdir(directory) and data_dir and not os.path.isabs(directory):
    if os.path.isdir(os.path.join(data_dir, directory)):
      directory = os.path.join(data_dir, directory)
  if not os.path.isdir(directory):
    if spec == "word_order":
      from bert_jax.eval import word_order
      return word_order.load()
    if os.path.exists(directory):
      raise TaskError(f"task {spec} is a file; expected a task directory (train.tsv, dev.tsv)")
    raise TaskError(f"task '{spec}': no such directory"
                    + (f" (nor under {data_dir})" if data_dir else "")
                    + f"; expected a GLUE or plain task directory, tfds:glue/<task> or a "
                    f"built-in task ({', '.join(BUILTIN_TASKS)})")
  train = os.path.join(directory, "train.tsv")
  if not os.path.isfile(train):
    raise TaskError(f"task directory {directory} has no train.tsv; expected train.tsv and "
                    f"dev.tsv (a plain task or a GLUE task: {GLUE_DISPLAY})")
  header = _first_row(train)
  if header in _PLAIN_HEADERS:
    return _load_plain(directory)
  name = glue_name(directory) or _recognise_header(header)
  if name is None:
    raise TaskError(f"{train}: header '{_tsv(header)}' is neither 'label<TAB>text"
                    f"[<TAB>text_b]' nor a GLUE task's; expected a plain task, or a GLUE "
                    f"directory named after its task ({GLUE_DISPLAY})")
  return _load_glue(name, directory)
