"""The run report: true rates and MFU, a clean console, --help, finished reruns, eval noise, plot."""

import contextlib
import hashlib
import io
import json
import os
import subprocess
import sys

import pytest
from tqdm import tqdm

from bert_jax import console
from bert_jax.model import flops
from bert_jax.train import eval_report, loop as loop_lib
from bert_jax.train.reporting import Reporter
from bert_jax.trainer import train_and_evaluate
from tests.test_train import ROOT, _config
from tools import cases

pytestmark = pytest.mark.slow  # trains or starts processes: the full suite, not the fast tier


def _train(config, workdir):
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    ev = train_and_evaluate(config, workdir)
  return ev, out.getvalue(), err.getvalue()


def _rows(workdir, split):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [r for r in map(json.loads, f) if r["split"] == split]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
  """One short run to completion with the progress bar on, its console captured."""
  workdir = str(tmp_path_factory.mktemp("report"))
  c = _config(steps=8)
  c.log_every, c.eval_every, c.checkpoint_every = 2, 4, 4
  c.progress_bar = True
  return (workdir, c) + _train(c, workdir)


# --- 1. true rates ---

def test_flops_formula_is_the_benchmarks():
  size = cases.model_sizes()["tiny"]
  ours = flops.model_flops(size.num_layers, size.hidden_size, size.intermediate_size,
                           size.vocab_size, "train", 32, 128, 20)
  assert ours == cases.model_flops(size, "train", 32, 128, 20) > 0
  assert flops.model_flops(2, 8, 16, 10, "features", 1, 4) * 3 < flops.model_flops(
      2, 8, 16, 10, "train", 1, 4, 2)


