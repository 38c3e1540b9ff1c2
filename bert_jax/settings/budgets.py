"""Phase budgets (`config.train.phase_steps`, `config.train.phase_tokens`): how long each
stage of a staged recipe trains, in steps or in tokens, from which `num_steps` follows.

A token budget is counted as the published recipes count it: rows x length per step,
padding included (a packed row is full), at the phase's own global batch; a step budget
is exact. Either one turns the phases' fractions into exact step counts, so a recipe
gives the same steps on every machine (settings.train.phases splits by these counts).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence

from bert_jax.settings.checks import fail, is_int
from bert_jax.settings.train import batch_sizes_of, phases

_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}


def tokens(value, field: str) -> int:
  """A token count: an integer, or a string such as '1.7T', '250B', '3e9'."""
  if is_int(value) and value > 0:
    return int(value)
  m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([KMBGT]?)\s*", str(value), re.I)
  if m and float(m.group(1)) > 0:
    return int(round(float(m.group(1)) * _SUFFIX[m.group(2).upper()]))
  raise fail(field, value, "a positive token count, e.g. 1700000000000 or '1.7T', '250B'")


def phase_steps(steps: Sequence, token_budgets: Sequence, seq_lens: Sequence[int],
                batches: Sequence[int]) -> tuple[int, ...]:
  """The steps of each phase from `train.phase_steps` or `train.phase_tokens` (one of
  them; () when neither is given)."""
  steps, token_budgets = tuple(steps), tuple(token_budgets)
  if steps and token_budgets:
    raise fail("train.phase_tokens", token_budgets, "() with --config.train.phase_steps "
               "(a phase's budget is in steps or in tokens, not both)")
  n = len(seq_lens)
  if steps:
    if len(steps) != n or not all(is_int(s) and s > 0 for s in steps):
      raise fail("train.phase_steps", steps, f"() or {n} positive integers, one per phase")
    return tuple(int(s) for s in steps)
  if not token_budgets:
    return ()
  if len(token_budgets) != n:
    raise fail("train.phase_tokens", token_budgets, f"() or {n} token counts, one per phase")
  out = []
  for i, (budget, seq_len, batch) in enumerate(zip(token_budgets, seq_lens, batches)):
    per_step = int(seq_len) * int(batch)
    out.append(max(1, int(round(tokens(budget, f"train.phase_tokens[{i}]") / per_step))))
  return tuple(out)


def saved_phases(train: dict):
  """The phases a stored config's train section (a checkpoint meta's `config["train"]`)
  trained, as from_config split them: by its budgets where it has them. Raises
  KeyError/TypeError/ValueError/ConfigError for a section it cannot read (an older meta)."""
  seq_lens = tuple(train["seq_lens"])
  batches = batch_sizes_of(tuple(train.get("phase_batch_sizes", ())), len(seq_lens),
                           train.get("batch_size", 0))
  steps = phase_steps(train.get("phase_steps", ()), train.get("phase_tokens", ()), seq_lens,
                      batches)
  return phases(train["phase_fractions"], seq_lens, train["max_predictions"],
                sum(steps) if steps else train["num_steps"], 1 << 30,
                rope_thetas=train.get("phase_rope_thetas", ()),
                mask_probs=train.get("phase_mask_probs", ()),
                batch_sizes=tuple(train.get("phase_batch_sizes", ())),
                batch_size=train.get("batch_size", 0), steps=steps)


def of_config(t, explicit: Collection[str]) -> tuple[tuple[int, ...], int]:
  """(each phase's steps from its budget, or (); the run's steps) of `config.train`."""
  seq_lens = tuple(t.seq_lens)
  batches = batch_sizes_of(tuple(t.get("phase_batch_sizes", ())), len(seq_lens), t.batch_size)
  budgeted = phase_steps(t.get("phase_steps", ()), t.get("phase_tokens", ()), seq_lens, batches)
  return budgeted, check_num_steps(budgeted, t.num_steps, explicit)


def check_num_steps(budgeted: Sequence[int], num_steps, explicit: Collection[str]) -> int:
  """The run's steps: the budgets' sum when there are budgets (a command line's own
  `train.num_steps` must then agree), else `train.num_steps`."""
  if not budgeted:
    return num_steps
  total = sum(budgeted)
  if "train.num_steps" in explicit and num_steps != total:
    raise fail("train.num_steps", num_steps, f"{total}, the sum of the phases' budgets "
               f"{tuple(budgeted)} (train.phase_steps / phase_tokens decide it; leave it out)")
  return total
