"""What the in-training probe costs next to the evaluation it follows, on one model shape.

  python tools/measure_probe_cost.py --hidden 768 --layers 2 --eval_batches 4

Builds a randomly initialised BERT of the given shape (a vocabulary trained on
data/corpus.txt; every other field the default config's, float32), then times in one
process, on this machine's devices, the two things a pre-training run does at each eval:

- evaluation: `TrainSteps.evaluate` (the run's own eval step: forward, MLM and NSP
  heads and loss) on `--eval_batches` batches of `--batch_size` random sequences of
  length `--seq_len`; the default config evaluates up to 2048 examples
  (data.max_eval_examples), so the time is also scaled to that many;
- the probe: `eval.training_probes.RunProbes.run` on `word_order` (the run's own code: feature
  extraction by length bucket, then the logistic-regression fit), first call
  (compilation included) and a second call (the programs reused, as at every later eval).

The per-layer ratio of the two forwards does not depend on the depth, so a shallow model
of BERT-Base's width estimates BERT-Base's ratio; the probe's fit (features of the
hidden size, Newton's method up to logreg.NEWTON_MAX_PARAMS) does not depend on the
depth at all, so a shallow model overstates the probe's share. Prints one line per
measurement and the ratio.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--hidden", type=int, default=768)
  p.add_argument("--layers", type=int, default=2)
  p.add_argument("--seq_len", type=int, default=128)
  p.add_argument("--batch_size", type=int, default=64)
  p.add_argument("--eval_batches", type=int, default=4)
  p.add_argument("--eval_examples", type=int, default=2048, help="what the eval time is scaled to")
  args = p.parse_args()
  import jax
  from bert_jax.data.pretraining_data import Batch
  from bert_jax.data.tokenizer import Tokenizer
  from bert_jax.parallel import sharding
  from bert_jax import default_config, settings
  from bert_jax.settings import ProbeSettings
  from bert_jax.eval import training_probes as probes
  from bert_jax.train.steps import make_steps

  with open(os.path.join(ROOT, "data", "corpus.txt"), encoding="utf-8") as f:
    lines = [l.strip() for l in f if l.strip()]
  tok = Tokenizer.train(lines, vocab_size=1000, lowercase=True)
  c = default_config.get_config()
  c.model.update(hidden_size=args.hidden, num_layers=args.layers,
                 num_heads=max(1, args.hidden // 64), intermediate_size=4 * args.hidden,
                 dtype="float32")
  steps = make_steps(settings.from_config(c), tok.vocab_size, tok.special_ids(),
                     mesh=sharding.make_mesh(1))
  config = steps.bert_config
  params, _ = steps.init_state()
  B, L = args.batch_size, args.seq_len
  rs = np.random.RandomState(0)
  batch = Batch(rs.randint(5, tok.vocab_size, (B, L)).astype(np.int32),
                np.zeros((B, L), np.int32), np.ones((B, L), np.int32),
                rs.randint(0, 2, B).astype(np.int32), np.ones(B, np.float32))
  max_predictions = round(0.15 * L)
  phase = dataclasses.replace(steps.phases[0], max_predictions=max_predictions)
  steps.evaluate(params, [batch], phase)  # compiles
  start = time.perf_counter()
  steps.evaluate(params, [batch] * args.eval_batches, phase)
  eval_s = time.perf_counter() - start
  scaled = eval_s * args.eval_examples / (B * args.eval_batches)
  print(f"model: hidden {args.hidden}, {args.layers} layers, {jax.device_count()} "
        f"{jax.devices()[0].platform} devices")
  print(f"evaluation: {B * args.eval_batches} examples of length {L} in {eval_s:.1f} s; "
        f"{args.eval_examples} examples: {scaled:.1f} s")
  s = ProbeSettings(tasks=("word_order",))
  run = probes.RunProbes(s, probes.load_tasks(s), config, tok, seed=0)
  times = []
  for _ in range(2):
    start = time.perf_counter()
    m = run.run(params)
    times.append(time.perf_counter() - start)
  print(f"probe word_order ({int(m['word_order/num_eval'])} dev sentences): first "
        f"{times[0]:.1f} s (compilation included), then {times[1]:.1f} s")
  print(f"probe / evaluation of {args.eval_examples} examples: first {times[0] / scaled:.1%}, "
        f"then {times[1] / scaled:.1%}")


if __name__ == "__main__":
  main()
