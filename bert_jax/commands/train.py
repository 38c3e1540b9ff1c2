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

import argparse
import os
import signal
import sys

from bert_jax.commands import common, config_args, launch
from bert_jax.commands.config_args import PACKAGE_DIR
from bert_jax.parallel import startup
from bert_jax.errors import (BertJaxError, ConfigError, Preempted, Terminated,
                             stop_requested)
from bert_jax.train import goodput
from bert_jax.trainer import train_and_evaluate

HELP_ARGS = ("--help", "-h", "-?", "--helpshort", "--helpfull")


def add_help(parser: argparse.ArgumentParser) -> None:
  """-h/--help (and absl's --helpshort/--helpfull, which users of absl type): the flags,
  then every config field; handled after the config is read, so it shows the overrides."""
  parser.add_argument(*HELP_ARGS, dest="help", action="store_true",
                      help="show the flags and every config field, then exit")


def _parser(default_config: str, default_workdir: str) -> argparse.ArgumentParser:
  p = common.Parser(prog=os.path.basename(sys.argv[0]) or "train.py", add_help=False,
                    description=__doc__.strip(), formatter_class=common.DocShown)
  config_args.add_config(p, default_config)
  p.add_argument("--workdir", default=default_workdir,
                 help="checkpoints, logs and prepared data go here (a path or gs://...)")
  p.add_argument("--jax_distributed", action="store_true",
                 help="call jax.distributed.initialize() first (multi-host TPU pods, "
                 "multi-process GPU); auto-detects the cluster unless the three flags below "
                 "are given")
  p.add_argument("--coordinator_address", default=None,
                 help="host:port of process 0's coordinator, e.g. 127.0.0.1:12345 (implies "
                 "--jax_distributed; with --num_processes and --process_id). Process 0 also "
                 "serves bert-jax's start-up roster on port+1, which refuses a second process "
                 "with a taken --process_id: both ports must be free")
  p.add_argument("--num_processes", type=int, default=None,
                 help="number of processes in the run")
  p.add_argument("--process_id", type=int, default=None,
                 help="this process's index, 0 .. num_processes-1")
  p.add_argument("--distributed_timeout", type=int, default=120,
                 help="seconds for all processes to join the run (--jax_distributed); then "
                 "one error line and exit 2")
  p.add_argument("--verbosity", type=int, default=-1,
                 help="absl logging level of the libraries (Orbax): -1 warnings, 0 info, "
                 "1 debug")
  add_help(p)
  return p


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


def _train(args: argparse.Namespace, config) -> None:
  from absl import logging  # pylint: disable=import-outside-toplevel
  logging.set_verbosity(args.verbosity)  # Orbax logs every save at INFO
  try:
    explicit = (args.coordinator_address, args.num_processes, args.process_id)
    if args.jax_distributed or any(v is not None for v in explicit):
      startup.initialize_distributed(*explicit,
                                      initialization_timeout=args.distributed_timeout)
    # Until training installs its own handler (checkpoint, then stop), a SIGTERM is
    # noted, and preparation and start-up stop at their next safe point.
    signal.signal(signal.SIGTERM, _terminated)
    # The session's goodput counts from the process's start: imports and start-up too.
    train_and_evaluate(config, args.workdir, started=goodput.process_start_time(),
                       explicit=args.explicit)
    # Past the last safe point the run is complete: a SIGTERM from here to the exit
    # (the interpreter's shutdown takes a second or more) says so instead of promising
    # a stop, and one that came before says so too; once either way.
    signal.signal(signal.SIGTERM, _ended)
    if (signum := stop_requested()) is not None:
      _ended(signum, None)
  except Preempted as e:  # SIGTERM/SIGINT during training: checkpointed, resumable
    threads_failed = getattr(e, "background_failure", False)  # its checkpoint's write
    _last_line(f"interrupted: {e}", threads_failed)
    if threads_failed:
      _exit_now(128 + e.signum)
    sys.exit(128 + e.signum)  # 143 for SIGTERM, 130 for SIGINT, as the shell reports them
  except BertJaxError as e:
    threads_failed = getattr(e, "background_failure", False)
    _last_line(f"error: {e}", threads_failed)
    if threads_failed:
      _exit_now(2)  # a failed background write never keeps the process alive
    sys.exit(2)
  except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM before training started
    signum = e.signum if isinstance(e, Terminated) else signal.SIGINT
    during = getattr(e, "during", "")
    _last_line(f"interrupted: {signal.Signals(signum).name} before training started ("
               + (f"while {during}; nothing of it is kept: rerun the same command to start "
                  "it again)" if during else
                  "while preparing data or compiling); nothing to checkpoint yet: rerun the "
                  "same command to go on (finished parts of the data are kept)"))
    sys.exit(128 + signum)


_terminated = launch.note_stop  # SIGTERM before training: noted for the next safe point
_END_LINE_DUE = [True]  # popped once: list.pop is one step, which no handler splits


def _ended(signum: int, frame) -> None:
  """A stop request that came after the run's last safe point: the run is complete."""
  del frame
  try:
    _END_LINE_DUE.pop()
  except IndexError:
    return
  _last_line(f"{signal.Signals(signum).name} received as the run ended: it is complete "
             "(final checkpoint written); nothing to resume")


def parse(parser: argparse.ArgumentParser, argv: list[str]):
  """(args, config), or the one `error:` line and exit 2; --help prints the flags and
  every config field (with the overrides given) and exits 0."""
  try:
    args, config = config_args.parse_known(parser, argv)
  except ConfigError as e:
    print(common.error_line(e), file=sys.stderr)
    sys.exit(2)
  if args.help:
    common.write_stdout(parser.format_help() + "\n"
                        + config_args.fields_help(config, args.config) + "\n")
    sys.exit(0)
  return args, config


def run(default_config: str, default_workdir: str, argv: list[str] | None = None) -> None:
  """Parses the flags (with these defaults) and trains."""
  parser = _parser(default_config, default_workdir)
  args, config = parse(parser, list(sys.argv[1:] if argv is None else argv))
  _train(args, config)


def cli() -> None:
  """`bert-jax-train`: the package's default config unless --config is given."""
  run(os.path.join(PACKAGE_DIR, "default_config.py"), "runs/bert")
