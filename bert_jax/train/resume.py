"""The checkpoint lifecycle of a run: restore the newest readable step, save, finish, abandon.

`checkpointing` knows Orbax's formats; this module knows what a run needs of
them: which step to resume from, what to do with one that cannot be read, and
how a failed background write becomes one clear line.
"""

import dataclasses
import functools
import json
from typing import Any, Optional, Sequence

import jax
import numpy as np

from bert_jax import console
from bert_jax.parallel import sharding
from bert_jax.io import checkpointing
from bert_jax.storage import fs, outputs, workdir_lock
from bert_jax.storage.workdir import Workdir, opened
from bert_jax.data import bpe
from bert_jax.errors import BertJaxError, CheckpointError, ConfigError, NonFiniteError
from bert_jax.settings.model import RUNTIME_FIELDS, ModelConfig
from bert_jax.settings import Phase, Settings
from bert_jax.settings.budgets import saved_phases
from bert_jax.train.steps import TrainSteps

# May change between runs without changing the parameters.
_FREE_MODEL_FIELDS = RUNTIME_FIELDS


@dataclasses.dataclass
class RunState:
  """Where a run is: the step about to run, the data position in its phase, the state."""
  step: int = 0
  position: int = 0  # global batches of the current phase consumed
  params: Any = None
  opt_state: Any = None
  spike: dict = dataclasses.field(default_factory=dict)  # train/spikes.SpikeDetector.state()


def check_resume_compatible(meta: dict, bert_config: ModelConfig, ckpt_dir: str,
                            vocab: Optional[Sequence[str]] = None) -> None:
  """A checkpoint's run must be this run's model and vocabulary; else one CheckpointError line.

  `vocab` (the run's tokens in id order) is compared with the token list every
  checkpoint's meta holds: a vocabulary of the same size with other tokens
  would otherwise train on silently mismatched ids.
  """
  saved = meta.get("model_config", {})
  for k, v in bert_config.to_dict().items():
    if k in _FREE_MODEL_FIELDS:
      continue
    if k in saved and saved[k] != v and k == "vocab_size":  # from the data, not the config
      raise CheckpointError(f"checkpoint {ckpt_dir} was trained with a vocabulary of {saved[k]} "
                            f"tokens but this run's prepared vocabulary has {v}; use another "
                            "--workdir, or the original corpus, vocabulary and cache_dir")
    if k in saved and saved[k] != v:
      raise CheckpointError(
          f"checkpoint {ckpt_dir} has model {k}={saved[k]!r} but the config asks for {v!r}; "
          "use another --workdir or the original config")
  theirs = meta.get("vocab")
  if vocab is not None and theirs is not None and list(theirs) != list(vocab):
    ours = list(vocab)
    at = next((i for i, (a, b) in enumerate(zip(theirs, ours)) if a != b),
              min(len(theirs), len(ours)))
    there = repr(theirs[at]) if at < len(theirs) else "none"
    here = repr(ours[at]) if at < len(ours) else "none"
    raise CheckpointError(
        f"checkpoint {ckpt_dir} holds a run with another vocabulary ({len(theirs)} tokens, "
        f"this run has {len(ours)}; first difference at id {at}: {there} there, {here} here); "
        "use another --workdir, or the run's own vocabulary (data.vocab_file)")


# Fields that change the optimizer state's tree or the data and loss: a run resumes only
# with the values it started with. (Defaults: checkpoints older than the field.)
_SAME_RECIPE = ((("train", "optimizer"), "adamw"), (("objective",), "mlm+nsp"),
                (("data", "streams"), 1),  # streams change the batches' order
                (("data", "packing"), False),  # packed rows are other examples
                # A batch-size warm-up decides where each step's examples start.
                (("train", "batch_ramp", "start"), 0), (("train", "batch_ramp", "steps"), 0),
                (("train", "batch_ramp", "stages"), 4))


def check_same_recipe(saved: dict, ours: dict, ckpt_dir: str) -> None:
  """The optimizer and objective of a checkpoint's run must be this run's; else one line."""
  for path, default in _SAME_RECIPE:
    get = lambda c: functools.reduce(lambda d, k: d.get(k, {}) if isinstance(d, dict) else {},
                                     path[:-1], c).get(path[-1], default)
    there, here = get(saved), get(ours)
    if there != here:
      field = ".".join(path)
      raise CheckpointError(
          f"--config.{field}={here!r}: checkpoint {ckpt_dir} was trained with {there!r}; "
          f"resume with --config.{field}={there!r} or use another --workdir")


