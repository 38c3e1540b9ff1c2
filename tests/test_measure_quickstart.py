"""tools/measure_quickstart.py: the block it writes from a run's output, and the README rewrite."""

import datetime
import os
import re

import pytest

from tools import measure_quickstart as mq

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# The output of a real run of the README's toy example (2026-11-23, on a busy VM).
TRANSCRIPT = """\
Prepared seq_len 64: 760 train / 40 eval examples from 80 documents (160 sentences, 786 tokens) in 0.1 s (8795 tokens/s)
model: 2 layers, hidden 128, 2 heads, vocab 886 -> 0.56M params; 1 cpu devices, mesh {'data': 1, 'model': 1}
throughput: 0.171 GFLOP per sequence at length 64 (model FLOPs, 3x forward); MFU left out: no known peak FLOP/s for device kind 'cpu'
phase 0: steps 0..60 at sequence length 64, 10 predictions per sequence
throughput: 59 steps in 82.1 s: 0.72 steps/s, 46.0 sequences/s, 2942 tokens/s (570 real), 0.00788 model TFLOP/s; compile (first step) phase 0 57.0 s; evaluation 17.8 s
final eval @ step 60: MLM accuracy 0.0811 ± 0.0259 (best constant guess 0.0811), NSP accuracy 0.5750 ± 0.0782, MLM loss 6.6269, NSP loss 0.6898
"""


def _transcript() -> str:
  return TRANSCRIPT


def _readme_console_block() -> str:
  """What the README's "What a run prints" example shows a run printing."""
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    text = f.read()
  block = re.search(r"```console\n(.*?)```", text, re.S).group(1)
  return "\n".join(l for l in block.splitlines() if not l.startswith("$ "))


def test_the_readme_example_output_is_what_the_script_parses():
  text = _readme_console_block()
  assert mq._PREPARED.search(text) and mq._MODEL.search(text) and mq._SUMMARY.search(text)


def _measurement(steps=60, wall=165.0):
  text = _transcript()
  return {"train_start_s": 5.1, "final_eval_s": 2.0, "steps": steps, "wall_s": wall, "load_at_start": 0.2, "text": text,
          "prepare_s": sum(float(x) for x in mq._PREPARED.findall(text)),
          "model": mq._MODEL.search(text)[1], "summary": mq._SUMMARY.search(text),
          "eval": {"mlm_accuracy": 0.0811, "mlm_accuracy_stderr": 0.0259,
                   "mlm_best_constant_accuracy": 0.0811, "nsp_accuracy": 0.575,
                   "nsp_accuracy_stderr": 0.0782},
          "date": datetime.datetime(2026, 11, 23, 10, 0, tzinfo=datetime.timezone.utc)}


def test_the_block_splits_the_wall_time_into_what_the_run_measured():
  block = mq.markdown(_measurement())
  assert block.startswith(mq.START) and block.endswith(mq.END)
  # 165 s = 5.0 start-up + 0.1 prepare + 57.0 compile + 82.1 steps + 17.8 eval + 2.0 final
  # + 1.0 rest
  assert ("2 min 45 s: start-up (imports, model set-up) 5.0 s, data preparation 0.1 s, "
          "compile 57.0 s, 59 timed steps 1 min 22 s, evaluations 17.8 s, final evaluation "
          "and checkpoint 2.0 s, the rest (plot, exit) 1.0 s") in block
  assert "0.72 steps/s, 46 sequences/s, 2942 tokens/s (570 real)" in block
  assert "0.081 ± 0.026 (the best constant guess is 0.081)" in block
  assert "1 cpu devices" in block and "2026-11-23 10:00 UTC" in block
  assert "--config.train.num_steps=60" in block and "A quick check of 60 steps" in block


