"""What every bert-jax command shares: flags that fail in one line, one error wording.

Every command parses its flags with `Parser` (argparse); train and plan add a
config file and its `--config.FIELD=VALUE` overrides to theirs (commands/config_args).
All end the same way on bad input: one `error: ...` line on stderr and exit
status 2, nothing written; Ctrl-C is `interrupted` and 130.
"""

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Optional

from bert_jax.errors import BertJaxError, ConfigError
from bert_jax.storage import fs


class _DefaultsShown(argparse.HelpFormatter):
  """Each flag's default after its help, unless it has none or the help says it."""

  def _get_help_string(self, action):
    text = action.help or ""
    if (action.default not in (None, "", argparse.SUPPRESS) and not isinstance(
        action.default, bool) and "default" not in text and action.option_strings):
      text += f" (default: {action.default})"
    return text


class DocShown(_DefaultsShown, argparse.RawDescriptionHelpFormatter):
  """A command's module docstring as its help's description, line breaks kept."""



def prog(name: str) -> str:
  """How the user called command `name` (its usage line): `python -m bert_jax <name>`
  when started so, else its own module's name."""
  started = sys.argv[0] if sys.argv else ""
  return started if started.startswith("python -m bert_jax ") else f"python -m bert_jax.{name}"

class Parser(argparse.ArgumentParser):
  """argparse whose usage errors are a ConfigError (one line), not a usage dump, and
  whose help survives a closed pipe (`--help | head`); defaults are shown."""

  def __init__(self, *args, **kwargs):
    kwargs.setdefault("formatter_class", _DefaultsShown)
    super().__init__(*args, **kwargs)

  def error(self, message):
    raise ConfigError(message)

  def parse_known_args(self, args=None, namespace=None):
    parsed, rest = super().parse_known_args(args, namespace)
    # Every path a command takes is a local path or a gs:// URL: a value that looks like
    # another URL (GS://, gs:/b, s3://) is one line here, before it becomes a local folder.
    for action in self._actions:
      value = getattr(parsed, action.dest, None) if action.dest else None
      if isinstance(value, str):
        fs.check_path(action.option_strings[0] if action.option_strings
                      else (action.metavar or action.dest), value)
    return parsed, rest

  def print_help(self, file=None):
    if file is None:
      write_stdout(self.format_help())
    else:
      super().print_help(file)


def write_stdout(text: str) -> None:
  """`text` to stdout, flushed; a reader that closed the pipe early (`--help | head`)
  ends the output quietly instead of with a BrokenPipeError traceback."""
  try:
    sys.stdout.write(text)
    sys.stdout.flush()
  except BrokenPipeError:
    # Python flushes stdout again at exit: point it at /dev/null so that is quiet too.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def error_line(e: BaseException) -> str:
  """The one line a command prints for a BertJaxError."""
  return "error: " + " ".join(str(e).split())


def run_main(body: Callable[[list[str]], None], argv: Optional[Sequence[str]] = None) -> int:
  """Runs a command's `body(argv)`; its exit status (0, 2 bad input, 130 interrupted)."""
  argv = list(sys.argv[1:] if argv is None else argv)
  try:
    body(argv)
  except BertJaxError as e:
    if getattr(e, "background_failure", False):
      exit_after_failed_write(error_line(e))
    print(error_line(e), file=sys.stderr)
    return 2
  except KeyboardInterrupt:
    print("interrupted", file=sys.stderr)
    return 130
  return 0


def exit_after_failed_write(line: str) -> None:
  """`line` as the last word, then exit 2 at once: after a failed Orbax write, its
  threads and abandoned asyncio tasks keep printing (tracebacks, "Task exception was
  never retrieved") until the interpreter ends; their output then goes nowhere."""
  sys.stdout.flush()
  fd = os.dup(sys.stderr.fileno())
  devnull = os.open(os.devnull, os.O_WRONLY)
  os.dup2(devnull, sys.stderr.fileno())
  os.write(fd, ("\n" + line + "\n").encode())
  os._exit(2)  # pylint: disable=protected-access


def check_choice(flag: str, value, choices: Sequence[str]) -> None:
  """A flag's value against its choices, checked before anything slow (argparse's own
  `choices` would print usage; a caller of run() gets the same ConfigError)."""
  if value not in choices:
    raise ConfigError(f"{flag}={value!r}: expected one of {', '.join(choices)}")


def parse_layers(text: str) -> tuple[int, ...] | str:
  """--layers: comma-separated indices (0 = embeddings, -1 = last layer) or 'all'."""
  if text.strip().lower() == "all":
    return "all"  # every layer, resolved against the checkpoint's num_layers
  try:
    return tuple(int(x) for x in text.split(","))
  except ValueError:
    raise ConfigError(f"--layers={text!r}: expected comma-separated integers "
                      "such as -1 or -4,-3,-2,-1, or all") from None


def join_negative_values(argv: list[str], flags: Sequence[str] = ("--layers",)) -> list[str]:
  """argparse would take "-4,-3,-2,-1" after --layers for an option name: join them."""
  out, i = [], 0
  while i < len(argv):
    if argv[i] in flags and i + 1 < len(argv):
      out.append(f"{argv[i]}={argv[i + 1]}")
      i += 2
    else:
      out.append(argv[i])
      i += 1
  return out
