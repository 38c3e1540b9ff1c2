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

  def every_third(self, info):
    # Registered after the loop's own: this step's log row is already written (log_every 2).
    self.calls.append(("every 3", info.step, info.phase.index, info.state.step))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
  recorder = Recorder()
  made = trainer._hooks  # pylint: disable=protected-access
  patch = pytest.MonkeyPatch()
  def hooks(*a):
    registered = hooks_lib.Hooks([*made(*a).hooks, recorder])
    registered.add(recorder.every_third, every=3, name="every third")
    return registered
  patch.setattr(trainer, "_hooks", hooks)
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


def test_a_hook_added_with_every_runs_after_every_nth_step_and_after_the_loops_own(recorded):
  thirds = [c for c in recorded if c[0] == "every 3"]
  assert thirds == [("every 3", 3, 0, 3), ("every 3", 6, 0, 6)]
  # The loop's own calls at a cadence go first: step 6's row was logged before it.
  assert recorded.index(("log", 6, 2)) < recorded.index(thirds[-1])


class _Checkpoints:
  steps = None

  def latest_step(self):
    return None


def test_concerns_that_are_off_are_not_registered(tiny_config):
  s = tiny_config(**{"watchdog_s": 0, "straggler_factor": 0.0, "progress_bar": False})
  from bert_jax import settings
  got = trainer._hooks(settings.from_config(s), "", None, 0, _Checkpoints(),  # pylint: disable=protected-access
                       None)
  names = [type(h).__name__ for h in got.hooks]
  assert not {"Watchdog", "Stragglers", "ProgressBar", "Probes"} & set(names)
  assert "NonFiniteCheck" in names  # never off


@pytest.mark.parametrize("call, step, want", [
    # (every, at_phase_end, at_run_end): a phase of steps 4..10 in a run of 12 steps
    (((4,), True, None), 8, True), (((4,), True, None), 10, True),  # the log row
    (((4,), True, None), 9, False),
    (((5,), False, True), 12, True), (((5,), False, True), 10, True),  # the checkpoint
    (((5,), False, True), 11, False),
    (((6,), False, False), 6, True), (((6,), False, False), 12, False),  # the evaluation
    (((3, 5), False, None), 5, True), (((3, 5), False, None), 7, False),  # two cadences
    (((0,), True, None), 8, False), (((0,), True, None), 10, True)])  # the phase's end only
def test_a_cadence_is_due_at_its_multiples_and_ends_as_asked(call, step, want):
  every, at_phase_end, at_run_end = call
  p = hooks_lib.Periodic("p", print, every, at_phase_end, at_run_end)
  assert p.due(step, 12 if step > 10 else 10, 12) is want


def test_cadences_added_first_lead_in_their_order():
  h = hooks_lib.Hooks()
  for name, first in (("user", False), ("spike check", True), ("log", True), ("late", False)):
    h.add(print, every=1, name=name, first=first)
  assert [p.name for p in h.due(1, 10, 10)] == ["spike check", "log", "user", "late"]
  with pytest.raises(ValueError, match="every"):
    h.add(print, every=-1)
