"""Times the logistic-regression probe fit (bert_jax.eval.logreg.fit_probe), first call and repeats.

  python tools/bench_probe.py --checkpoint /tmp/lr_ck [--task word_order] [--repeats 3]

Features of the task's train and eval splits are extracted once from the
checkpoint (cached next to it as probe_features_<task>.npz), so what is timed
is only the fit: the first call includes compilation, later ones do not.
Prints one line per call with the seconds (wall clock and this process's CPU
time, all threads: on a shared machine the latter is the steadier), chosen C and
eval accuracy.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--checkpoint", required=True)
  p.add_argument("--task", default="word_order")
  p.add_argument("--repeats", type=int, default=3)
  args = p.parse_args()
  cache = os.path.join(args.checkpoint, f"probe_features_{args.task}.npz")
  from bert_jax.eval import logreg, tasks
  task = tasks.load_task(args.task)
  if not os.path.exists(cache):
    from bert_jax.eval.probe import _features
    from bert_jax.features.extract import Extractor
    ex = Extractor.from_checkpoint(args.checkpoint, max_length=128, batch_size=64)
    arrays = {"train_X": _features(ex, task.splits["train"], (-1,), "mean"),
              "train_y": np.array([e.label for e in task.splits["train"]])}
    for s in task.eval_splits:
      arrays[f"eval_X_{s}"] = _features(ex, task.splits[s], (-1,), "mean")
      arrays[f"eval_y_{s}"] = np.array([e.label for e in task.splits[s]])
    np.savez(cache, **arrays)
  d = np.load(cache)
  eval_X = {s: d[f"eval_X_{s}"] for s in task.eval_splits}
  shapes = ", ".join(f"{s} {x.shape}" for s, x in eval_X.items())
  print(f"train {d['train_X'].shape}, eval {shapes}")
  for r in range(args.repeats):
    t, cpu = time.perf_counter(), time.process_time()
    fit = logreg.fit_probe(d["train_X"], d["train_y"], eval_X, num_classes=task.num_classes)
    dt, dcpu = time.perf_counter() - t, time.process_time() - cpu
    acc = {s: float(np.mean(fit.predictions[s] == d[f"eval_y_{s}"])) for s in eval_X}
    print(f"call {r}: {dt:.2f} s wall, {dcpu:.2f} s cpu  C={fit.penalty:g}  "
          f"holdout={fit.holdout_scores}  eval={acc}  iterations={fit.model.iterations} "
          f"grad_max={fit.model.grad_max:.2e}")


if __name__ == "__main__":
  main()
