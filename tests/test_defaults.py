"""Issue 55: one source of defaults. default_config.py is it; a settings dataclass's own
default (what Python code gets without a config) equals it, field by field, or is listed
here with why it differs."""

import dataclasses

from bert_jax import default_config, settings

# Typed defaults that differ from the default config's, each on purpose.
DIFFERENT = {
    # A ModelConfig is also a checkpoint's or an import's model, whose vocabulary rows are
    # as its source has them; the default config pads its own to 128 (TPU tiles).
    "model.vocab_pad_multiple": "a model's rows as written",
    # 'auto' is resolved for the platform before a ModelConfig exists; a ModelConfig holds
    # a resolved dtype, and float32 is the reference's.
    "model.dtype": "resolved",
    # Off for settings built in Python; the command's config turns it on in the user's
    # cache folder, an environment-dependent path.
    "run.compile_cache_dir": "off in Python",
    # What the config asked before resolution: derived, not a default.
    "requested_dtype": "derived", "requested_attention_kernel": "derived",
}


def _differences(typed, configured, path=""):
  out = []
  for f in dataclasses.fields(typed):
    name = f"{path}{f.name}"
    value = getattr(configured, f.name)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
      out += _differences(getattr(typed, f.name), value, f"{name}.")
      continue
    default = (f.default if f.default is not dataclasses.MISSING else f.default_factory()
               if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
    if default is not dataclasses.MISSING and default != value and name not in DIFFERENT:
      out.append(f"{name}: typed default {default!r}, default_config {value!r}")
  return out


def test_every_typed_default_is_the_default_configs():
  s = settings.from_config(default_config.get_config())
  assert not _differences(s, s), "\n".join(_differences(s, s))


def test_the_check_finds_a_default_that_drifted():
  s = settings.from_config(default_config.get_config())
  drifted = dataclasses.replace(s, train=dataclasses.replace(
      s.train, spike=dataclasses.replace(s.train.spike, patience=s.train.spike.patience + 1)))
  assert any(d.startswith("train.spike.patience") for d in _differences(s, drifted))


def test_every_listed_difference_still_differs():
  """A listed field whose defaults came to agree is taken off the list."""
  s = settings.from_config(default_config.get_config())
  fields = {}
  def walk(obj, path=""):
    for f in dataclasses.fields(obj):
      v = getattr(obj, f.name)
      if dataclasses.is_dataclass(v) and not isinstance(v, type):
        walk(v, f"{path}{f.name}.")
      else:
        fields[f"{path}{f.name}"] = (f, v)
  walk(s)
  for name in DIFFERENT:
    f, v = fields[name]
    assert f.default is not dataclasses.MISSING and f.default != v, name
