"""The typed boundary: an `ml_collections` config becomes frozen settings, once.

One module per config section (data, optimizer, train, run, init), each owning its
frozen dataclass, its name lists and all of its checks; this one puts them together
(`from_config`) with the checks that cross sections (the model against the data and
recipe), so every bad combination fails before any data is prepared. Imports only
`errors`, `default_config`, the families' registry (model/family, plain data) and
storage's URL check: the bottom of the folder order.

`from_config` is the only code of the package that reads a ConfigDict. Every check
fails with one line naming the `--config.` field and what was expected, before
anything is written. Lower modules take the settings they need (`DataSettings`,
`OptimizerSettings`, a `ModelConfig`), never the whole config; they import them from
here or from their section's module.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

import ml_collections

from bert_jax.model import family
from bert_jax.settings import model as model_config
from bert_jax.settings.model import ModelConfig
from bert_jax.settings import budgets
from bert_jax.settings.checks import fail, is_int, positive_int
from bert_jax.settings.data import DataSettings, MaskingSettings, data_settings
from bert_jax.settings.init import SOURCE_MODEL_FIELDS, InitSettings, init_settings
from bert_jax.settings.optimizer import OptimizerSettings
from bert_jax.settings.run import MeshSettings, ProbeSettings, ProfileSettings, RunSettings
from bert_jax.settings.train import BatchRampSettings, Phase, SpikeSettings, TrainSettings, phases
from bert_jax.storage.urls import check_path

__all__ = ("Settings", "from_config", "data_settings", "phases", "DataSettings",
           "MaskingSettings", "OptimizerSettings", "TrainSettings", "Phase", "SpikeSettings",
           "BatchRampSettings", "MeshSettings", "RunSettings", "ProbeSettings",
           "ProfileSettings", "InitSettings", "SOURCE_MODEL_FIELDS", "ModelConfig")


@dataclasses.dataclass(frozen=True)
class Settings:
  data: DataSettings
  masking: MaskingSettings
  model: ModelConfig  # vocab_size is a placeholder until the vocabulary is known
  optimizer: OptimizerSettings
  train: TrainSettings
  mesh: MeshSettings
  run: RunSettings
  config_json: str  # the whole config, stored in checkpoints for people
  requested_dtype: str = ""  # config.model.dtype as given ('auto' before resolving)
  requested_attention_kernel: str = ""  # config.model.attention_kernel as given
  init: InitSettings = InitSettings()  # --config.init_from ('' = from scratch)
  probe: ProbeSettings = ProbeSettings()  # config.probe (tasks=() = no probes)
  profile: ProfileSettings = ProfileSettings()  # config.profile

  @property
  def objective(self) -> str:
    """`config.objective` ('mlm+nsp', 'mlm', 'mlm+sop'): the data's and the loss's."""
    return self.data.objective

  def model_config(self, vocab_size: int) -> ModelConfig:
    """The model of this run once the vocabulary is known."""
    return dataclasses.replace(self.model, vocab_size=vocab_size).validate()


def _fields(cls, node: ml_collections.ConfigDict, exclude: tuple = ()) -> dict:
  names = {f.name for f in dataclasses.fields(cls)} - set(exclude)
  return {k: v for k, v in node.items() if k in names}


def _check_model_with_recipe(c: ml_collections.ConfigDict, model: ModelConfig,
                             init: InitSettings) -> None:
  """Cross-field checks of the model against the data and recipe, before any work."""
  if model.attention_kernel == "splash" and not model_config.splash_tiles_fit(c.train.seq_lens):
    raise fail("train.seq_lens", tuple(c.train.seq_lens), f"multiples of {model_config.SPLASH_TILE}"
               " with --config.model.attention_kernel='splash' (its blocks are TPU tiles of "
               f"{model_config.SPLASH_TILE})")
  fam = family.of(model)
  if not fam.rope and tuple(c.train.get("phase_rope_thetas", ())):
    raise fail("train.phase_rope_thetas", tuple(c.train.phase_rope_thetas), "() with "
               f"--config.model.family={model.family!r} (learned positions have no RoPE base)")
  if c.get("objective", "mlm+nsp") not in fam.objectives:
    raise fail("objective", c.get("objective", "mlm+nsp"),
               f"one of {', '.join(repr(o) for o in fam.objectives)} with "
               f"--config.model.family={model.family!r} (its heads train no other)")
  if c.masking.get("whole_word", False) and data_settings(c).is_bpe:
    raise fail("masking.whole_word", True, "False with a BPE vocabulary (whole words are "
                "found from WordPiece's '##' pieces)")
  if fam.segments and model.type_vocab_size < 2 and not init.path:  # A and B alike
    raise fail("model.type_vocab_size", model.type_vocab_size,
                ">= 2 (segment A and segment B of a sentence pair)")


# Config fields that hold a path: each a local path or a gs:// URL, checked first.
PATH_FIELDS = ("data.corpus", "data.vocab_file", "data.cache_dir", "init_from",
               "compile_cache_dir")


def _check_paths(c: ml_collections.ConfigDict) -> None:
  for name in PATH_FIELDS:
    node = c
    for part in name.split("."):
      node = node.get(part, "") if node is not None else ""
    if isinstance(node, str) and node:
      check_path(f"--config.{name}", node)


def _with_phases(c: ml_collections.ConfigDict, train: TrainSettings,
                 optimizer: OptimizerSettings) -> OptimizerSettings:
  """What follows the phases: the batch ramp starts below the batch; fields given per
  phase have one entry per phase; a 'phases' schedule's segments end where they do."""
  first = train.batch_of(train.phases[0])
  if train.ramp.start and not train.ramp.start < first:
    raise fail("train.batch_ramp.start", train.ramp.start,
               f"0 (off) or a global batch below the first phase's, {first}")
  if train.ramp.start and train.ramp.steps > train.phases[0].end and len(
      train.batch_sizes) > 1:
    raise fail("train.batch_ramp.steps", train.ramp.steps, f"at most the first phase's "
               f"{train.phases[0].end} steps with --config.train.phase_batch_sizes (the "
               "warm-up grows the first phase's batch)")
  streams = c.data.get("streams", 1)
  for b, field in train.batch_fields():  # every phase's
    if is_int(streams) and streams >= 1 and b % streams:
      raise fail("data.streams", streams, f"a divisor of --config.{field}={b} (each batch "
                 "is one sub-batch per stream)")
  for name in ("phase_weights", "phase_temperatures"):
    given = tuple(c.data.get(name, ()))
    if given and len(given) != len(train.phases):
      raise fail(f"data.{name}", given, f"() or {len(train.phases)} entries, one per phase")
  if optimizer.phase_ema:
    if len(optimizer.phase_ema) != len(train.phases):
      raise fail("train.phase_ema", tuple(optimizer.phase_ema),
                 f"() or {len(train.phases)} decays, one per phase")
    optimizer = dataclasses.replace(optimizer, ema_spans=tuple(
        (p.start, p.end, float(d)) for p, d in zip(train.phases, optimizer.phase_ema)))
  if optimizer.schedule != "phases":
    return optimizer
  return dataclasses.replace(optimizer, phase_bounds=tuple((p.start, p.end)
                                                           for p in train.phases))


