"""Pre-train BERT.

  python train.py                                  # tiny BERT on the built-in corpus
  python train.py --config configs/base.py --workdir runs/base --config.data.corpus=my.txt

Rerunning with the same --workdir resumes from its latest checkpoint.
"""

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

_HERE = os.path.dirname(os.path.abspath(__file__))
config_flags.DEFINE_config_file(
    "config", os.path.join(_HERE, "configs", "tiny.py"), "Config file (ml_collections).",
    lock_config=True)
flags.DEFINE_string("workdir", "runs/tiny", "Checkpoints, logs and prepared data go here.")
flags.DEFINE_bool("jax_distributed", False,
                  "Call jax.distributed.initialize() first (multi-host TPU pods, multi-process GPU).")
FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # Orbax logs every save at INFO
  import jax
  if FLAGS.jax_distributed:
    jax.distributed.initialize()
  from bert_jax.errors import BertJaxError
  from bert_jax.trainer import train_and_evaluate
  try:
    train_and_evaluate(FLAGS.config, FLAGS.workdir)
  except BertJaxError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  except KeyboardInterrupt:
    print("interrupted", file=sys.stderr)
    sys.exit(130)


if __name__ == "__main__":
  sys.path.insert(0, _HERE)  # `configs` imports `configs.default`
  app.run(main)
