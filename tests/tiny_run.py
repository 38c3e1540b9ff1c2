"""The tiny run the end-to-end tests start from, defined once: configs/tiny.py with a
32-wide model (configs/tiny.py's 2 layers) on the toy corpus, 16 sequences a step.

    tiny_run.config(**{"train.num_steps": 8})   # a ConfigDict for train_and_evaluate
    tiny_run.flags(**{"train.num_steps": 8})    # the same as train.py flags
    tiny_run.bert_config(len(VOCAB))            # the same model as a ModelConfig

Tests add what their case needs (keys are dotted config fields).
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOY = os.path.join(ROOT, "data", "corpus.txt")
MODEL = {"model.hidden_size": 32, "model.num_heads": 2, "model.intermediate_size": 64}
BASE = {"data.corpus": TOY, "data.dupe_factor": 2, **MODEL, "train.batch_size": 16,
        "train.warmup_steps": 2, "progress_bar": False,
        # matplotlib's import and render: 2.5 s of every finished run; the tests of the
        # plot ask for it.
        "plot": False}


def overrides(**extra) -> dict:
  return {**BASE, **extra}


def config(**extra):
  sys.path.insert(0, ROOT)
  from configs import tiny  # pylint: disable=import-outside-toplevel
  c = tiny.get_config()
  c.update_from_flattened_dict(overrides(**extra))
  return c


def flags(**extra) -> list[str]:
  return [f"--config.{k}={v}" for k, v in overrides(**extra).items()]


def bert_config(vocab_size: int, **changes):
  """The tiny model as a `ModelConfig`, for tests that build a checkpoint directly
  (features, probes, fine-tuning): MODEL's width, 2 layers, 64 positions."""
  from bert_jax.settings.model import ModelConfig  # pylint: disable=import-outside-toplevel
  return ModelConfig(**{"vocab_size": vocab_size, "hidden_size": 32, "num_layers": 2,
                       "num_heads": 4, "intermediate_size": 64, "max_position_embeddings": 64,
                       "vocab_pad_multiple": 16, **changes})
