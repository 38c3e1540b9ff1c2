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

import argparse
import os
import sys

from bert_jax import console, settings as settings_lib
from bert_jax.commands import common, config_args
from bert_jax.commands.train import add_help, parse
from bert_jax.errors import BertJaxError
from bert_jax.storage import fs, outputs


def _parser(default_config: str) -> argparse.ArgumentParser:
  p = common.Parser(prog=common.prog("plan"), add_help=False,
                    description=__doc__.strip(), formatter_class=common.DocShown)
  config_args.add_config(p, default_config)
  p.add_argument("--topology", default="",
                 help="TPU slice to compile for (e.g. v4-8, v5e-16, v5p-8, v6e-8, or libtpu's "
                 "v4:2x2x1); '' = this machine's devices")
  p.add_argument("--json", default="", help="also write the plan to this JSON file")
  p.add_argument("--search", action="store_true", default=True,
                 help="when a train step does not fit, search the largest per-device batch "
                 "and the config changes that fit (a few more compiles; the default)")
  p.add_argument("--nosearch", dest="search", action="store_false", help="no fit search")
  p.add_argument("--eval", action="store_true", default=True,
                 help="also compile the eval step of each phase (the default)")
  p.add_argument("--noeval", dest="eval", action="store_false",
                 help="compile the train steps only")
  add_help(p)
  return p


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
  if json_path:
    outputs.check_file_target("--json", json_path)
  if topology_name:
    target, memory, label = topo.describe(), topo.hbm_bytes_per_device, "HBM"
  else:
    import jax
    devices = jax.devices()
    memory, label = topology.local_memory_bytes(devices)
    target = (f"this machine: {len(devices)} {devices[0].platform} devices "
              f"({devices[0].device_kind})")
  console.log(f"compiling for {target} ...")
  plan = plan_lib.make_plan(s, devices, target, memory, label, include_eval=include_eval,
                            search=search, log=console.log)
  print(plan_report.format_plan(plan), flush=True)
  if json_path:
    fs.write_json(json_path, plan.to_dict(), indent=1)
  return plan


def cli() -> None:
  """`bert-jax-plan`: the package's default config unless --config is given. Exits 0 when
  every step fits, 1 when one does not, 2 on bad input."""
  args, config = parse(_parser(os.path.join(config_args.PACKAGE_DIR, "default_config.py")),
                       sys.argv[1:])
  from absl import logging  # pylint: disable=import-outside-toplevel
  logging.set_verbosity(logging.WARNING)
  try:
    plan = run_plan(config, args.topology, args.json, args.search, args.eval)
  except BertJaxError as e:
    print(common.error_line(e), file=sys.stderr)
    sys.exit(2)
  sys.exit(0 if plan.fits else 1)


if __name__ == "__main__":
  cli()