def from_config(config: ml_collections.ConfigDict, explicit: Collection[str] = ()) -> Settings:
  """Checks `config` and returns its typed settings; raises ConfigError naming the field.
  `explicit`: the fields a command line set (settings.init: what a source must agree with)."""
  c = config
  _check_paths(c)
  t = c.train
  if not is_int(t.batch_size) or t.batch_size <= 0:
    raise fail("train.batch_size", t.batch_size, "> 0")
  budgeted, num_steps = budgets.of_config(t, explicit)
  opt_fields = _fields(OptimizerSettings, t)
  opt_fields["num_steps"] = num_steps
  if num_steps == 0 and is_int(num_steps):
    if not c.get("init_from", ""):
      raise fail("train.num_steps", 0, "a positive integer (0 only with --config.init_from: "
                  "evaluate and probe the source, write its step-0 checkpoint, train nothing)")
    opt_fields["num_steps"] = 1  # built for the checkpoint's optimizer state, never stepped
  optimizer = OptimizerSettings(**opt_fields)
  positive_int("train.grad_accum_steps", t.grad_accum_steps)
  positive_int("train.max_consecutive_nonfinite", t.max_consecutive_nonfinite)
  fields = _fields(ModelConfig, c.model, exclude=("vocab_size",))
  requested_dtype = fields["dtype"]
  if requested_dtype not in ("auto", "float32", "bfloat16", "float16"):
    raise fail("model.dtype", requested_dtype, "'auto', 'float32', 'bfloat16' or 'float16'")
  from bert_jax.model import precision  # 'auto' asks the backend: JAX only from here
  fields["dtype"] = precision.resolve_dtype(requested_dtype)
  requested_kernel = fields["attention_kernel"]
  fields["attention_kernel"] = precision.resolve_attention_kernel(
      requested_kernel, fields["attention_dropout_rate"], tuple(t.seq_lens))
  model = ModelConfig(vocab_size=1, **fields)
  data = c.data.to_dict()
  init = init_settings(c, data, explicit)
  if not init.path:  # else the shape is the source's: bert_jax.train.init_from checks the config
    model.validate()
  _check_model_with_recipe(c, model, init)
  # A continued run's position table is its source's: bert_jax.train.init_from checks seq_lens.
  max_positions = model.max_position_embeddings if not init.path else 1 << 30
  train = TrainSettings(
      batch_size=t.batch_size, grad_accum_steps=t.grad_accum_steps,
      max_consecutive_nonfinite=t.max_consecutive_nonfinite,
      phases=phases(t.phase_fractions, t.seq_lens, t.max_predictions, num_steps,
                    max_positions, t.get("phase_rope_thetas", ()), t.get("phase_mask_probs", ()),
                    tuple(t.get("phase_batch_sizes", ())), t.batch_size, budgeted,
                    tuple(t.get("phase_reset_optimizer", ()))),
      spike=SpikeSettings(**t.get("spike_rollback", ml_collections.ConfigDict()).to_dict()),
      ramp=BatchRampSettings(**t.get("batch_ramp", ml_collections.ConfigDict()).to_dict()))
  optimizer = _with_phases(c, train, optimizer)
  run = RunSettings(**_fields(RunSettings, c))
  probe = ProbeSettings(**{k: tuple(v) if isinstance(v, list) else v
                           for k, v in c.get("probe", ml_collections.ConfigDict()).items()})
  return Settings(
      data=data_settings(c),
      masking=MaskingSettings(**c.masking.to_dict(),
                              eval_mask_prob=c.get("eval", {}).get("mask_prob", 0.15)),
      model=model, optimizer=optimizer, train=train, mesh=MeshSettings(**c.mesh.to_dict()),
      run=run, config_json=c.to_json(), requested_dtype=requested_dtype, init=init, probe=probe,
      requested_attention_kernel=requested_kernel,
      profile=ProfileSettings(**{k: tuple(v) if isinstance(v, list) else v for k, v in
                                 c.get("profile", ml_collections.ConfigDict()).items()}))
