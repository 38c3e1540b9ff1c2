"""Device memory in the train rows (bert_jax/train/throughput.device_memory)."""

import os


class _Device:
  def __init__(self, stats):
    self._stats = stats

  def memory_stats(self):
    return self._stats


def test_device_memory_is_the_largest_use_and_peak_and_the_smallest_limit(monkeypatch):
  import jax
  from bert_jax.train import throughput
  gib = 1024**3
  monkeypatch.setattr(jax, "local_devices", lambda: [
      _Device({"bytes_in_use": 2 * gib, "peak_bytes_in_use": 5 * gib, "bytes_limit": 16 * gib}),
      _Device({"bytes_in_use": 3 * gib, "peak_bytes_in_use": 4 * gib, "bytes_limit": 15 * gib})])
  assert throughput.device_memory() == {"memory_in_use_gib": 3.0, "memory_peak_gib": 5.0,
                                        "memory_limit_gib": 15.0}


def test_a_platform_without_memory_stats_reports_none_and_says_so():
  from bert_jax.train import throughput
  assert throughput.device_memory() == {}  # the CPU devices of the tests


def test_every_train_row_has_the_planners_memory_for_the_same_step(tmp_path):
  # The run compiles its step ahead of time once per phase for the plan (the jitted step
  # then finds that executable), so what the run logs is what `python -m bert_jax.plan`
  # says for the config: the plan is checked by every run that reports its memory.
  import json  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  from bert_jax import settings  # pylint: disable=import-outside-toplevel
  from bert_jax.planner import plan as plan_lib  # pylint: disable=import-outside-toplevel
  from bert_jax.trainer import train_and_evaluate  # pylint: disable=import-outside-toplevel
  import tiny_run  # pylint: disable=import-outside-toplevel
  config = tiny_run.config(**{"train.num_steps": 3, "log_every": 1, "probe.tasks": ()})
  train_and_evaluate(config, str(tmp_path / "run"))
  with open(tmp_path / "run" / "metrics.jsonl", encoding="utf-8") as f:
    rows = [json.loads(l) for l in f if '"train"' in l]
  logged = {r["memory_planned_gib"] for r in rows}
  with open(tmp_path / "run" / "prepared" / next(
      d for d in os.listdir(tmp_path / "run" / "prepared") if not d.startswith(".")) /
            "tokenizer" / "vocab.txt", encoding="utf-8") as f:
    vocab = sum(1 for _ in f)
  plan = plan_lib.make_plan(settings.from_config(config), jax.devices(), "here", None,
                            vocab_size=vocab, include_eval=False, search=False)
  assert logged == {plan.steps[0].total_bytes / 1024**3}, (logged, plan.steps[0].total_bytes)
