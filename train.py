"""Pre-train BERT.

  python train.py                                  # tiny BERT on the built-in corpus
  python train.py --config configs/base.py --workdir runs/base --config.data.corpus=my.txt

Rerunning with the same --workdir resumes from its latest checkpoint. Flags,
exit codes and errors: `bert_jax/commands/train.py` (the same as `bert-jax-train`).
"""

import os

from bert_jax.commands import launch

if __name__ == "__main__":
  launch.start()  # first: it may run this command again
  launch.note_sigterm()  # before the imports below, which take seconds
  from bert_jax.commands import train as train_cli

  here = os.path.dirname(os.path.abspath(__file__))
  train_cli.run(os.path.join(here, "configs", "tiny.py"), "runs/tiny")
