"""In-training probes of a multi-process run: 2 processes x 4 simulated CPU devices log the
same probe metrics as 1 process x 8 devices, with replicated and FSDP parameters.

Each run is a `python train.py` subprocess (a process has one device layout for life).
Besides the shipped `word_order` task (near chance on a model this small) the runs probe
a plain task that random features read well above chance ("does the text contain
'the'?"), so features gathered wrongly across processes would change its accuracy.
"""

import json
import os
import sys

import numpy as np
import pytest

import multiprocess_runs as multiprocess

pytestmark = pytest.mark.slow  # trains in subprocesses

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = [
    "--config.data.dupe_factor=2", "--config.data.vocab_size=512",
    "--config.model.hidden_size=32", "--config.model.num_layers=1",
    "--config.model.num_heads=2", "--config.model.intermediate_size=64",
    "--config.model.max_position_embeddings=32",
    "--config.train.seq_lens=(32,)", "--config.train.max_predictions=(5,)",
    "--config.train.batch_size=16", "--config.train.learning_rate=0.1",
    "--config.train.num_steps=2", "--config.eval_every=1", "--config.eval_batches=1",
    "--config.log_every=1", "--config.progress_bar=False", "--config.probe.max_examples=80",
    # No compilation cache: a process that loads a program while its peer compiles it
    # reaches the first collective far earlier (see multiprocess.launch_retrying).
    "--config.compile_cache_dir=",
    "--config.plot=False",  # matplotlib: 2.5 s of every run
]


def _write_task(directory: str) -> str:
  """A plain task: label 'yes' when the text contains 'the' (3 times), from the corpus's words."""
  with open(os.path.join(ROOT, "data", "corpus.txt"), encoding="utf-8") as f:
    words = sorted({w for line in f for w in line.split()} - {"the"})
  rs = np.random.RandomState(0)
  os.makedirs(directory)
  for split, n in (("train", 160), ("dev", 80)):
    with open(os.path.join(directory, f"{split}.tsv"), "w", encoding="utf-8") as f:
      f.write("label\ttext\n")
      for i in range(n):
        text = list(rs.choice(words, size=rs.randint(2, 6)))
        for _ in range(3 if i % 2 else 0):  # a strong signal in mean-pooled features
          text.insert(rs.randint(len(text) + 1), "the")
        f.write(f"{'yes' if i % 2 else 'no'}\t{' '.join(text)}\n")
  return directory



def _probe_rows(workdir: str) -> list[dict]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(l) for l in f if l.strip()]
  return [r for r in rows if r["split"] == "probe"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
  root = tmp_path_factory.mktemp("distributed_probes")
  logs = str(root / "logs")
  os.makedirs(logs)
  task = _write_task(str(root / "has_the"))
  corpus = os.path.join(ROOT, "data", "corpus.txt")
  common = [f"--config.data.corpus={corpus}", f"--config.probe.tasks=('word_order','{task}')"]
  train = [sys.executable, os.path.join(ROOT, "train.py"), *TINY, *common]

  def one(name, sharding):
    return {name: ([*train, f"--workdir={root / name}", f"--config.data.cache_dir={root}/data",
                    f"--config.mesh.param_sharding={sharding}"], 8)}

  def two(name, sharding):
    address = f"127.0.0.1:{multiprocess.free_port()}"
    return {f"{name}{i}": ([*train, f"--workdir={root / name}",
                            f"--config.data.cache_dir={root}/data",
                            f"--config.mesh.param_sharding={sharding}",
                            f"--coordinator_address={address}", "--num_processes=2",
                            f"--process_id={i}"], 4) for i in range(2)}

  stdout = {}
  # Every run reads the data the reference prepared: a process that prepared its own
  # while the other waited at the first collective could miss gloo's 30 s start-up window.
  launches = {"reference": one("reference", "replicated"),
              "replicated": two("replicated", "replicated"), "fsdp": two("fsdp", "fsdp")}
  for name, commands in launches.items():
    stdout |= multiprocess.launch_retrying(commands, logs, None, ROOT, [str(root / name)])
  return {name: _probe_rows(str(root / name)) for name in ("reference", "replicated", "fsdp")
          } | {"stdout": stdout, "task": os.path.basename(task)}


@pytest.mark.parametrize("run", ["replicated", "fsdp"])
def test_two_processes_log_the_probes_of_one(runs, run):
  expected, got, task = runs["reference"], runs[run], runs["task"]
  assert [r["step"] for r in got] == [r["step"] for r in expected] == [1, 2]
  for e, g in zip(expected, got):
    assert set(g) == set(e)
    # Random features read the word well above chance: a wrong gather would not.
    assert e[f"{task}/accuracy"] >= 0.7
    for key in e:
      if key.endswith("accuracy"):
        # Features agree to float rounding; at most one example may fall the other way.
        n = e[key.split("/")[0] + "/num_eval"]
        assert abs(g[key] - e[key]) <= 1.0 / n + 1e-9, (key, g[key], e[key])
      else:
        assert g[key] == pytest.approx(e[key], abs=1e-6), key


def test_only_process_0_prints_the_probe(runs):
  stdout = runs["stdout"]
  assert "8 cpu devices in 2 processes" in stdout["replicated0"]
  for run in ("replicated", "fsdp"):
    assert "probe @ 2: word_order accuracy " in stdout[f"{run}0"]
    assert multiprocess.own_lines(stdout[f"{run}1"]) == []
