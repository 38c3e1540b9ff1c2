"""The shipped probe task `word_order`: was a pair of adjacent words swapped? (bigram shift)

What: SentEval's BShift (Conneau et al., 2018) on short held-out sentences. In
half of the sentences two adjacent, different words trade places ("the dog
slept under the table" -> "the dog under slept the table"); the label is 1
("swapped") for those and 0 ("original") for the rest. Each sentence appears
once, either way round, and train and dev hold different sentences (70/30),
so a probe cannot match a swapped sentence to its original. Each split is
balanced to within one sentence: the majority-class baseline is 0.5 accuracy
(0.504 on the 123 dev sentences).

Why this task: a probe on a topic or sentiment task is largely solved by a bag
of words, and even a BERT with random weights gives mean-pooled features that
carry one; here both sentences of a pair have the same words, so only features
that encode word order can beat chance. Features of a model with random
weights (whose mixing of positions is arbitrary) sit near 0.5; what a linear
probe gains above that was learned in pre-training (MLM must predict words
from their order).

The text: bert_jax/eval/word_order_heldout.txt, about 400 short, lowercase, unpunctuated
everyday sentences written for this task in the style of data/corpus.txt, with
its vocabulary but none of its sentences. It is held out from every corpus
that ships, so a Quick start model has never read these sentences.

`build` is a pure function of the sentences and the seed; `load()` is what
`tasks.load_task("word_order")` returns. No JAX here.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence

from bert_jax.errors import TaskError
from bert_jax.eval.task_types import CLASSIFICATION, Example, Task, metric_names
from bert_jax.storage import fs

NAME = "word_order"
LABELS = ("original", "swapped")
# Installed with the package (pyproject's package-data), so `pip install .` has it too.
HELDOUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "word_order_heldout.txt")
SEED = 0
DEV_FRACTION = 0.3


def read_sentences(path: str = HELDOUT) -> list[str]:
  """Non-blank lines of `path`, whitespace normalised."""
  if not os.path.isfile(path):
    raise TaskError(f"built-in task {NAME}: its text {path} does not exist; expected the "
                    "held-out sentences that ship with bert-jax (bert_jax/eval/word_order_heldout.txt)")
  with fs.open(path, encoding="utf-8") as f:
    return [" ".join(l.split()) for l in f if l.strip()]


def swap_adjacent(words: Sequence[str], rng: random.Random) -> list[str]:
  """`words` with one random adjacent pair of different words swapped."""
  where = [i for i in range(len(words) - 1) if words[i] != words[i + 1]]
  if not where:
    raise ValueError(f"no two adjacent different words to swap in {' '.join(words)!r}")
  i = rng.choice(where)
  out = list(words)
  out[i], out[i + 1] = out[i + 1], out[i]
  return out


def build(sentences: Sequence[str], seed: int = SEED, dev_fraction: float = DEV_FRACTION) -> Task:
  """The word_order task from `sentences`: split by sentence, then half of each split swapped.

  Repeated sentences are kept once and sentences with no two different adjacent
  words (nothing to swap) are left out, so no text is in both splits and no
  swapped sentence equals its original.
  """
  usable = []
  for s in dict.fromkeys(" ".join(s.split()) for s in sentences):
    w = s.split()
    if any(a != b for a, b in zip(w, w[1:])):
      usable.append(s)
  n_dev = int(round(len(usable) * dev_fraction))
  if n_dev < 2 or len(usable) - n_dev < 2:
    raise TaskError(f"{NAME}: {len(usable)} usable sentences; expected enough for at least two "
                    f"in each of train and dev (dev fraction {dev_fraction})")
  rng = random.Random(seed)
  order = list(usable)
  rng.shuffle(order)
  splits = {}
  for split, part in (("dev", order[:n_dev]), ("train", order[n_dev:])):
    swapped = set(rng.sample(range(len(part)), len(part) // 2))
    splits[split] = [
        Example(" ".join(swap_adjacent(s.split(), rng)), None, 1) if i in swapped
        else Example(s, None, 0) for i, s in enumerate(part)]
  splits = {"train": splits["train"], "dev": splits["dev"]}
  return Task(NAME, CLASSIFICATION, LABELS, splits, metric_names(NAME, CLASSIFICATION), ("dev",))


def load(path: str = HELDOUT) -> Task:
  """The shipped task: `build(read_sentences())` with the default seed and split."""
  return build(read_sentences(path))