def check_same_phase(saved: Any, step: Any, s: Settings, workdir: Workdir) -> None:
  """A run stopped inside a phase resumes at that phase's length, predictions and masking
  rates: its data position is a position among examples of that length (a changed
  `seq_lens` entry once went on at the new length from the old one's position), and
  its steps so far were masked at those rates. Later phases may change."""
  try:
    theirs = saved_phases(saved)
  except (KeyError, TypeError, ValueError, ConfigError):  # an older meta: nothing to compare
    return
  inside = next((p for p in theirs if isinstance(step, int) and p.start < step < p.end), None)
  if inside is None:
    return
  ours = next((p for p in s.train.phases if p.start <= step < p.end), None)
  what = lambda p: (p.seq_len, p.max_predictions)
  rates = lambda p: (p.mask_start, p.mask_end)
  if ours is not None and what(ours) == what(inside) and rates(ours) != rates(inside):
    raise ConfigError(
        f"--config.train.phase_mask_probs: --workdir {workdir} holds a run stopped at step "
        f"{step}, inside its phase {inside.index} (masking {_rates(inside)}), and this config "
        f"masks it {_rates(ours)}; expected the same until the phase ends (a later phase may "
        "change), or another --workdir; nothing was written")
  if (ours is not None and what(ours) == what(inside) and inside.batch_size
      and s.train.batch_of(ours) != inside.batch_size):
    raise ConfigError(
        f"--config.train.batch_size / phase_batch_sizes: --workdir {workdir} holds a run "
        f"stopped at step {step}, inside its phase {inside.index} (global batch "
        f"{inside.batch_size}), and this config trains it at {s.train.batch_of(ours)}; "
        "expected the same batch until the phase ends (its data position counts batches "
        "of that size; a later phase may change), or another --workdir; nothing was written")
  if ours is None or what(ours) != what(inside):
    now = (f"step {step} at length {ours.seq_len} with {ours.max_predictions} predictions"
           if ours else f"no step {step}")
    raise ConfigError(
        f"--config.train.seq_lens={tuple(saved['seq_lens'])} -> "
        f"{tuple(p.seq_len for p in s.train.phases)}: --workdir {workdir} holds a run stopped "
        f"at step {step}, inside its phase {inside.index} (steps {inside.start}..{inside.end} "
        f"at length {inside.seq_len} with {inside.max_predictions} predictions), and this "
        f"config trains {now}; expected that phase's length and predictions until it ends "
        "(a later phase may change), or another --workdir; nothing was written")


def check_finished_phases(saved: Any, step: Any, s: Settings, workdir: Workdir) -> None:
  """The phases a run has finished keep their definition on resume: their steps, length,
  predictions, batch, masking, RoPE base and learning-rate segment (they trained so, and
  a later segment starts from where theirs ended). The run's last phase may grow past
  its end (a finished run extended, as a WSD run from its stable phase); a new phase
  may be appended."""
  try:
    theirs = saved_phases(saved)
    segments = tuple(saved.get("phase_lr", ()) or ())
  except (KeyError, TypeError, ValueError, ConfigError, AttributeError):  # an older meta
    return
  ours = s.train.phases
  for old in (p for p in theirs if isinstance(step, int) and p.end <= step):
    new = ours[old.index] if old.index < len(ours) else None
    grows = old.index == len(theirs) - 1 and new is not None and new.end >= old.end
    field = "train.seq_lens" if new is None else _changed_field(old, new, grows, s, segments)
    if field is not None:
      raise ConfigError(
          f"--config.{field}: --workdir {workdir} holds a run at step {step} that finished "
          f"its phase {old.index} (steps {old.start}..{old.end} at length {old.seq_len}); "
          "this config defines that phase otherwise; expected the finished phases as they "
          "were (a phase not started yet may change, and one may be appended), or another "
          "--workdir; nothing was written")


def _changed_field(old: Phase, new: Phase, grows: bool, s: Settings,
                   segments: tuple) -> Optional[str]:
  """The config field that defines finished phase `old` otherwise in `new`, or None."""
  ours_lr = s.optimizer.phase_lr
  differs = (
      ("train.phase_fractions / phase_steps / phase_tokens / num_steps",
       new.start != old.start or (new.end != old.end and not grows)),
      ("train.seq_lens", new.seq_len != old.seq_len),
      ("train.max_predictions", new.max_predictions != old.max_predictions),
      ("train.phase_batch_sizes", bool(old.batch_size) and s.train.batch_of(new) != old.batch_size),
      ("train.phase_mask_probs", (new.mask_start, new.mask_end) != (old.mask_start, old.mask_end)),
      ("train.phase_rope_thetas", new.rope_theta != old.rope_theta),
      ("train.phase_lr", bool(segments and ours_lr) and (
          old.index >= len(ours_lr) or ours_lr[old.index] != segments[old.index])))
  return next((field for field, changed in differs if changed), None)


