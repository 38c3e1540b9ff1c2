"""What packing buys on short documents: real tokens per step and per second, and what
a model learns from the same number of real tokens, packed against unpacked.

  python tools/measure_packing.py [--steps 300] [--out tools/results/packing.txt]

The corpus: sentences of the built-in corpus regrouped into documents of 1-3
sentences (generated here, no download). Objective 'mlm' (no NSP: packing needs
one segment per piece), configs/tiny.py's model, global batch 64, sequence
length 128, each run in a fresh process. Runs:

  unpacked            --steps steps, one document per row
  packed              --steps steps, several documents per row, attention kept
                      inside each document (`data.packing=True`)
  packed, no doc mask --steps steps on the same packed rows, attention over the
                      whole row and positions running on (the ablation NeoBERT
                      reports lowers GLUE: arXiv 2502.19587, Fig. 1)
  unpacked, = tokens  as many steps as it takes to see the packed run's real tokens

Prints each run's real tokens per step and per second (from its metrics.jsonl), its
final MLM accuracy on its own eval split, the word_order probe (the same task for
every run), and the real tokens it trained on.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tools.bench_prepare import make_synthetic_corpus  # noqa: E402  (after the path)

# The ablation's switch: the packed data, read by steps that do not know it is packed.
_NO_DOCUMENT_MASK = """
import runpy, sys
from bert_jax.train import steps
original = steps.TrainSteps.__init__
def no_mask(self, *args, **kwargs):
  kwargs["packed"] = False
  original(self, *args, **kwargs)
steps.TrainSteps.__init__ = no_mask
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _machine() -> str:
  from bert_jax.model import precision  # pylint: disable=import-outside-toplevel
  flags = precision.cpu_flags() & {"amx_bf16", "avx512_bf16"}
  return (f"Machine: {precision.cpu_model() or platform.machine()}, {os.cpu_count()} cores, "
          f"{' '.join(sorted(flags)) or 'no bf16 dot flags'} ({platform.platform()})")


def _run(tmp: str, name: str, corpus_path: str, steps: int, packed: bool,
         no_mask: bool = False) -> dict:
  workdir = os.path.join(tmp, name.replace(" ", "_").replace(",", ""))
  overrides = {
      "data.corpus": corpus_path, "data.cache_dir": os.path.join(tmp, "cache"),
      "data.dupe_factor": 1, "data.eval_dupe_factor": 1, "data.max_eval_examples": 2048,
      "objective": "mlm", "data.packing": packed, "train.num_steps": steps,
      "train.warmup_steps": max(1, steps // 10), "train.seq_lens": (128,),
      "train.max_predictions": (20,), "log_every": max(1, steps // 10),
      "eval_every": 10**6, "checkpoint_every": 10**6, "progress_bar": False}
  cmd = [os.path.join(ROOT, "train.py"), "--config", os.path.join(ROOT, "configs", "tiny.py"),
         "--workdir", workdir, *[f"--config.{k}={v}" for k, v in overrides.items()]]
  cmd = [sys.executable, "-c", _NO_DOCUMENT_MASK, *cmd] if no_mask else [sys.executable, *cmd]
  done = subprocess.run(cmd, capture_output=True, text=True,
                        env={**os.environ, "JAX_COMPILATION_CACHE_DIR": os.path.join(tmp, "xla")})
  if done.returncode:
    sys.exit(f"error: the run '{name}' failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    rows = [json.loads(line) for line in f]
  train = [r for r in rows if r["split"] == "train" and "real_tokens_per_sec" in r]
  ev = [r for r in rows if r["split"] == "eval"][-1]
  probe = [r for r in rows if r["split"] == "probe"][-1]
  rate = sum(r["real_tokens_per_sec"] for r in train) / len(train)
  steps_per_sec = sum(r["steps_per_sec"] for r in train) / len(train)
  per_step = rate / steps_per_sec
  return {"name": name, "steps": steps, "real_tokens_per_step": per_step,
          "real_tokens_per_sec": rate, "steps_per_sec": steps_per_sec,
          "real_tokens": per_step * steps, "mlm_accuracy": ev["mlm_accuracy"],
          "word_order": probe["word_order/accuracy"]}


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--steps", type=int, default=300)
  p.add_argument("--megabytes", type=float, default=1.0)
  p.add_argument("--out", default="")
  args = p.parse_args()
  print(f"# tools/measure_packing.py --steps {args.steps} --megabytes {args.megabytes}\n"
        f"{_machine()}\n", flush=True)
  results = []
  with tempfile.TemporaryDirectory() as tmp:
    corpus_path = make_synthetic_corpus(os.path.join(tmp, "short_documents.txt"),
                                        args.megabytes, sentences=(1, 3))
    results.append(_run(tmp, "unpacked", corpus_path, args.steps, False))
    results.append(_run(tmp, "packed", corpus_path, args.steps, True))
    results.append(_run(tmp, "packed, no doc mask", corpus_path, args.steps, True, True))
    equal = round(results[1]["real_tokens"] / results[0]["real_tokens_per_step"])
    results.append(_run(tmp, "unpacked, = tokens", corpus_path, equal, False))
  header = (f"{'run':<22} {'steps':>6} {'real tok/step':>14} {'real tok/s':>11} "
            f"{'steps/s':>8} {'real tokens':>12} {'MLM acc':>8} {'word_order':>10}")
  lines = [header, "-" * len(header)]
  for r in results:
    lines.append(f"{r['name']:<22} {r['steps']:>6} {r['real_tokens_per_step']:>14.0f} "
                 f"{r['real_tokens_per_sec']:>11.0f} {r['steps_per_sec']:>8.2f} "
                 f"{r['real_tokens']:>12.0f} {r['mlm_accuracy']:>8.4f} {r['word_order']:>10.4f}")
  print("\n".join(lines), flush=True)
  if args.out:
    with open(args.out, "w", encoding="utf-8") as f:
      f.write("\n".join([f"# tools/measure_packing.py --steps {args.steps} --megabytes "
                         f"{args.megabytes}", _machine(), "", *lines]) + "\n")


if __name__ == "__main__":
  main()
