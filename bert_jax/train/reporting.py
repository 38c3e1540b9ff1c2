"""Where metrics go: TensorBoard events, a JSON-lines history, a PNG plot.

Only process 0 writes. The history file survives restarts, so the plot of a
resumed run shows the whole run.
"""

import json
import math
import numbers
import sys
from typing import Any, Optional

import jax

from bert_jax import console
from bert_jax.errors import ConfigError
from bert_jax.storage import fs
from bert_jax.storage.mirror import LogFiles
from bert_jax.storage.workdir import METRICS, TENSORBOARD, Workdir, opened


def _summary_writer() -> type:
  """tensorboardX's SummaryWriter, imported on first use (only a run that logs pays).

  Its module imports torch when installed, only so it can accept torch tensors: 1.3-3 s
  of every run's start on a 2-core host, for a run that logs floats. So torch is hidden
  from that import unless this process has already imported it."""
  if "torch" in sys.modules:
    from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
    return SummaryWriter
  sys.modules["torch"] = None  # `import torch` then raises ImportError, which it expects
  try:
    from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
  finally:
    del sys.modules["torch"]
  return SummaryWriter


def is_record(obj: Any) -> bool:
  """A metrics record: a JSON object with an int `step`, a str `split`, numeric metrics."""
  return (isinstance(obj, dict) and type(obj.get("step")) is int
          and isinstance(obj.get("split"), str)
          and all(isinstance(v, numbers.Real) and not isinstance(v, bool)
                  for k, v in obj.items() if k not in ("step", "split")))


# How `write` starts every line (json.dumps of a dict whose first key is "split").
_OWN_PREFIX = '{"split": "'