@pytest.mark.parametrize("kind, peak", [
    ("TPU v4", 275e12), ("TPU v5 lite", 197e12), ("TPU v5e", 197e12), ("TPU v5", 459e12),
    ("TPU v5p", 459e12), ("TPU v6 lite", 918e12), ("TPU7x", 1153.5e12), ("NVIDIA A100-SXM4-80GB", 312e12),
    ("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12), ("NVIDIA H200", 989e12),
    ("cpu", None)])
def test_peak_by_device_kind(kind, peak):
  assert flops.peak_flops(kind) == peak


def test_rates_go_to_metrics_and_the_summary_averages_them(finished):
  workdir, _, _, out, _ = finished
  rows = _rows(workdir, "train")
  assert [r["step"] for r in rows] == [2, 4, 6, 8]
  timed = [r for r in rows if "steps_per_sec" in r]
  assert len(timed) == 4  # step 1 (compile) is timed apart; steps 2..8 are in the rates
  for r in timed:
    assert r["sequences_per_sec"] == pytest.approx(16 * r["steps_per_sec"])
    assert r["tokens_per_sec"] == pytest.approx(32 * r["sequences_per_sec"])
    assert 0 < r["real_tokens_per_sec"] <= r["tokens_per_sec"]
    assert r["model_flops_per_sec"] > 0 and "mfu" not in r  # no known peak on CPU
  assert "MFU left out: no known peak FLOP/s for device kind 'cpu'" in out
  summary = [l for l in out.splitlines() if l.startswith("throughput: 7 steps in")]
  assert len(summary) == 1 and "compile (first step) phase 0" in summary[0]
  # The summary's seconds are the intervals the rates were measured over.
  seconds = float(summary[0].split(" in ")[1].split(" s")[0])
  intervals = [2 - 1, 2, 2, 2]
  assert sum(n / r["steps_per_sec"] for n, r in zip(intervals, timed)) == pytest.approx(
      seconds, abs=0.06)


def test_rates_wait_for_the_steps(monkeypatch, tmp_path):
  """The clock is read after the step's results exist: a slow device shows in the rate."""
  real = loop_lib.jax.block_until_ready
  calls = []
  monkeypatch.setattr(loop_lib.jax, "block_until_ready",
                      lambda x: calls.append(1) or real(x))
  c = _config(steps=6)
  c.log_every = c.eval_every = c.checkpoint_every = 3
  _train(c, str(tmp_path))
  assert len(calls) >= 3  # the compile step and each log point at least


# --- 2. a clean console ---

def test_lines_during_training_are_not_glued_to_the_bar(finished):
  _, _, _, out, err = finished
  lines = out.splitlines()
  assert any(l.startswith("phase 0: steps 0..8") for l in lines)
  assert sum(l.startswith("eval @ 4: MLM accuracy") for l in lines) == 1
  assert not any("%|" in l for l in lines)  # the bar stays on stderr
  assert "%|" in err and "eval @" not in err and "phase 0" not in err


def test_console_prints_through_the_bar_while_it_is_shown():
  f = io.StringIO()
  bar = tqdm(total=3, file=f)
  out = io.StringIO()
  with contextlib.redirect_stdout(out), console.through(bar):
    console.log("hello")
  bar.close()
  assert out.getvalue() == "hello\n"
  assert console._bar_write is None


# --- 3. --help ---

def test_help_exits_0_and_lists_config_fields_with_defaults_and_meanings():
  proc = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--help",
                         "--config.train.batch_size=32"],
                        capture_output=True, text=True, timeout=120,
                        env={**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"})
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.splitlines()
  batch = [l for l in lines if "--config.train.batch_size=" in l]
  assert batch and "--config.train.batch_size=32" in batch[0] and "global" in batch[0]
  assert any("--config.train.num_steps=1200" in l for l in lines)  # configs/tiny.py
  assert "--workdir" in proc.stdout


def test_every_config_field_has_a_meaning():
  from bert_jax import default_config
  from bert_jax.commands import config_args
  meanings = config_args.config_meanings()
  fields = [k for k, _ in config_args.config_fields(default_config.get_config())]
  assert [k for k in fields if not meanings.get(k)] == []


# --- 4. rerunning a finished run writes nothing ---

def _snapshot(workdir):
  out = {}
  for root, _, files in os.walk(workdir):
    for name in files:
      if name.startswith(".lock-"):  # the workdir lock records its holder
        continue
      path = os.path.join(root, name)
      with open(path, "rb") as f:
        out[os.path.relpath(path, workdir)] = hashlib.sha256(f.read()).hexdigest()
  return out


def test_rerunning_a_finished_run_says_so_and_writes_nothing(finished):
  workdir, config, ev, _, _ = finished
  before = _snapshot(workdir)
  again, out, _ = _train(config, workdir)
  assert _snapshot(workdir) == before
  assert "run already complete at step 8: MLM accuracy" in out
  assert again["mlm_accuracy"] == pytest.approx(ev["mlm_accuracy"])
  assert len([r for r in _rows(workdir, "eval") if r["step"] == 8]) == 1


# --- 5. evaluation noise ---

def test_eval_accuracies_carry_their_standard_error(finished):
  workdir, _, ev, out, _ = finished
  for name in ("mlm", "nsp"):
    p, n = ev[f"{name}_accuracy"], ev[f"{name}_count"]
    assert ev[f"{name}_accuracy_stderr"] == pytest.approx((p * (1 - p) / n) ** 0.5)
  assert all("mlm_accuracy_stderr" in r for r in _rows(workdir, "eval"))
  final = [l for l in out.splitlines() if l.startswith("final eval @ step 8")]
  assert len(final) == 1 and final[0].count("±") == 2


def test_stderr_formula():
  ev = eval_report.with_stderr({"mlm_accuracy": 0.2, "mlm_count": 100.0,
                             "nsp_accuracy": 0.5, "nsp_count": 0.0})
  assert ev["mlm_accuracy_stderr"] == pytest.approx(0.04)
  assert ev["nsp_accuracy_stderr"] != ev["nsp_accuracy_stderr"]  # NaN: no examples


# --- 6. overfitting ---

def _bare_loop():
  lp = loop_lib.TrainLoop.__new__(loop_lib.TrainLoop)
  lp._evals, lp._warned_overfit, lp._last_train_loss = [], False, float("nan")
  return lp


def _eval(loss):
  return {"loss": loss, "mlm_accuracy": 0.1, "mlm_count": 10.0, "nsp_accuracy": 0.5,
          "nsp_count": 10.0}


def test_overfitting_is_said_once(capsys):
  lp = _bare_loop()
  for train_loss, eval_loss in [(5, 4), (4, 4.5), (3, 5), (2, 6), (1, 7)]:
    lp._last_train_loss = train_loss
    lp._after_eval(_eval(eval_loss))
  err = capsys.readouterr().err
  assert err.count("the model is overfitting; use more data or fewer steps") == 1
  assert "eval loss rose 4.000 -> 4.500 -> 5.000" in err


def test_no_overfitting_note_when_both_losses_fall(capsys):
  lp = _bare_loop()
  for train_loss, eval_loss in [(5, 6), (4, 5), (3, 4.5), (2, 4.6)]:
    lp._last_train_loss = train_loss
    lp._after_eval(_eval(eval_loss))
  assert "overfitting" not in capsys.readouterr().err


# --- 7. the plot ---

def test_plot_labels_baselines_and_phase_changes(tmp_path, monkeypatch):
  import matplotlib
  matplotlib.use("Agg")
  from matplotlib.figure import Figure
  rows = [{"split": "train", "step": s, "loss": 5.0 / s, "mlm_accuracy": 0.1 * s,
           "nsp_accuracy": 0.5} for s in (1, 2, 3, 4)]
  rows += [{"split": "eval", "step": s, "loss": 5.0, "mlm_accuracy": 0.1,
            "nsp_accuracy": 0.5, "mlm_best_constant_accuracy": 0.06} for s in (2, 4)]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  figs = []
  real_savefig = Figure.savefig
  monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: figs.append(self) or
                      real_savefig(self, *a, **k))
  path = Reporter(str(tmp_path)).plot(4, [3])
  assert os.path.exists(path)
  loss, mlm, nsp = figs[0].axes
  assert [ax.get_ylabel() for ax in (loss, mlm, nsp)] == ["loss", "accuracy", "accuracy"]
  labels = lambda ax: [l.get_label() for l in ax.get_lines()]
  assert "best constant guess" in labels(mlm) and "chance (0.5)" in labels(nsp)
  for ax in (loss, mlm, nsp):
    assert "phase change" in labels(ax)
