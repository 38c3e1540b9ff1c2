"""The loop's hooks (train/hooks): what watches a run is called at the moments the
loop promises, in order, and a run whose concerns are off registers none of them."""

import pytest

import tiny_run
from bert_jax import trainer
from bert_jax.train import hooks as hooks_lib


class Recorder:
  """Every hook call, in order."""

  def __init__(self):
    self.calls = []

  def start(self):
    self.calls.append(("start",))

  def before_step(self, step):
    self.calls.append(("before", step))

  def after_step(self, step, metrics):
    self.calls.append(("after", step))

  def on_time(self, category, seconds):
    self.calls.append(("time", category))

  def on_log(self, point):
    self.calls.append(("log", point.step, point.steps))
    return {"recorded": 1.0}

  def close(self):
    self.calls.append(("close",))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
  recorder = Recorder()
  made = trainer._hooks  # pylint: disable=protected-access
  patch = pytest.MonkeyPatch()
  patch.setattr(trainer, "_hooks", lambda *a: hooks_lib.Hooks([*made(*a).hooks, recorder]))
  try:
    trainer.train_and_evaluate(tiny_run.config(**{
        "train.num_steps": 6, "log_every": 2, "eval_every": 1000, "checkpoint_every": 1000,
        "probe.tasks": ()}), str(tmp_path_factory.mktemp("hooks") / "run"))
  finally:
    patch.undo()
  return recorder.calls


def test_every_step_is_seen_once_before_and_after_in_order(recorded):
  steps = [c for c in recorded if c[0] in ("before", "after")]
  assert steps == [c for s in range(6) for c in (("before", s), ("after", s + 1))]


def test_a_log_point_reports_the_steps_since_the_last_and_its_row_gets_the_hooks_metrics(
    recorded, tmp_path_factory):
  logs = [c for c in recorded if c[0] == "log"]
  # The first step compiles and is timed apart: the first interval holds steps 2..2.
  assert [c[1] for c in logs] == [2, 4, 6] and [c[2] for c in logs] == [1, 2, 2]


def test_the_loop_starts_and_closes_its_hooks_once_and_reports_the_compile(recorded):
  assert recorded[0] == ("start",) and recorded.count(("start",)) == 1
  assert recorded.count(("close",)) == 1
  assert recorded.count(("time", "compile")) == 1  # one phase, one compile


def test_concerns_that_are_off_are_not_registered():
  s = tiny_run.config(**{"watchdog_s": 0, "straggler_factor": 0.0})
  from bert_jax import settings
  got = trainer._hooks(settings.from_config(s), "", None)  # pylint: disable=protected-access
  names = [type(h).__name__ for h in got.hooks]
  assert "Watchdog" not in names and "Stragglers" not in names
