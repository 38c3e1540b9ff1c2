"""The pre-training command line: `train.py`, or `bert-jax-train` once installed.

  bert-jax-train --config tiny --workdir runs/tiny [--config.FIELD=VALUE ...]

--config is a config file, or the name of one the package ships: tiny, base,
large or default (BERT-Base, the reference recipe; the installed command's default).

Rerunning with the same --workdir resumes from its latest checkpoint.

Exit codes: 0 done; 2 bad input or config, or a failure reported on one
`error: ...` line (unwritable checkpoint, NaN/inf training); 143 (SIGTERM) and
130 (SIGINT) stopped during training after checkpointing the current step:
rerun the same command to resume.
"""

import os
import re
import signal
import sys
from typing import NoReturn

from absl import app, flags, logging
from ml_collections import config_flags

from bert_jax.commands import common
from bert_jax.parallel import startup
from bert_jax.errors import BertJaxError, Preempted, Terminated
from bert_jax.trainer import train_and_evaluate
from bert_jax.storage import fs

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # bert_jax/
_KINDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
          tuple: "a tuple such as '(128,512)'", list: "a tuple such as '(128,512)'"}


def flag_error(e: BaseException) -> NoReturn:
  """A bad flag or --config override: one `error:` line and exit 2, like any bad input."""
  while e.args and isinstance(e.args[0], BaseException):
    e = e.args[0]  # ml_collections wraps the KeyError of an unknown field
  text = " ".join(str(e.args[0] if e.args else e).split())
  if isinstance(e, (AttributeError, KeyError)):  # an override of a field that does not exist
    key = (re.findall(r"'([^']+)'", text) or [text])[0]
    names = [a.split("=", 1)[0] for a in sys.argv[1:]
             if a.startswith("--config.") and key in a.split("=", 1)[0].split(".")]
    hint = re.search(r'Did you mean "([^"]+)"', text)
    text = (f"{names[0] if names else '--config'}: the config has no field '{key}'; expected "
            + (f"'{hint.group(1)}' or another" if hint else "a") + " field of the config file")
  elif isinstance(e, flags.IllegalFlagValueError) and text.startswith("flag --"):
    name, _, rest = text[len("flag --"):].partition(": ")
    field = name.split("=", 1)[0]
    kind = _KINDS.get(type(FLAGS[field].value)) if field in FLAGS else None
    text = f"--{name}: " + (f"expected {kind} ({rest})" if kind else rest)
  elif isinstance(e, flags.Error):
    text += "; expected the flags that --helpfull lists"
  elif isinstance(e, OSError):  # a --config file that cannot be loaded
    why = re.search(r"\[Errno \d+\] (.*)", text)
    text = (f"--config: {why.group(1) if why else text}; expected a config file, or one "
            f"of {', '.join(CONFIG_NAMES)}")
  print(f"error: {text}", file=sys.stderr)
  sys.exit(2)


CONFIG_NAMES = ("tiny", "base", "large", "default")


def configs_dir() -> str:
  """The shipped configs: the repo's configs/ in a checkout, bert_jax/configs installed."""
  repo = os.path.join(os.path.dirname(PACKAGE_DIR), "configs")
  return repo if os.path.isfile(os.path.join(repo, "tiny.py")) else os.path.join(PACKAGE_DIR,
                                                                                 "configs")


def resolve_config_names(argv: list[str]) -> list[str]:
  """`--config tiny` (a shipped config's name, not a file here) -> its file's path."""
  out = list(argv)
  for i, arg in enumerate(out):
    if arg.startswith("--config="):
      name, prefix = arg.split("=", 1)[1], "--config="
    elif arg == "--config" and i + 1 < len(out):
      continue  # the value is the next argument: handled there
    elif i > 0 and out[i - 1] == "--config":
      name, prefix = arg, ""
    else:
      continue
    if name in CONFIG_NAMES and not os.path.exists(name):
      out[i] = prefix + os.path.join(configs_dir(), f"{name}.py")
  return out


def define_flags(default_config: str, default_workdir: str) -> None:
  """Defines --config (applying its --config.* overrides) and --workdir."""
  try:  # the overrides of the default config are applied here, when it is defined
    config_flags.DEFINE_config_file("config", default_config, "Config file (ml_collections).",
                                    lock_config=True)
  except (AttributeError, KeyError) as e:
    flag_error(e)
  flags.DEFINE_string("workdir", default_workdir,
                      "Checkpoints, logs and prepared data go here.")


flags.DEFINE_bool("jax_distributed", False,
                  "Call jax.distributed.initialize() first (multi-host TPU pods, multi-process GPU); "
                  "auto-detects the cluster unless the three flags below are given.")
flags.DEFINE_string("coordinator_address", None,
                    "host:port of process 0's coordinator, e.g. 127.0.0.1:12345 (implies "
                    "--jax_distributed; with --num_processes and --process_id). Process 0 "
                    "also serves bert-jax's start-up roster on port+1, which refuses a "
                    "second process with a taken --process_id: both ports must be free.")
flags.DEFINE_integer("num_processes", None, "Number of processes in the run.")
flags.DEFINE_integer("process_id", None, "This process's index, 0 .. num_processes-1.")
flags.DEFINE_integer("distributed_timeout", 120,
                     "Seconds for all processes to join the run (--jax_distributed); "
                     "then one error line and exit 2.")