@pytest.mark.parametrize("script", ["measure_quickstart", "measure_reruns"])
def test_readme_rewrite_replaces_only_the_block_through_the_shared_rewriter(
    script, tmp_path, monkeypatch, capsys):
  from tools import measure_reruns as mr
  module = {"measure_quickstart": mq, "measure_reruns": mr}[script]
  path = tmp_path / "README.md"
  other = f"{mr.START}\nkept\n{mr.END}" if module is mq else f"{mq.START}\nkept\n{mq.END}"
  path.write_text(f"before\n{module.START}\nold\n{module.END}\n{other}\nafter\n",
                  encoding="utf-8")
  monkeypatch.setattr(mq, "README", str(path))
  monkeypatch.setattr(mq, "run_quickstart", lambda steps, workdir: {"eval": {
      "mlm_accuracy": 0.1, "nsp_accuracy": 0.5}})
  monkeypatch.setattr(module, "body", lambda *a: "new")  # what a run would make of it
  assert module.main(["--readme"]) == 0
  assert path.read_text(encoding="utf-8") == (
      f"before\n{module.START}\nnew\n{module.END}\n{other}\nafter\n")
  assert f"{module.START}\nnew\n{module.END}" in capsys.readouterr().out


@pytest.mark.parametrize("script", ["measure_quickstart", "measure_reruns"])
def test_a_readme_without_the_block_is_one_error_line_before_any_run(
    script, tmp_path, monkeypatch, capsys):
  from tools import measure_reruns as mr
  module = {"measure_quickstart": mq, "measure_reruns": mr}[script]
  path = tmp_path / "README.md"
  path.write_text("# no markers\n", encoding="utf-8")
  monkeypatch.setattr(mq, "README", str(path))

  def run_quickstart(steps, workdir):
    raise AssertionError("ran before checking the README")

  monkeypatch.setattr(mq, "run_quickstart", run_quickstart)
  assert module.main(["--readme"]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: ") and "\n" not in err and str(path) in err
  assert module.START in err and path.read_text(encoding="utf-8") == "# no markers\n"


def test_the_readme_has_one_measured_block():
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    text = f.read()
  assert text.count(mq.START) == 1 and text.count(mq.END) == 1
  assert text.index(mq.START) < text.index("**Measured**") < text.index(mq.END)


def test_the_reruns_block_gives_each_run_and_the_largest_difference():
  from tools import measure_reruns as mr
  evals = [{"mlm_accuracy": a, "mlm_accuracy_stderr": 0.002, "nsp_accuracy": b,
            "nsp_accuracy_stderr": 0.007, "nsp_count": 4264.0}
           for a, b in [(0.160, 0.671), (0.152, 0.680), (0.157, 0.676)]]
  block = mr.markdown(evals, mq.DEFAULT_STEPS,
                      datetime.datetime(2026, 11, 23, 10, 0, tzinfo=datetime.timezone.utc))
  assert block.startswith(mr.START) and block.endswith(mr.END)
  assert "| 2 | 0.152 ± 0.002 | 0.680 ± 0.007 |" in block
  assert "| largest difference | 0.008 | 0.009 |" in block
  assert "eval split of 4264 examples" in block and "A quick check" not in block


def test_the_readme_has_one_reruns_block():
  from tools import measure_reruns as mr
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    text = f.read()
  assert text.count(mr.START) == 1 and text.count(mr.END) == 1
  assert text.index(mr.START) < text.index("**Reruns**") < text.index(mr.END)


def test_a_run_with_probes_reports_their_time_and_the_final_probe():
  text = TRANSCRIPT.replace("; evaluation 17.8 s\n", "; evaluation 17.8 s; probes 4.5 s\n")
  m = {**_measurement(wall=169.5), "text": text, "summary": mq._SUMMARY.search(text),
       "probe": {"word_order/accuracy": 0.5366, "word_order/num_eval": 123.0}}
  block = mq.markdown(m)
  assert "evaluations 17.8 s, probes 4.5 s, final evaluation and checkpoint 2.0 s" in block
  assert "the rest (plot, exit) 1.0 s" in block
  assert "| linear probe, word_order accuracy | 0.537 (dev of 123;" in block
