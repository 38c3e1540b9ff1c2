"""What watching a run costs: the step rate with the watchdog, spike detection and a
planned (not yet reached) profile on, against all of them off.

  python tools/bench_observability.py [--rounds 3] [--steps 120]

Each round runs the same small pre-training twice in fresh processes, off then on (the
order alternates between rounds), on the built-in toy corpus with a shared compile
cache, and reads the rate of the timed steps from the run's end-of-run line. Prints
each run and the medians; the difference is noise when it is inside the spread of the
runs of one setting.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETTINGS = {
    "off": {},
    "on": {"watchdog_s": 600, "train.spike_rollback.factor": 3.0,
           "train.spike_rollback.window": 10, "profile.steps": (10**9, 10**9 + 1)},
}


def _run(workdir: str, cache: str, steps: int, extra: dict) -> float:
  base = {"data.corpus": os.path.join(ROOT, "data", "corpus.txt"), "data.cache_dir": cache,
          "model.hidden_size": 128, "model.num_heads": 2, "model.intermediate_size": 512,
          "model.num_layers": 2, "train.batch_size": 32, "train.num_steps": steps,
          "train.seq_lens": (64,), "train.max_predictions": (10,), "train.warmup_steps": 10,
          "log_every": 10, "eval_every": 10**6, "checkpoint_every": 10**6, "eval_batches": 1,
          "progress_bar": False, "probe.tasks": ()}
  flags = [f"--config.{k}={v}" for k, v in {**base, **extra}.items()]
  env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": os.path.join(cache, "xla"),
         "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
  out = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--config",
                        os.path.join(ROOT, "configs", "tiny.py"), "--workdir", workdir, *flags],
                       env=env, capture_output=True, text=True, check=True).stdout
  return float(re.search(r"steps in [\d.]+ s: ([\d.]+) steps/s", out).group(1))


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument("--steps", type=int, default=120)
  args = p.parse_args()
  rates: dict[str, list[float]] = {k: [] for k in SETTINGS}
  with tempfile.TemporaryDirectory() as tmp:
    cache = os.path.join(tmp, "cache")
    for r in range(args.rounds):
      order = list(SETTINGS) if r % 2 == 0 else list(reversed(SETTINGS))
      for name in order:
        rate = _run(os.path.join(tmp, f"{name}-{r}"), cache, args.steps, SETTINGS[name])
        rates[name].append(rate)
        print(f"round {r}: {name:>3}: {rate:.2f} steps/s", flush=True)
  off, on = (statistics.median(rates[k]) for k in ("off", "on"))
  spread = max(max(v) - min(v) for v in rates.values())
  print(f"median steps/s: off {off:.2f}, on {on:.2f} ({(on / off - 1) * 100:+.1f}%); "
        f"largest spread within one setting {spread:.2f} steps/s")


if __name__ == "__main__":
  main()