class Reporter:

  def __init__(self, workdir: Workdir):
    self.active = jax.process_index() == 0
    where = opened(workdir)
    self.history_path, self.plot_path = where.metrics, where.plot
    # Opened at the first write: a run that fails before logging anything (e.g.
    # resuming with another model size) leaves no new events file behind.
    self._tensorboard_dir = where.tensorboard
    # On a bucket, both are local copies that a background thread appends to their
    # objects (storage/mirror.py): a log point never waits on the bucket.
    self._logs = LogFiles(where.root)
    self._writer = None
    self._failed = False  # a write failed (full disk): close() then stays quiet
    self.skipped_lines = 0  # lines of metrics.jsonl that the last read skipped

  def write(self, split: str, step: int, metrics: dict) -> None:
    if not self.active:
      return
    where = self._tensorboard_dir
    try:  # a full disk: one line (a record cut short is dropped on resume)
      if self._writer is None:
        self._writer = _summary_writer()(self._logs.folder(TENSORBOARD))
      for k, v in metrics.items():
        self._writer.add_scalar(f"{split}/{k}", float(v), step)
      self._writer.flush()
      self._logs.found(TENSORBOARD)
      where = self.history_path
      line = json.dumps({"split": split, "step": step, **{k: float(v) for k, v in metrics.items()}}) + "\n"
      with fs.open(self._logs.file(METRICS), "a", encoding="utf-8") as f:
        f.write(line)
    except OSError as e:
      self._failed = True
      raise self._write_error(e, where) from None

  def history(self, max_step: int) -> list[dict]:
    """Records up to `max_step` (a resumed run drops what it will redo).

    A line that is not a metrics record (see `is_record`: a note someone
    appended, a line cut short by a killed run) is skipped and counted in
    `self.skipped_lines`, for the caller to warn about once.
    """
    return [r for r in self._read() if isinstance(r, dict) and r["step"] <= max_step]

  def _read(self) -> list:
    """Every line in file order: a record as a dict, anything else as its raw text."""
    self.skipped_lines = 0
    out = []
    for line in _lines(self._text()):
      try:
        record = json.loads(line)
      except ValueError:
        if line.startswith(_OWN_PREFIX):
          continue  # our own record cut short by a killed run: logged again on resume
        record = None
      if is_record(record):
        out.append(record)
      else:
        out.append(line)
        self.skipped_lines += bool(line.strip())
    return out

  def truncate(self, max_step: int) -> None:
    """After a resume from `max_step`, forget records logged past it.

    Lines that are not records stay where they are (a note someone appended
    is not ours to delete); one without its final newline gets one, so the
    next record starts on a line of its own. Only a record of ours cut short
    by a killed run (it starts as `write` starts a line, but is not JSON) is
    dropped: the resumed run logs it again.
    """
    if not self.active:
      return
    kept = []
    for line in self._read():
      if isinstance(line, dict):
        if line["step"] <= max_step:
          kept.append(json.dumps(line) + "\n")
      elif line.strip():
        kept.append(line if line.endswith("\n") else line + "\n")
    if "".join(kept) == self._text():
      return  # nothing to forget: a resume on a full disk writes nothing here
    try:
      self._logs.replace(METRICS, "".join(kept).encode("utf-8", "surrogateescape"))
    except OSError as e:
      raise self._write_error(e, self.history_path) from None

  def _text(self) -> str:
    # surrogateescape: a line of any bytes is skipped (and kept by truncate), never an error.
    try:
      with fs.open(self._logs.file(METRICS), encoding="utf-8", errors="surrogateescape",
                newline="\n") as f:
        return f.read()
    except FileNotFoundError:
      return ""

  def sync(self) -> None:
    """Every record written so far is in the workdir (on a bucket: uploaded) when this
    returns, or its error line is raised: called before each checkpoint, so a kill
    never loses a record that the resumed run would not log again."""
    self._logs.sync()

  @staticmethod
  def _write_error(e: OSError, path: str) -> ConfigError:
    return ConfigError(f"could not write {path}: {console.write_reason(e)}; "
                       "expected a workdir with free space that can be written (what was "
                       "written before is intact: rerun the same command once it can be)")

  def skipped_warning(self) -> Optional[str]:
    """One `warning:` line about the last read's skipped lines, or None."""
    if not self.skipped_lines:
      return None
    return (f"warning: {self.history_path}: skipped {self.skipped_lines} line(s) that are not "
            "metrics records (expected JSON objects with an integer \"step\" and a string "
            "\"split\"); they are kept in the file but not plotted")

  def plot(self, max_step: int, phase_starts: tuple = ()) -> str:
    """The curves up to `max_step`; a dotted vertical line where each later phase starts."""
    if not self.active:
      return ""
    import matplotlib  # heavy, and only needed when plotting
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after use("Agg"): no display needed
    rows = self.history(max_step)
    # The second task's panel follows config.objective: NSP, SOP, or none for 'mlm'.
    task = next((t for t in ("nsp", "sop") if any(f"{t}_accuracy" in r for r in rows)), None)
    panels = (("loss", "loss (MLM" + (f" + {task.upper()})" if task else ")"), "loss"),
              ("mlm_accuracy", "MLM accuracy", "accuracy"))
    if task:
      panels += ((f"{task}_accuracy", f"{task.upper()} accuracy", "accuracy"),)
    # config.probe.tasks: one panel per probe metric, the downstream curve beside MLM's.
    probe_keys = sorted({k for r in rows if r["split"] == "probe" for k in r
                         if k not in ("split", "step")
                         and not k.endswith(("/num_eval", "/majority_accuracy"))})
    panels += tuple((k, f"probe: {k.replace('/', ' ')}", k.rsplit("/", 1)[-1])
                    for k in probe_keys)
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4))
    for ax, (key, title, ylabel) in zip(axes, panels):
      for split, style in (("train", "-"), ("eval", "o-"), ("probe", "o-")):
        pts = [(r["step"], r[key]) for r in rows if r["split"] == split and key in r]
        if pts and split == "probe":
          _probe_points(ax, key, [r for r in rows if r["split"] == "probe" and key in r])
        elif pts:
          ax.plot(*zip(*pts), style, label=split)
      if key == "mlm_accuracy":
        pts = [(r["step"], r["mlm_best_constant_accuracy"]) for r in rows
               if r["split"] == "eval" and "mlm_best_constant_accuracy" in r]
        if pts:
          ax.plot(*zip(*pts), "k--", alpha=0.6, label="best constant guess")
      elif key in ("nsp_accuracy", "sop_accuracy"):
        ax.axhline(0.5, color="k", linestyle="--", alpha=0.6, label="chance (0.5)")
      for i, start in enumerate(phase_starts):
        ax.axvline(start, color="gray", linestyle=":", label="phase change" if i == 0 else None)
      ax.set_title(title)
      ax.set_xlabel("step")
      ax.set_ylabel(ylabel)
      ax.grid(alpha=0.3)
      if ax.get_legend_handles_labels()[0]:
        ax.legend()
    fig.tight_layout()
    with fs.local_copy_for_writing(self.plot_path) as local:
      tmp = local + ".tmp.png"
      fig.savefig(tmp, dpi=100)
      plt.close(fig)
      fs.replace(tmp, local)
    return self.plot_path

  def close(self):
    """Closes the events file; on a bucket, waits for the last upload (a StorageError
    line if the bucket fails it). The local copies stay for `plot` and `history`, and
    go with this object."""
    try:
      if self._writer is not None:
        self._writer.close()
        self._logs.found(TENSORBOARD)
      self._logs.close()
    except OSError as e:
      if not self._failed:  # after a failed write its error is the one reported
        raise self._write_error(e, self._tensorboard_dir) from None


def _lines(text: str) -> list[str]:
  """`text` in lines ended by "\\n" only (as a file read with newline="\\n")."""
  parts = text.split("\n")
  return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _probe_points(ax, key: str, rows: list[dict]) -> None:
  """A probe's curve with ± one binomial standard error per point (an accuracy), and the
  majority class as a dashed line: a dev of ~100 moves by ± 0.05 between evaluations,
  which without bars reads as a trend."""
  prefix = key.rsplit("/", 1)[0]
  steps = [r["step"] for r in rows]
  values = [r[key] for r in rows]
  errs = [math.sqrt(v * (1 - v) / r[f"{prefix}/num_eval"])
          if key.endswith("accuracy") and r.get(f"{prefix}/num_eval") and 0 <= v <= 1 else 0.0
          for v, r in zip(values, rows)]
  ax.errorbar(steps, values, yerr=errs, fmt="o-", capsize=3, label="probe (± 1 s.e.)")
  bases = [r[f"{prefix}/majority_accuracy"] for r in rows if f"{prefix}/majority_accuracy" in r]
  if bases:
    ax.axhline(bases[-1], color="k", linestyle="--", alpha=0.6,
               label=f"majority class ({bases[-1]:.3f})")
