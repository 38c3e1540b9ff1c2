"""Resuming: a damaged checkpoint is told from a damaged environment (issue 12, part 1).

A checkpoint whose own files are damaged is passed over for an older one (and
renamed to corrupt-<step> once that one is read); an error of the environment
(no space, read-only, permission, memory) stops the run with one line and moves
nothing; if no step can be read, nothing is moved and nothing starts over from
step 0; a run of another vocabulary is refused.

One tiny run's checkpoints (steps 4 and 8, written once per module) are copied
into each test's folder and restored with `RunCheckpoints.restore_latest`.
"""

import errno
import glob
import os
import shutil

import pytest

from bert_jax import settings
from bert_jax.io import checkpointing
from bert_jax.errors import CheckpointError
from bert_jax.train.resume import RunCheckpoints, RunState
from bert_jax.data.tokenizer import SPECIAL_TOKENS, Tokenizer
from bert_jax.trainer import make_steps
import soak_kill

WORDS = "the cat dog sat on a mat and ran to house tree bird sang".split()
VOCAB = list(SPECIAL_TOKENS) + WORDS + ["##s", "."]
STEPS = (4, 8)


def _meta_base(steps, vocab=VOCAB):
  return {"model_config": steps.bert_config.to_dict(), "vocab": list(vocab),
          "lowercase": True, "seed": 0, "config": {}}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
  root = tmp_path_factory.mktemp("resume")
  s = settings.from_config(soak_kill.tiny_config(str(root / "prepared"), 8))
  tok = Tokenizer(VOCAB, True)
  steps = make_steps(s, tok.vocab_size, tok.special_ids())
  params, opt_state = steps.init_state()
  ckpts = RunCheckpoints(str(root / "run" / "checkpoints"), 3, steps, _meta_base(steps))
  for step in STEPS:
    ckpts.save(RunState(step, step, params, opt_state), s.train.phases[0], step)
  ckpts.finish_save()
  ckpts.close()
  return {"steps": steps, "run": str(root / "run" / "checkpoints")}


@pytest.fixture
def ckpt_dir(written, tmp_path):
  """A fresh copy of the run's checkpoints/ folder."""
  path = str(tmp_path / "checkpoints")
  shutil.copytree(written["run"], path)
  return path


def _open(written, ckpt_dir, vocab=VOCAB):
  return RunCheckpoints(ckpt_dir, 3, written["steps"], _meta_base(written["steps"], vocab))