def check_same_phase_mixture(saved_data: dict, saved_train: Any, step: Any, s: Settings,
                             workdir: Workdir) -> None:
  """A mixture's weights and temperature per phase may change on resume for the phases
  not started yet; the phase the run stopped inside keeps its own."""
  if not (saved_data.get("phase_weights") or saved_data.get("phase_temperatures")
          or s.data.phase_weights or s.data.phase_temperatures):
    return  # one mixture for the whole run: data.sources and data.temperature are checked
  try:
    theirs = saved_phases(saved_train)
    was = dataclasses.replace(s.data, phase_weights=tuple(
        tuple(w) for w in saved_data.get("phase_weights", ())), phase_temperatures=tuple(
            saved_data.get("phase_temperatures", ())), temperature=saved_data["temperature"])
  except (KeyError, TypeError, ValueError, ConfigError):  # an older meta: nothing to compare
    return
  inside = next((p for p in theirs if isinstance(step, int) and p.start < step < p.end), None)
  if inside is not None and was.phase_mix(inside.index) != s.data.phase_mix(inside.index):
    (w0, t0), (w1, t1) = was.phase_mix(inside.index), s.data.phase_mix(inside.index)
    raise ConfigError(
        f"--config.data.phase_weights / phase_temperatures: --workdir {workdir} holds a run "
        f"stopped at step {step}, inside its phase {inside.index}, which drew weights {w0} at "
        f"temperature {t0:g}; this config asks {w1} at {t1:g}; expected the same until the "
        "phase ends (a later phase may change), or another --workdir; nothing was written")


def _rates(phase: Phase) -> str:
  if not phase.mask_start:
    return "at masking.mask_prob"
  if phase.mask_start == phase.mask_end:
    return f"at {phase.mask_start:g}"
  return f"from {phase.mask_start:g} to {phase.mask_end:g}"


# What makes a run's corpus and vocabulary; the other data fields may change on resume.
# A mixture's sources and temperature decide every batch's rows: a change is refused.
_DATA_IDENTITY = ("corpus", "format", "field", "max_documents", "lowercase", "sources",
                  "temperature")
_TRAINED_VOCAB = ("vocab_size", "vocab_sample_bytes")  # only when no vocab_file is given


def check_same_data(s: Settings, workdir: Workdir) -> None:
  """A workdir whose checkpoint was trained on another corpus or vocabulary is refused."""
  meta = checkpointing.newest_meta(checkpoint_dir(workdir))
  if isinstance(meta, dict) and isinstance(meta.get("config"), dict):
    check_same_recipe(meta["config"], json.loads(s.config_json), checkpoint_dir(workdir))
    check_same_phase(meta["config"].get("train"), meta.get("step"), s, workdir)
    check_finished_phases(meta["config"].get("train"), meta.get("step"), s, workdir)
  saved = ((meta or {}).get("config") or {}).get("data")
  if not isinstance(saved, dict):
    return  # no checkpoint (or one of an older version): nothing to compare
  check_same_phase_mixture(saved, meta["config"].get("train"), meta.get("step"), s, workdir)
  data = json.loads(s.config_json)["data"]
  both_files = bool(saved.get("vocab_file")) and bool(data.get("vocab_file"))
  fields = _DATA_IDENTITY + (() if both_files else ("vocab_file",)) + (
      () if data.get("vocab_file") else _TRAINED_VOCAB)
  differ = [k for k in fields if k in saved and not (
      outputs.same_path(saved[k], data.get(k)) if k == "corpus" else saved[k] == data.get(k))]
  where = f"--workdir {workdir} holds a run"
  if differ:
    was = ", ".join(f"{k}={saved[k]!r}" for k in differ)
    now = ", ".join(f"{k}={data.get(k)!r}" for k in differ)
    raise ConfigError(
        f"{where} on another corpus or vocabulary (its checkpoint has data {was}; this run "
        f"asks for {now}); nothing was written: use another --workdir, or the original data "
        "settings to resume it")
  if both_files and isinstance(meta.get("vocab"), list):  # the files' tokens, wherever they are
    theirs, ours = meta["vocab"], bpe.from_file(data["vocab_file"], data["lowercase"]).vocab
    if theirs != ours:
      at = next((i for i, (a, b) in enumerate(zip(theirs, ours)) if a != b),
                min(len(theirs), len(ours)))
      there, here = (repr(v[at]) if at < len(v) else "none" for v in (theirs, ours))
      raise ConfigError(
          f"{where} with another vocabulary ({len(theirs)} tokens, data.vocab_file "
          f"{data['vocab_file']} has {len(ours)}; first difference at id {at}: {there} there, "
          f"{here} here); nothing was written: use another --workdir, or the run's own "
          "vocabulary")


