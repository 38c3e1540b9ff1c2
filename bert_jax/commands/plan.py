"""Plan a run before renting it: `python -m bert_jax.plan`, or `bert-jax-plan` once installed.

  python -m bert_jax.plan --config configs/large.py --topology v4-8 [--config.FIELD=VALUE ...]
      [--json plan.json] [--nosearch] [--noeval]

Compiles every phase's train step and the eval step as train.py would build
them, for the TPU slice named by --topology (v4-8, v4-32, v5e-8 / v5litepod-8,
v5e-16, v5p-8, v6e-8, ...; needs libtpu, no TPU) or for this machine's devices,
allocating nothing. Prints per device: parameters, optimizer state, batch,
the compiler's temporaries and the total against the device's memory (fits or
not, and the headroom); the FLOPs of a step; and its collectives. When a step
does not fit: the largest per-device batch that does, and which of
gradient accumulation, FSDP and remat make it fit (each verified by a compile).

Exit codes: 0 every step fits; 1 some step does not fit; 2 bad input (one
`error: ...` line, nothing written).
"""

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from bert_jax import console, settings as settings_lib
from bert_jax.commands import common
from bert_jax.errors import BertJaxError, ConfigError
from bert_jax.storage import fs
from bert_jax.commands.train import (HELP_ARGS, PACKAGE_DIR, flag_error, parse_flags,
                                     resolve_config_names)

flags.DEFINE_string("topology", "", "TPU slice to compile for (e.g. v4-8, v5e-16, v5p-8, "
                    "v6e-8, or libtpu's v4:2x2x1); '' = this machine's devices.")
flags.DEFINE_string("json", "", "Also write the plan to this JSON file.")
flags.DEFINE_bool("search", True, "When a train step does not fit, search the largest "
                  "per-device batch and the config changes that fit (a few more compiles).")
flags.DEFINE_bool("eval", True, "Also compile the eval step of each phase.")
FLAGS = flags.FLAGS


def run_plan(config, topology_name: str = "", json_path: str = "", search: bool = True,
             include_eval: bool = True):
  """Plans `config` (a ConfigDict) and prints it; returns the Plan."""
  from bert_jax.planner import plan as plan_lib, plan_report, topology
  if topology_name:  # before anything asks JAX for a backend (the host side is the CPU)
    topo = topology.parse(topology_name)
    devices = topology.devices(topo)
  s = settings_lib.from_config(config)
  if s.init.path:  # the source's model shape, as train.py takes it
    from bert_jax.train import init_from
    s = init_from.run_settings(s, init_from.resolve(s))
  if json_path and not json_path.startswith("gs://") and not os.path.isdir(
      os.path.dirname(os.path.abspath(json_path))):
    raise ConfigError(f"--json {json_path}: its folder does not exist; expected a path in "
                      "an existing folder")
  if topology_name:
    target, memory, label = topo.describe(), topo.hbm_bytes_per_device, "HBM"
  else:
    import jax
    devices = jax.devices()
    memory, label = plan_lib.local_memory_bytes(devices)
    target = (f"this machine: {len(devices)} {devices[0].platform} devices "
              f"({devices[0].device_kind})")
  console.log(f"compiling for {target} ...")
  plan = plan_lib.make_plan(s, devices, target, memory, label, include_eval=include_eval,
                            search=search, log=console.log)
  print(plan_report.format_plan(plan), flush=True)
  if json_path:
    fs.write_json(json_path, plan.to_dict(), indent=1)
  return plan


def _main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  try:
    plan = run_plan(FLAGS.config, FLAGS.topology, FLAGS.json, FLAGS.search, FLAGS.eval)
  except BertJaxError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  sys.exit(0 if plan.fits else 1)


def cli() -> None:
  """`bert-jax-plan`: the package's default config unless --config is given."""
  default = os.path.join(PACKAGE_DIR, "default_config.py")
  sys.argv[:] = resolve_config_names(sys.argv)
  try:
    config_flags.DEFINE_config_file("config", default, "Config file (ml_collections).",
                                    lock_config=True)
  except (AttributeError, KeyError) as e:
    flag_error(e)
  if any(a in HELP_ARGS for a in sys.argv[1:]):  # absl's own help exits 1: "does not fit"
    parse_flags([sys.argv[0]] + [a for a in sys.argv[1:] if a not in HELP_ARGS])
    full = "--helpfull" in sys.argv[1:]
    common.write_stdout(__doc__.strip() + "\n\nflags:\n" + (
        FLAGS.get_help() if full else FLAGS.module_help(__name__)) + "\n")
    sys.exit(0)
  app.run(_main, flags_parser=parse_flags)


if __name__ == "__main__":
  cli()
