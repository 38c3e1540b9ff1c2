"""User-facing errors: one line, naming the input and what was expected."""


class BertJaxError(Exception):
  """A problem with the user's input or config (not a bug).

  train.py / the CLIs print `error: <message>` on one line and exit 2.
  Messages name the file/field and what was expected.
  """


class CorpusError(BertJaxError):
  """The corpus (file, TFDS name, built-in) cannot make examples."""


class ConfigError(BertJaxError):
  """A config value that cannot work."""


class CheckpointError(BertJaxError):
  """A checkpoint that is missing, corrupt or does not match the config."""