class RunCheckpoints:
  """Saves and restores the checkpoints of one run in `<workdir>/checkpoints`."""

  def __init__(self, ckpt_dir: str, keep: int, steps: TrainSteps, meta_base: dict):
    self.mngr = checkpointing.manager(ckpt_dir, keep=keep)
    self.ckpt_dir = str(self.mngr.directory)
    self.steps, self.meta_base = steps, meta_base
    self._saving: Optional[int] = None  # step of the checkpoint being written
    # Replicated over the whole mesh: Orbax cannot save a single-device array
    # when there are several processes.
    self.rng_data = sharding.replicate(np.asarray(jax.random.key_data(steps.train_key)),
                                       steps.mesh)

  def latest_step(self) -> Optional[int]:
    return self.mngr.latest_step()

  def all_steps(self) -> list[int]:
    return sorted(self.mngr.all_steps())

  def delete_after(self, step: int) -> None:
    """Deletes the checkpoints newer than `step` (a rollback: they must not be resumed)."""
    for newer in self.all_steps():
      if newer > step:
        self.mngr.delete(newer)

  def restore_latest(self) -> Optional[RunState]:
    """The newest readable checkpoint's state; None if there is none.

    Orbax only lists complete checkpoints (one killed mid-write is a temporary
    folder). Steps are tried newest first and nothing is moved while trying:
    - a step whose own files are damaged (missing, truncated, undecodable:
      `checkpointing.classify`) is passed over for the one before it;
    - once a step is read, the damaged newer ones are renamed to corrupt-<step>
      (kept for inspection; the steps can be written again), one warning each;
    - an error of the environment (no space, read-only, permission, memory)
      stops the run with one CheckpointError line, nothing moved;
    - a checkpoint of another model or vocabulary: one CheckpointError line;
    - if every step is damaged: one CheckpointError line listing them, nothing
      moved, and the run does not start over from step 0.
    """
    damaged = []  # (step, why), newest first
    for step in sorted(self.mngr.all_steps(), reverse=True):
      try:
        state = self.restore(step)
      except CheckpointError:
        raise  # readable but made for another model or vocabulary: for the user to decide
      except Exception as e:  # pylint: disable=broad-except
        kind, why = checkpointing.classify(e)
        if kind == "environment":
          raise CheckpointError(checkpointing.environment_message(
              f"{self.ckpt_dir}/{step}", why)) from None
        if kind == "other":
          raise
        damaged.append((step, why))
        continue
      self._move_aside(damaged, step)
      return state
    if damaged:
      raise CheckpointError(
          f"no checkpoint in {self.ckpt_dir} can be restored: "
          + "; ".join(f"step {s} ({why})" for s, why in damaged)
          + "; nothing was moved and training did not start over from step 0: expected at "
          "least one readable checkpoint; move the damaged steps away to start over, or use "
          "another --workdir")
    return None

  def _move_aside(self, damaged: list, readable: int) -> None:
    """Renames the damaged steps newer than `readable` to corrupt-<step>, newest first."""
    for step, why in damaged:
      try:
        moved = checkpointing.move_aside(self.mngr, step)
      except OSError as e:
        raise CheckpointError(
            f"checkpoint {self.ckpt_dir}/{step} is unreadable ({why}) and could not be moved "
            f"aside: {console.write_reason(e)}; step {readable} is readable: the workdir must "
            f"be writable (or move {step} away yourself), then rerun") from None
      console.warn(
          f"warning: checkpoint {self.ckpt_dir}/{step} is unreadable ({why}); "
          f"moved it to {moved}; falling back to step {readable}")

  def restore(self, step: int) -> RunState:
    # Model shape first: a mismatch should be one clear line, not an Orbax error.
    meta = self.mngr.restore(step, args=checkpointing.ocp.args.Composite(
        meta=checkpointing.ocp.args.JsonRestore()))["meta"]
    if not isinstance(meta, dict):
      raise ValueError(f"meta is a {type(meta).__name__}, not a JSON object")  # damaged
    # Its model as of its phase (a phase may train with its own RoPE base).
    phase = meta.get("phase", 0)
    check_resume_compatible(meta, self.steps.config_at(phase if isinstance(phase, int) else 0),
                            self.ckpt_dir, self.meta_base.get("vocab"))
    check_same_recipe(meta.get("config", {}), self.meta_base.get("config", {}), self.ckpt_dir)
    rng = jax.ShapeDtypeStruct(self.rng_data.shape, self.rng_data.dtype,
                               sharding=sharding.replicated(self.steps.mesh))
    params, opt_state, meta = checkpointing.restore_train_state(
        self.mngr, step, self.steps.abstract_params,
        {"opt_state": self.steps.abstract_opt_state, "rng": rng})
    return RunState(int(meta["step"]), int(meta["data_position"]), params,
                    opt_state["opt_state"], meta.get("spike", {}))

  def save(self, state: RunState, phase: Phase, position: int) -> None:
    """Starts writing a checkpoint of the current step (in the background)."""
    if not self.steps.params_finite(state.params):
      raise NonFiniteError(
          f"parameters at step {state.step} are NaN/inf: not writing checkpoint "
          f"{self.ckpt_dir}/{state.step}; the newest checkpoint is step {self.latest_step()}")
    self.finish_save()  # the previous one's error belongs to its own step
    workdir_lock.check_held(verify=True)  # no checkpoint after another run took over
    try:
      checkpointing.save(self.mngr, state.step, state.params,
                         {"opt_state": state.opt_state, "rng": self.rng_data},
                         {**self.meta_base, "step": state.step, "phase": phase.index,
                          "model_config": self.steps.config_at(phase.index).to_dict(),
                          "data_position": position, "spike": state.spike})
    except Exception as e:  # pylint: disable=broad-except
      raise self._write_error(state.step, e) from e
    self._saving = state.step

  @property
  def saving(self) -> Optional[int]:
    """The step of the checkpoint being written, if any."""
    return self._saving

  def finish_save(self) -> None:
    """Waits for the checkpoint being written; a failure becomes one clear line."""
    step, self._saving = self._saving, None
    try:
      self.mngr.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except
      raise self._write_error(step, e) from e

  def close(self) -> None:
    self.mngr.close()

  def _write_error(self, step: Optional[int], e: Exception) -> CheckpointError:
    older = None  # the listing failed too (or its bucket is not answering): say nothing
    if not fs.given_up(self.ckpt_dir):
      try:
        self.mngr.reload()  # what is on disk, not what was started
        older = [s for s in self.mngr.all_steps() if s != step]
      except Exception:  # pylint: disable=broad-except
        pass
    if older is None:
      known = ("the checkpoints before it could not be listed (the storage did not answer) "
               "and were not touched; rerun the same command once it can be written")
    elif older:
      known = f"older checkpoints are intact (steps {older})"
    else:
      known = "there is no older checkpoint; rerun the same command once it can be written"
    err = CheckpointError(
        f"could not write checkpoint {self.ckpt_dir}/{step}: {console.write_reason(e)}; {known}")
    # Orbax/TensorStore threads of the failed write may still print (tracebacks of
    # their closed event loops) and keep the interpreter from exiting: commands/train
    # ends the process at once after this error's line.
    err.background_failure = True
    err.unanswered = fs.unanswered_bucket(self.ckpt_dir, e)  # a run stopping on it stops waiting
    return err

  def abandon(self, cause: Optional[BaseException] = None) -> None:
    """After an error (`cause`): finish the checkpoint in flight, never hiding the error.

    If that write fails too, `cause` is marked as the write's own error is: Orbax's
    threads and abandoned tasks of the failed write print tracebacks until the
    interpreter ends (issue 41), so the command ends the process at once after its line.
    """
    try:
      if self._saving is not None:
        self.finish_save()
    except BertJaxError as e:
      console.warn(f"warning: {e}")
      if isinstance(cause, BertJaxError):
        cause.background_failure = True
    try:
      self.mngr.close()
    except Exception:  # pylint: disable=broad-except
      pass  # e.g. the error of a save already reported


def checkpoint_dir(workdir: Workdir) -> str:
  return opened(workdir).checkpoints
