"""metrics.jsonl: lines that are not metrics records are skipped, counted and kept."""

import json
import os
import subprocess
import sys

import pytest

from bert_jax.train.reporting import Reporter, is_record


def _write(path, text: bytes) -> None:
  path.write_bytes(text)


def _records(*steps, split="train"):
  return b"".join(json.dumps({"split": split, "step": s, "loss": 1.0 / s}).encode() + b"\n"
                  for s in steps)


FOREIGN = [
    b"note: lowered the learning rate here\n",  # not JSON
    b'{"split": "train", "loss": 2.0}\n',  # no step (the KeyError of issue 12)
    b'{"split": "train", "step": "3", "loss": 2.0}\n',  # step not an int
    b'{"split": "train", "step": true, "loss": 2.0}\n',  # a bool is not a step
    b'{"step": 3, "loss": 2.0}\n',  # no split
    b'[1, 2, 3]\n',  # JSON, not an object
    b'{"split": "train", "step": 3, "loss": "high"}\n',  # a metric that is not a number
    b'\xff\xfe not utf-8 \x80\n',  # bytes that are not UTF-8
    b'{"step": 3, "split": "tr',  # not JSON (cut short), but not as `write` starts a line
]


@pytest.mark.parametrize("line", FOREIGN, ids=range(len(FOREIGN)))
def test_history_skips_and_counts_a_line_that_is_not_a_record(tmp_path, line):
  _write(tmp_path / "metrics.jsonl", _records(1, 2) + line + (b"\n" if not line.endswith(b"\n")
                                                              else b"") + _records(3))
  r = Reporter(str(tmp_path))
  rows = r.history(10)
  assert [row["step"] for row in rows] == [1, 2, 3]
  assert r.skipped_lines == 1
  warning = r.skipped_warning()
  assert warning.startswith("warning:") and "metrics.jsonl" in warning and "1 line" in warning
  assert "\n" not in warning


def test_blank_lines_are_not_counted_and_no_file_is_no_history(tmp_path):
  r = Reporter(str(tmp_path))
  assert r.history(5) == [] and r.skipped_lines == 0 and r.skipped_warning() is None
  _write(tmp_path / "metrics.jsonl", _records(1) + b"\n  \n" + _records(2))
  assert [row["step"] for row in r.history(5)] == [1, 2] and r.skipped_lines == 0


def test_truncate_drops_later_records_and_keeps_foreign_lines_in_place(tmp_path):
  path = tmp_path / "metrics.jsonl"
  _write(path, _records(1, 2) + b"my note\n" + b"\xff raw\n" + _records(3, 4) + b"tail note")
  r = Reporter(str(tmp_path))
  r.truncate(2)
  lines = path.read_bytes().split(b"\n")
  assert lines[2:5] == [b"my note", b"\xff raw", b"tail note"]  # bytes kept as they were
  assert lines[-1] == b""  # every line ends with a newline: the next record starts clean
  assert [json.loads(l)["step"] for l in lines[:2]] == [1, 2]
  assert r.skipped_lines == 3
  r.write("train", 3, {"loss": 0.5})
  r.close()
  assert [row["step"] for row in r.history(10)] == [1, 2, 3] and r.skipped_lines == 3


def test_truncate_then_plot_with_foreign_lines(tmp_path):
  _write(tmp_path / "metrics.jsonl",
         _records(1, 2) + _records(2, split="eval") + b'{"split": "train", "loss": 1}\n')
  r = Reporter(str(tmp_path))
  r.truncate(2)
  assert r.plot(2).endswith("training_curves.png")
  assert r.skipped_lines == 1


def test_is_record():
  assert is_record({"split": "eval", "step": 0})
  assert is_record({"split": "eval", "step": 0, "loss": float("nan"), "n": 3})
  assert not is_record({"split": "eval", "step": 0.0})
  assert not is_record(None) and not is_record("x")


def test_our_own_record_cut_short_by_a_kill_is_dropped_silently(tmp_path):
  path = tmp_path / "metrics.jsonl"
  _write(path, _records(1, 2) + b'{"split": "train", "step": 3, "lo')  # killed mid-write
  r = Reporter(str(tmp_path))
  assert [row["step"] for row in r.history(10)] == [1, 2] and r.skipped_lines == 0
  r.truncate(2)
  assert path.read_bytes() == _records(1, 2)
  # Appended to without a truncate in between: the merged line is still ours.
  _write(path, _records(1) + b'{"split": "train", "st' + _records(2) + b"a note\n")
  assert [row["step"] for row in r.history(10)] == [1] and r.skipped_lines == 1


def test_the_probe_panel_has_one_standard_error_bars_and_the_majority_line():
  # A dev of 123 moves by about 0.045 between evaluations: without bars that reads as a
  # trend (the Quick start's 0.51 -> 0.47 -> 0.54), with them it reads as noise.
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from matplotlib.container import ErrorbarContainer
  from bert_jax.train import reporting
  rows = [{"split": "probe", "step": s, "word_order/accuracy": a, "word_order/num_eval": 123.0,
           "word_order/majority_accuracy": 0.504} for s, a in ((400, 0.512), (800, 0.472))]
  fig, ax = plt.subplots()
  reporting._probe_points(ax, "word_order/accuracy", rows)  # pylint: disable=protected-access
  bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
  assert len(bars) == 1
  segments = bars[0].lines[2][0].get_segments()
  half = [abs(seg[1][1] - seg[0][1]) / 2 for seg in segments]
  assert half == pytest.approx([(a * (1 - a) / 123) ** 0.5 for a in (0.512, 0.472)])
  assert [tuple(l.get_ydata()) for l in ax.lines if l.get_linestyle() == "--"] == [(0.504, 0.504)]
  plt.close(fig)


def test_logging_a_metric_does_not_import_torch(tmp_path):
  # tensorboardX's writer imports torch when it is installed (seconds of every run's
  # start); a run that logs floats hides it from that import.
  pytest.importorskip("torch")  # requirements-peers.txt installs it, as CI does
  code = ("import sys\n"
          "from bert_jax.train.reporting import Reporter\n"
          "r = Reporter(sys.argv[1])\n"
          "r.write('train', 1, {'loss': 2.5})\n"
          "r.close()\n"
          "assert 'torch' not in sys.modules, 'torch imported'\n"
          "import torch\n"  # and torch itself still imports afterwards
          "print(torch.ones(1).item())\n")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=root,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0 and proc.stdout.strip() == "1.0", proc.stderr[-2000:]
  assert list(tmp_path.glob("tensorboard/events.out.tfevents.*"))