FLAGS = flags.FLAGS


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, bad flags and --config overrides as one `error:` line (flag_error)."""
  try:
    rest = FLAGS(argv)
    getattr(FLAGS.config, "keys")  # a --config file that failed to load raises only when used
    return rest
  except (flags.Error, AttributeError, KeyError, OSError) as e:
    flag_error(e)


def _last_line(text: str, threads_failed: bool = False) -> None:
  # One write to the file descriptor: library threads (TensorStore after a failed
  # write) may still be printing tracebacks piecewise through sys.stderr, and a
  # half-printed one must not swallow the start of this line.
  fd = sys.stderr.fileno()
  if threads_failed:
    # Their later output goes nowhere, so this stays the last line; the newline
    # ends a line they may have left half-printed.
    fd = os.dup(fd)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stderr.fileno())
    text = "\n" + text
  os.write(fd, (text + "\n").encode())


def _exit_now(code: int) -> None:
  """Exits without waiting for library threads (Orbax's, after a failed write)."""
  sys.stdout.flush()
  os._exit(code)  # pylint: disable=protected-access


def _main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # Orbax logs every save at INFO
  try:
    explicit = (FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
    if FLAGS.jax_distributed or any(v is not None for v in explicit):
      startup.initialize_distributed(*explicit,
                                      initialization_timeout=FLAGS.distributed_timeout)
    # Until training installs its own handler (checkpoint, then stop), SIGTERM stops
    # what is under way (preparing data, compiling) as Ctrl-C does.
    signal.signal(signal.SIGTERM, _terminated)
    train_and_evaluate(FLAGS.config, FLAGS.workdir)
  except Preempted as e:  # SIGTERM/SIGINT during training: checkpointed, resumable
    _last_line(f"interrupted: {e}")
    sys.exit(128 + e.signum)  # 143 for SIGTERM, 130 for SIGINT, as the shell reports them
  except BertJaxError as e:
    threads_failed = getattr(e, "background_failure", False)
    _last_line(f"error: {e}", threads_failed)
    if threads_failed:
      _exit_now(2)  # a failed background write never keeps the process alive
    sys.exit(2)
  except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM before training started
    signum = e.signum if isinstance(e, Terminated) else signal.SIGINT
    _last_line(f"interrupted: {signal.Signals(signum).name} before training started (while "
               "preparing data or compiling); nothing to checkpoint yet: rerun the same "
               "command to go on (finished parts of the data are kept)")
    sys.exit(128 + signum)


def _terminated(signum, frame) -> NoReturn:
  del frame
  raise Terminated(signum)


HELP_ARGS = ("--help", "-h", "-?", "--helpshort", "--helpfull")


def config_meanings() -> dict[str, str]:
  """`data.corpus` -> its one-line meaning: the comment on (or above) its line in default_config.py."""
  path = os.path.join(PACKAGE_DIR, "default_config.py")
  meanings, above, section = {}, [], ""
  with fs.open(path, encoding="utf-8") as f:
    for line in f:
      text = line.strip()
      if text.startswith("#"):
        above = [] if text.startswith("# ---") else above + [text.lstrip("# ")]
        continue
      # Each section is its own function: `def _data()` holds the fields of `data.`.
      if (fn := re.match(r"def (_?)(\w+)\(", text)) is not None:
        section = fn.group(2) + "." if fn.group(1) else ""
      field = re.match(r"c\.([\w.]+)\s*=(.*)$", text)
      value = field.group(2).strip() if field else ""
      if field and not value.startswith("ml_collections.ConfigDict") and not re.match(
          r"_\w+\(\)", value):
        trailing = re.search(r"\s#\s*(.*)$", field.group(2))
        meanings[section + field.group(1)] = trailing.group(1) if trailing else " ".join(above)
      above = []
  return meanings


def _config_fields(config, prefix: str = "") -> list[tuple[str, object]]:
  out = []
  for key, value in config.items():
    if hasattr(value, "items"):
      out += _config_fields(value, f"{prefix}{key}.")
    else:
      out.append((f"{prefix}{key}", value))
  return out


def _print_help(argv: list[str]) -> NoReturn:
  """--help: the flags, then every --config.* field with its value and meaning; exit 0."""
  parse_flags([argv[0]] + [a for a in argv[1:] if a not in HELP_ARGS])
  full = "--helpfull" in argv[1:]
  lines = [__doc__.strip().split("\n\n")[1] if not full else __doc__.strip(), "\nflags:",
           FLAGS.get_help() if full else FLAGS.module_help(__name__)]
  meanings = config_meanings()
  fields = _config_fields(FLAGS.config)
  width = max(len(f"--config.{k}={v!r}") for k, v in fields)
  lines.append(f"\nconfig fields (defaults from {FLAGS['config'].serialize().split('=', 1)[-1]} "
               "with the overrides given; change one with --config.FIELD=VALUE):")
  for key, value in fields:
    shown = f"'{value}'" if isinstance(value, str) else str(value).replace(" ", "")
    lines.append(f"  {f'--config.{key}={shown}':<{width}}  {meanings.get(key, '')}".rstrip())
  common.write_stdout("\n".join(lines) + "\n")
  sys.exit(0)


def run(default_config: str, default_workdir: str) -> None:
  """Parses the flags (with these defaults) and trains."""
  sys.argv[:] = resolve_config_names(sys.argv)
  define_flags(default_config, default_workdir)
  if any(a in HELP_ARGS for a in sys.argv[1:]):
    _print_help(sys.argv)
  app.run(_main, flags_parser=parse_flags)


def cli() -> None:
  """`bert-jax-train`: the package's default config unless --config is given."""
  run(os.path.join(PACKAGE_DIR, "default_config.py"), "runs/bert")
