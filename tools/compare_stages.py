"""Staged recipes against one stage on CPU: does the staging help the tiny ModernBERT?

  python tools/compare_stages.py [--seeds 0,1] [--scale 1.0] [--out docs/performance.md]
                                 [--done OUTPUT_OF_A_CALL_CUT_SHORT]

Two comparisons, each variant trained with every seed in its own fresh process:

  staging    configs/modernbert_tiny_staged.py with mmBERT's masking, 30 -> 15 -> 5%
             (pre-train 800 steps at 64 tokens, extension 300 at 128 with the global
             RoPE base at 160k, a 1-sqrt decay over 50), against one stage of the same
             tokens at 64 tokens and 30% (configs/modernbert_tiny.py's WSD schedule)
  masking    configs/modernbert_tiny.py (1200 steps at 64 tokens) with a linear masking
             ramp 30 -> 15% (Ankner et al. 2023) against the constant 30%

Every final checkpoint is then measured the same way, whatever it trained at:
held-out MLM accuracy and loss masked at 15% on the built-in corpus's eval split at 128
tokens (a `init_from` run with num_steps=0: the trainer's evaluation of the source), and
the word_order linear probe (`python -m bert_jax.probe`). The table gives each variant's
training tokens (rows x length, padding included) and its mean over seeds ± the seeds'
standard deviation; results do not depend on the machine's load, so no times. With
--out it replaces the section between its markers in that file (docs/performance.md).
--scale multiplies every step count (0.05 for a smoke run).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEGIN, END = "<!-- compare_stages:begin -->", "<!-- compare_stages:end -->"
STAGED, SINGLE = "configs/modernbert_tiny_staged.py", "configs/modernbert_tiny.py"
# The staged recipe's tokens: 800 x 64 x 64 + 300 x 16 x 128 + 50 x 16 x 128.
STAGED_TOKENS = 800 * 64 * 64 + 300 * 16 * 128 + 50 * 16 * 128


def variants(scale: float) -> dict[str, tuple[str, str, list[str], int]]:
  """name -> (comparison, config, flags, training tokens)."""
  n = lambda steps: max(4, int(round(steps * scale)))  # noqa: E731
  staged = [f"--config.train.phase_tokens=({64 * 64 * n(800)}, {128 * 16 * n(300)}, "
            f"{128 * 16 * n(50)})", "--config.train.phase_mask_probs=(0.3, 0.15, 0.05)",
            f"--config.train.warmup_steps={n(200)}"]
  one_stage_steps = n(STAGED_TOKENS // (64 * 64))
  single = [f"--config.train.num_steps={one_stage_steps}",
            f"--config.train.warmup_steps={n(200)}"]
  plain = [f"--config.train.num_steps={n(1200)}", f"--config.train.warmup_steps={n(200)}"]
  staged_tokens = 64 * 64 * n(800) + 128 * 16 * n(300) + 128 * 16 * n(50)
  return {
      "three stages (30 -> 15 -> 5%, 64 -> 128 tokens, 1-sqrt decay)": (
          "staging", STAGED, staged, staged_tokens),
      f"one stage, same tokens ({one_stage_steps} steps at 64, 30%, WSD)": (
          "staging", SINGLE, single, one_stage_steps * 64 * 64),
      "masking ramp 30 -> 15%, one stage": (
          "masking", SINGLE, [*plain, "--config.train.phase_mask_probs=((0.3, 0.15),)"],
          n(1200) * 64 * 64),
      "constant 30%, one stage": ("masking", SINGLE, plain, n(1200) * 64 * 64),
  }


def _run(args: list[str]) -> str:
  out = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                       check=False)
  if out.returncode:
    raise SystemExit(f"{args[:4]}: exit {out.returncode}: {out.stderr[-3000:]}")
  return out.stdout + out.stderr


def _metrics(workdir: str, split: str) -> list[dict]:
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return [r for r in map(json.loads, f) if r.get("split") == split]


def measure(workdir: str, tmp: str, cache: str) -> dict:
  """Held-out MLM at 15% on 128-token rows, and the word_order probe, of `workdir`."""
  ev_dir = os.path.join(tmp, os.path.basename(workdir) + "-eval")
  _run([os.path.join(ROOT, "train.py"), "--config", os.path.join(ROOT, SINGLE),
        "--workdir", ev_dir, f"--config.init_from={workdir}", "--config.train.num_steps=0",
        "--config.train.seq_lens=(128,)", "--config.train.max_predictions=(40,)",
        "--config.train.phase_fractions=(1.0,)", "--config.train.warmup_steps=0",
        "--config.train.schedule=linear",
        "--config.probe.tasks=()",
        f"--config.data.cache_dir={cache}", "--config.progress_bar=False", "--config.plot=False"])
  ev = _metrics(ev_dir, "eval")[-1]
  assert abs(ev["mask_prob"] - 0.15) < 1e-9, ev
  probe = _run(["-m", "bert_jax.probe", "--checkpoint", workdir, "--task", "word_order"])
  acc = float(re.search(r"word_order/accuracy: ([\d.]+)", probe).group(1))
  return {"mlm_accuracy": ev["mlm_accuracy"], "mlm_loss": ev["mlm_loss"], "probe": acc}


def _done_runs(path: str) -> dict:
  """{(variant, seed): measurements} of the run lines an earlier call printed."""
  import ast  # pylint: disable=import-outside-toplevel
  out = {}
  with open(path, encoding="utf-8") as f:
    for line in f:
      m = re.match(r"(.+) seed (\d+): (\{.*\})$", line.strip())
      if m:
        out[(m.group(1), int(m.group(2)))] = ast.literal_eval(m.group(3))
  return out


def _mean_sd(xs: list[float]) -> str:
  sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
  return f"{statistics.mean(xs):.4f} ± {sd:.4f}"


def table(results: dict, seeds: list[int], machine: str) -> str:
  lines = [f"Measured by `python tools/compare_stages.py --seeds {','.join(map(str, seeds))}` "
           f"on {machine}; mean over {len(seeds)} seeds ± their standard deviation. "
           "Every model is evaluated the same way after training: MLM masked at 15% on "
           "the held-out split at 128 tokens, and the word_order probe.", "",
           "| comparison | variant | training tokens | held-out MLM accuracy @15% | "
           "MLM loss @15% | word_order probe |", "| --- | --- | --- | --- | --- | --- |"]
  for name, (comparison, tokens, runs) in results.items():
    lines.append(f"| {comparison} | {name} | {tokens / 1e6:.2f}M | "
                 f"{_mean_sd([r['mlm_accuracy'] for r in runs])} | "
                 f"{_mean_sd([r['mlm_loss'] for r in runs])} | "
                 f"{_mean_sd([r['probe'] for r in runs])} |")
  return "\n".join(lines)


def _machine() -> str:
  sys.path.insert(0, ROOT)
  from bert_jax.model import precision  # pylint: disable=import-outside-toplevel
  flags = precision.cpu_flags() & {"amx_bf16", "avx512_bf16"}
  return (f"{precision.cpu_model() or platform.machine()}, {os.cpu_count()} cores, "
          f"{' '.join(sorted(flags)) or 'no bf16 dot flags'}")


def write_section(path: str, text: str) -> None:
  with open(path, encoding="utf-8") as f:
    doc = f.read()
  if BEGIN not in doc:
    raise SystemExit(f"{path}: no {BEGIN} ... {END} section to replace")
  head, rest = doc.split(BEGIN, 1)
  tail = rest.split(END, 1)[1]
  with open(path, "w", encoding="utf-8") as f:
    f.write(f"{head}{BEGIN}\n{text}\n{END}{tail}")


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--seeds", default="0,1")
  p.add_argument("--scale", type=float, default=1.0, help="multiplies every step count")
  p.add_argument("--out", default="", help="a file whose marked section gets the table")
  p.add_argument("--done", default="", help="the printed output of an earlier call cut short: "
                 "its finished runs (the 'NAME seed S: {...}' lines) are not run again")
  args = p.parse_args(argv)
  seeds = [int(s) for s in args.seeds.split(",")]
  done = _done_runs(args.done) if args.done else {}
  results: dict = {}
  with tempfile.TemporaryDirectory(prefix="bert_jax_stages_") as tmp:
    cache = os.path.join(tmp, "prepared")
    for name, (comparison, config, flags, tokens) in variants(args.scale).items():
      runs = []
      for seed in seeds:
        if (name, seed) in done:
          runs.append(done[(name, seed)])
          continue
        workdir = os.path.join(tmp, f"{len(results)}-{seed}")
        _run([os.path.join(ROOT, "train.py"), "--config", os.path.join(ROOT, config),
              "--workdir", workdir, f"--config.seed={seed}", f"--config.data.cache_dir={cache}",
              "--config.probe.tasks=()", "--config.progress_bar=False", "--config.plot=False",
              "--config.eval_every=100000", *flags])
        runs.append(measure(workdir, tmp, cache))
        print(f"{name} seed {seed}: {runs[-1]}", flush=True)
      results[name] = (comparison, tokens, runs)
  text = table(results, seeds, _machine())
  print(text)
  if args.out:
    write_section(args.out, text)


if __name__ == "__main__":
  main()
