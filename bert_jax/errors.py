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


class TopologyError(BertJaxError):
  """A TPU topology that cannot be compiled for here: unknown name, libtpu missing or mismatched."""


class NonFiniteError(BertJaxError):
  """Training produced non-finite losses/gradients for too long, or NaN/inf parameters."""


class Preempted(BertJaxError):
  """SIGTERM/SIGINT stopped training after a checkpoint of the current step.

  Not a failure of the input: train.py prints one line and exits 128 + signal
  (143 for SIGTERM, 130 for SIGINT); rerunning the same command resumes.
  """

  def __init__(self, message: str, step: int, signum: int):
    super().__init__(message)
    self.step, self.signum = step, signum


class TaskError(BertJaxError):
  """A downstream task (GLUE or plain task directory, TFDS, built-in) that cannot be read."""


class Terminated(KeyboardInterrupt):
  """SIGTERM before training started (preparing data, compiling): nothing to checkpoint.

  A KeyboardInterrupt, so what cleans up after Ctrl-C (workers stopped, finished
  parts kept) does the same; the command prints one line and exits 143.
  """

  def __init__(self, signum: int):
    super().__init__(signum)
    self.signum = signum
