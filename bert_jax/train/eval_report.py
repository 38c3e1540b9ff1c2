"""An evaluation's metrics as people read them: standard errors, one console line.

Shared by the loop, the trainer's closing lines and a continued run's step-0 line.
"""

import math


def with_stderr(ev: dict) -> dict:
  """Eval metrics plus the binomial standard error sqrt(p(1-p)/n) of each accuracy."""
  out = dict(ev)
  for name in ("mlm", "nsp", "sop"):
    if f"{name}_accuracy" not in ev:
      continue  # no second task for config.objective 'mlm'
    p, n = ev[f"{name}_accuracy"], ev.get(f"{name}_count", 0.0)
    out[f"{name}_accuracy_stderr"] = math.sqrt(p * (1 - p) / n) if n > 0 else float("nan")
  return out


def describe_eval(ev: dict) -> str:
  """Eval metrics as one line, each accuracy with its standard error."""
  pm = lambda name: (f" ± {ev[f'{name}_accuracy_stderr']:.4f}"
                     if f"{name}_accuracy_stderr" in ev else "")
  heads = [t for t in ("nsp", "sop") if t + "_accuracy" in ev]  # none for objective 'mlm'
  return (f"MLM accuracy {ev['mlm_accuracy']:.4f}{pm('mlm')} (best constant guess "
          f"{ev['mlm_best_constant_accuracy']:.4f}), "
          + "".join(f"{t.upper()} accuracy {ev[t + '_accuracy']:.4f}{pm(t)}, " for t in heads)
          + f"MLM loss {ev['mlm_loss']:.4f}"
          + "".join(f", {t.upper()} loss {ev[t + '_loss']:.4f}" for t in heads)
          + _rate(ev))


def _rate(ev: dict) -> str:
  """Where evaluation masks at another rate than training does at that step: both."""
  asked, trained = ev.get("mask_prob"), ev.get("train_mask_prob")
  if asked is None or trained is None or abs(asked - trained) < 1e-9:
    return ""
  return f" (masked at {asked:.0%}; training masks {trained:.0%})"