def _truncate(ckpt_dir, step):
  """Halves every data file of the step's params (one alone may hold no array read)."""
  for data in glob.glob(os.path.join(ckpt_dir, str(step), "params", "**", "d", "*"),
                        recursive=True):
    os.truncate(data, os.path.getsize(data) // 2)


def _listing(ckpt_dir):
  return sorted(os.listdir(ckpt_dir))


def _restore(written, ckpt_dir, **kwargs):
  ckpts = _open(written, ckpt_dir, **kwargs)
  try:
    return ckpts.restore_latest()
  finally:
    ckpts.close()


def _one_line_error(excinfo):
  msg = str(excinfo.value)
  assert "\n" not in msg, msg
  return msg


def test_an_intact_run_resumes_from_its_newest_step(written, ckpt_dir, capsys):
  assert _restore(written, ckpt_dir).step == 8
  assert capsys.readouterr().err == ""


def test_a_truncated_newest_step_falls_back_with_one_warning(written, ckpt_dir, capsys):
  _truncate(ckpt_dir, 8)
  assert _restore(written, ckpt_dir).step == 4
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith(f"warning: checkpoint {ckpt_dir}/8 is unreadable")
  assert "falling back to step 4" in err[0], err
  assert _listing(ckpt_dir) == ["4", "corrupt-8"]


# What the environment raises while reading, as Python and as TensorStore/XLA report it.
ENVIRONMENT = {
    "ENOSPC": (OSError(errno.ENOSPC, "No space left on device"), "No space left on device"),
    "EROFS": (OSError(errno.EROFS, "Read-only file system"), "Read-only file system"),
    "EACCES-tensorstore": (ValueError(
        'PERMISSION_DENIED: Error opening file "/x/params/ocdbt.process_0/d/abc": '
        "Permission denied [OS error: Permission denied] [os_error_code='13']"),
        "Permission denied"),
    "EPERM": (PermissionError(errno.EPERM, "Operation not permitted"), "Operation not permitted"),
    "MemoryError": (MemoryError(), "out of host memory"),
    "RESOURCE_EXHAUSTED": (RuntimeError(
        "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1073741824 bytes."),
        "RESOURCE_EXHAUSTED"),
}


@pytest.mark.parametrize("fault", ENVIRONMENT, ids=list(ENVIRONMENT))
def test_an_error_of_the_environment_is_one_line_and_moves_nothing(
    written, ckpt_dir, monkeypatch, fault):
  # Step 8 is really damaged and step 4 meets the environment's error: step 8
  # must not be moved aside on the way, nor step 4 skipped.
  error, cause = ENVIRONMENT[fault]
  _truncate(ckpt_dir, 8)
  real = checkpointing.restore_train_state

  def restore_train_state(mngr, step, *args):
    if step == 4:
      raise error
    return real(mngr, step, *args)

  monkeypatch.setattr(checkpointing, "restore_train_state", restore_train_state)
  before = _listing(ckpt_dir)
  with pytest.raises(CheckpointError) as e:
    _restore(written, ckpt_dir)
  msg = _one_line_error(e)
  assert f"could not read checkpoint {ckpt_dir}/4: " in msg and cause in msg, msg
  assert "nothing was moved" in msg, msg
  assert _listing(ckpt_dir) == before


def test_no_readable_step_is_one_line_listing_them_and_moves_nothing(written, ckpt_dir):
  for step in STEPS:
    _truncate(ckpt_dir, step)
  before = _listing(ckpt_dir)
  with pytest.raises(CheckpointError) as e:
    _restore(written, ckpt_dir)  # raising, not returning None: no start from step 0
  msg = _one_line_error(e)
  assert msg.startswith(f"no checkpoint in {ckpt_dir} can be restored: step 8 ("), msg
  assert "; step 4 (" in msg and "did not start over from step 0" in msg, msg
  assert _listing(ckpt_dir) == before


def test_a_read_only_workdir_with_a_damaged_step_is_one_line(written, ckpt_dir, monkeypatch):
  _truncate(ckpt_dir, 8)
  before = _listing(ckpt_dir)

  def rename(src, dst):
    raise OSError(errno.EROFS, "Read-only file system", src)

  monkeypatch.setattr(os, "rename", rename)
  with pytest.raises(CheckpointError) as e:
    _restore(written, ckpt_dir)
  msg = _one_line_error(e)
  assert msg.startswith(f"checkpoint {ckpt_dir}/8 is unreadable ("), msg
  assert "could not be moved aside: OSError: [Errno 30] Read-only file system" in msg, msg
  assert "step 4 is readable" in msg, msg
  assert _listing(ckpt_dir) == before


def test_another_vocabulary_of_the_same_size_is_refused(written, ckpt_dir):
  other = list(VOCAB)
  other[5], other[6] = other[6], other[5]  # same size, two ids swapped
  with pytest.raises(CheckpointError) as e:
    _restore(written, ckpt_dir, vocab=other)
  msg = _one_line_error(e)
  assert f"checkpoint {ckpt_dir} holds a run with another vocabulary" in msg, msg
  assert "first difference at id 5: 'the' there, 'cat' here" in msg, msg
  assert "use another --workdir" in msg, msg
  assert _listing(ckpt_dir) == ["4", "8"]


def test_a_checkpoint_without_a_stored_vocabulary_still_resumes(written, ckpt_dir):
  ckpts = RunCheckpoints(ckpt_dir, 3, written["steps"], {})  # no "vocab" to compare
  try:
    assert ckpts.restore_latest().step == 8
  finally:
    ckpts.close()


def test_params_readers_stop_on_an_error_of_the_environment(ckpt_dir, monkeypatch):
  def restore_step(*args):
    raise OSError(errno.EACCES, "Permission denied")

  monkeypatch.setattr(checkpointing, "_restore_params_step", restore_step)
  with pytest.raises(CheckpointError) as e:
    checkpointing.restore_params(ckpt_dir)  # not "skipped" for an older step
  msg = _one_line_error(e)
  assert f"could not read checkpoint {ckpt_dir}/8: OSError: [Errno 13]" in msg, msg


@pytest.mark.parametrize("error,kind", [
    (FileNotFoundError(errno.ENOENT, "No such file or directory"), "damage"),
    (ValueError('DATA_LOSS: Error reading "x/d/abc": Unexpected end of data'), "damage"),
    (KeyError("opt_state"), "damage"),
    (ValueError("Expecting value: line 1 column 12 (char 11)"), "damage"),
    (OSError(errno.ENOSPC, "No space left on device"), "environment"),
    (OSError(errno.EDQUOT, "Disk quota exceeded"), "environment"),
    (ValueError("UNKNOWN: writing failed [os_error_code='28']"), "environment"),
    (TypeError("unexpected keyword"), "other"),
], ids=["ENOENT", "DATA_LOSS", "missing-item", "JSON", "ENOSPC", "EDQUOT", "os_error_code",
        "TypeError"])
def test_classify(error, kind):
  assert checkpointing.classify(error)[0] == kind


def test_classify_looks_at_the_causes():
  try:
    try:
      raise OSError(errno.EROFS, "Read-only file system")
    except OSError as inner:
      raise ValueError("restore failed") from inner
  except ValueError as outer:
    assert checkpointing.classify(outer) == ("environment",
                                             "OSError: [Errno 30] Read-only file system")


@pytest.mark.slow
def test_a_run_killed_after_a_checkpoint_but_before_its_eval_row_redoes_that_eval(tmp_path):
  """Checkpoint 8 visible, the eval row of step 8 not yet written (kill -9 in between:
  the save is started before the evaluation). The resume evaluates step 8 again and its
  row is the uninterrupted run's (issue 41: the row was lost for good)."""
  import json
  from bert_jax.trainer import train_and_evaluate
  cache = str(tmp_path / "prepared")
  config = lambda: soak_kill.tiny_config(cache, 12, eval_every=4)  # noqa: E731
  whole, cut = str(tmp_path / "whole"), str(tmp_path / "cut")
  train_and_evaluate(config(), whole)
  shutil.copytree(whole, cut)
  for step in soak_kill.complete_steps(cut):
    if step > 8:
      shutil.rmtree(os.path.join(cut, "checkpoints", str(step)))
  metrics = os.path.join(cut, "metrics.jsonl")
  with open(metrics, encoding="utf-8") as f:
    rows = [json.loads(l) for l in f]
  kept = [r for r in rows if r["step"] < 8 or (r["step"] == 8 and r["split"] == "train")]
  with open(metrics, "w", encoding="utf-8") as f:
    f.writelines(json.dumps(r) + "\n" for r in kept)
  train_and_evaluate(config(), cut)

  def evals(workdir):
    with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
      return {r["step"]: r for r in map(json.loads, f) if r["split"] == "eval"}
  got, want = evals(cut), evals(whole)
  assert sorted(got) == sorted(want) == [4, 8, 12]
  assert got[8]["loss"] == want[8]["loss"] and got[12]["loss"] == want[12]["loss"]
