"""The parts of a preparation, and their merge into one prepared dataset.

The dataset is the parts' records concatenated in part order: each seq_len's
info.json lists every part's shards, renumbered in that order (hard links to
the part's files, so the parts stay intact until the dataset is visible).
`max_eval_examples` is applied here, on the concatenation: a part writes at
most that many eval records, and the merge lists only the first
`max_eval_examples` of all parts (the last shard it uses may be listed with
fewer records than it holds; readers read only what info.json lists). The
counts that need the whole corpus (two documents per split at least) are
checked on the totals.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from typing import TYPE_CHECKING

from bert_jax.data import corpus, prep_parts, prep_write
from bert_jax.data.prep_store import INFO_FILE, shard_path, write_json
from bert_jax.errors import CorpusError
from bert_jax.storage import fs

if TYPE_CHECKING:
  from bert_jax.settings import DataSettings

SPLITS = ("train", "eval")


def jobs(c: DataSettings, tokenizer_dir: str, parts_root: str, seq_lens: list[int],
         seed: int) -> list[prep_write.PartJob]:
  """One job per part of the corpus, in part order."""
  fmt = corpus.resolve_format(c.corpus, c.format)
  tuning = prep_write.tuning()
  return [prep_write.PartJob(c, part, fmt, tokenizer_dir,
                              os.path.join(parts_root, f"part-{part.index:05d}"),
                              tuple(seq_lens), seed, tuning)
          for part in prep_parts.plan(c.corpus, fmt, c.max_documents)]


def missing(parts: list[prep_write.PartJob]) -> list[prep_write.PartJob]:
  """The jobs whose part is not complete yet."""
  return [j for j in parts if not os.path.exists(os.path.join(j.directory,
                                                              prep_write.PART_FILE))]


def _read_part(job: prep_write.PartJob) -> dict:
  with fs.open(os.path.join(job.directory, prep_write.PART_FILE), encoding="utf-8") as f:
    return json.load(f)


def merge(c: DataSettings, parts: list[prep_write.PartJob], out_dirs: dict[int, str]) -> dict:
  """Links every part's shards into `out_dirs` (one per seq_len) with their info.json;
  returns the stats of the whole preparation."""
  found = [_read_part(j) for j in parts]
  stats = _merged_stats(found)
  for split, n in stats["documents_by_split"].items():
    if n < prep_write.MIN_DOCS_PER_SPLIT:
      name = "training" if split == "train" else "evaluation"
      raise CorpusError(f"corpus '{c.corpus}' has {n} {name} document(s) with any tokens; "
                        f"need at least {prep_write.MIN_DOCS_PER_SPLIT}")
  cap = int(c.max_eval_examples) or None
  examples = {}
  for l, out in out_dirs.items():
    info = {"seq_len": l, "dtype": found[0]["dtype"], "shards": {}, "files": {},
            "record": "[n_a, n, label, input_ids[seq_len]]"}
    for split in SPLITS:
      counts = _link_split(parts, found, l, split, os.path.join(out, split),
                           cap if split == "eval" else None)
      info["shards"][split], info[split] = counts, sum(counts)
      info["files"].update({os.path.basename(shard_path(os.path.join(out, split), i)):
                            os.path.getsize(shard_path(os.path.join(out, split), i))
                            for i in range(len(counts))})
    # Where each part's training records are: example streams (input_pipeline) sample by part.
    info["train_parts"] = {"index": [j.part.index for j in parts],
                           "records": [sum(p["seq_lens"][str(l)]["train"]["shards"])
                                       for p in found]}
    write_json(os.path.join(out, INFO_FILE), info)
    examples[str(l)] = {s: info[s] for s in SPLITS}
    stats[f"example_tokens_seq{l}"] = sum(p["seq_lens"][str(l)][s]["example_tokens"]
                                          for p in found for s in SPLITS)
  stats["examples"] = examples
  stats["seconds"] = round(max(time.time() - min(p["started"] for p in found), 1e-3), 3)
  stats["tokens_per_second"] = round(stats["tokens"] / stats["seconds"])
  _report(c, stats)
  return stats


def _link_split(parts: list[prep_write.PartJob], found: list[dict], l: int, split: str,
                prefix: str, cap: int | None) -> list[int]:
  """The records per shard of one split, linked in part order (at most `cap` records)."""
  os.makedirs(os.path.dirname(prefix), exist_ok=True)
  counts: list[int] = []
  for job, part in zip(parts, found):
    entry = part["seq_lens"][str(l)][split]
    for name, n in zip(entry["files"], entry["shards"]):
      if cap is not None:
        n = min(n, cap - sum(counts))
      if n <= 0:
        return counts
      _link(os.path.join(job.directory, f"seq{l}", name), shard_path(prefix, len(counts)))
      counts.append(n)
  return counts


def _link(src: str, dst: str) -> None:
  try:
    os.link(src, dst)
  except OSError:  # a file system without hard links
    shutil.copyfile(src, dst)


def _merged_stats(found: list[dict]) -> dict:
  stats: dict = {"documents": 0, "sentences": 0, "one_sentence_documents": 0, "repaired": {},
                 "tokens": 0, "documents_without_tokens": 0, "pairs_with_an_empty_half": 0,
                 "windows": {s: 0 for s in SPLITS},
                 "documents_by_split": {s: 0 for s in SPLITS}, "parts": len(found)}
  for part in found:
    for k in ("documents", "sentences", "one_sentence_documents"):
      stats[k] += part["corpus"][k]
    for kind, entry in part["corpus"]["repaired"].items():
      mine = stats["repaired"].setdefault(kind, {"count": 0, "first_at": entry["first_at"]})
      mine["count"] += entry["count"]
    for k in ("tokens", "documents_without_tokens", "pairs_with_an_empty_half"):
      stats[k] += part["counts"][k]
    for s in SPLITS:
      stats["windows"][s] += part["windows"][s]
      stats["documents_by_split"][s] += part["documents_by_split"][s]
  return stats


def _report(c: DataSettings, stats: dict) -> None:
  summary = ", ".join(f"seq_len {l}: {n['train']} train / {n['eval']} eval examples"
                      for l, n in stats["examples"].items())
  parts = f", {stats['parts']} parts" if stats["parts"] > 1 else ""
  print(f"Prepared {summary} from {stats['documents']} documents "
        f"({stats['sentences']} sentences, {stats['tokens']} tokens{parts}) in "
        f"{stats['seconds']:.1f} s ({stats['tokens_per_second']} tokens/s)", flush=True)
  found = corpus.CorpusStats()
  found.oddities = {k: [e["count"], e["first_at"]] for k, e in stats["repaired"].items()}
  for warning in found.warnings():
    print(f"warning: corpus: {warning}", file=sys.stderr, flush=True)
  # Not an error, but it skews NSP toward NotNext ('mlm' and 'mlm+sop' never leave a document).
  if stats["one_sentence_documents"] and c.objective == "mlm+nsp":
    print(f"warning: corpus '{c.corpus}': {stats['one_sentence_documents']} of "
          f"{stats['documents']} document(s) have a single sentence, so all their "
          "examples are NotNext (B from another document)", file=sys.stderr, flush=True)


def discard_unused(tokenizer_dir: str) -> None:
  """Removes a parts folder that holds only its vocabulary (`dataset.vocabulary` made it
  for a preparation that another, host-local one replaces)."""
  root = os.path.dirname(tokenizer_dir)
  if ".parts-seq" in os.path.basename(root) and not any(
      n.startswith("part-") for n in os.listdir(root)):
    shutil.rmtree(root, ignore_errors=True)
