"""Where metrics go: TensorBoard events, a JSON-lines history, a PNG plot.

Only process 0 writes. The history file survives restarts, so the plot of a
resumed run shows the whole run.
"""

import json
import os

import jax


class Reporter:

  def __init__(self, workdir: str):
    self.active = jax.process_index() == 0
    self.history_path = os.path.join(workdir, "metrics.jsonl")
    self.plot_path = os.path.join(workdir, "training_curves.png")
    # Opened at the first write: a run that fails before logging anything (e.g.
    # resuming with another model size) leaves no new events file behind.
    self._tensorboard_dir = os.path.join(workdir, "tensorboard")
    self._writer = None

  def write(self, split: str, step: int, metrics: dict) -> None:
    if not self.active:
      return
    if self._writer is None:
      # tensorboardX imports torch when installed (+1.3 s a process): only a run that logs pays.
      from tensorboardX import SummaryWriter  # in-function on purpose, see above
      self._writer = SummaryWriter(self._tensorboard_dir)
    for k, v in metrics.items():
      self._writer.add_scalar(f"{split}/{k}", float(v), step)
    self._writer.flush()
    with open(self.history_path, "a") as f:
      f.write(json.dumps({"split": split, "step": step, **{k: float(v) for k, v in metrics.items()}}) + "\n")

  def history(self, max_step: int) -> list[dict]:
    """Records up to `max_step` (a resumed run drops what it will redo)."""
    if not os.path.exists(self.history_path):
      return []
    rows = []
    with open(self.history_path) as f:
      for line in f:
        try:
          rows.append(json.loads(line))
        except ValueError:
          pass  # a line cut short by a killed run (it is logged again on resume)
    return [r for r in rows if r["step"] <= max_step]

  def truncate(self, max_step: int) -> None:
    """After a resume from `max_step`, forget records logged past it."""
    if self.active:
      rows = self.history(max_step)
      tmp = self.history_path + ".tmp"
      with open(tmp, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
      os.replace(tmp, self.history_path)

  def plot(self, max_step: int) -> str:
    if not self.active:
      return ""
    import matplotlib  # heavy, and only needed when plotting
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after use("Agg"): no display needed
    rows = self.history(max_step)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, key, title in zip(axes, ("loss", "mlm_accuracy", "nsp_accuracy"),
                              ("loss (MLM + NSP)", "MLM accuracy", "NSP accuracy")):
      for split, style in (("train", "-"), ("eval", "o-")):
        pts = [(r["step"], r[key]) for r in rows if r["split"] == split and key in r]
        if pts:
          ax.plot(*zip(*pts), style, label=split)
      ax.set_title(title)
      ax.set_xlabel("step")
      ax.grid(alpha=0.3)
      ax.legend()
    fig.tight_layout()
    tmp = self.plot_path + ".tmp.png"
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, self.plot_path)
    return self.plot_path

  def close(self):
    if self._writer is not None:
      self._writer.close()
