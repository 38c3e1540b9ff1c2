"""Example streams (config.data.streams): part p is stream p % S, each global
batch one sub-batch per stream, so P processes dividing S read the same global
batches from a shared cache and from host-local caches holding only their
streams' parts, as one process does."""

import glob
import json
import os

import numpy as np
import pytest

from bert_jax.data import dataset, input_pipeline
from bert_jax.errors import CheckpointError, ConfigError, CorpusError
from bert_jax.settings import DataSettings

# A fake prepared dataset of 7 parts (part index, training records), 37 records.
PARTS = [(i, n) for i, n in enumerate([5, 7, 3, 9, 4, 6, 3])]
STARTS = np.concatenate([[0], np.cumsum([n for _, n in PARTS])])
N = int(STARTS[-1])


def _examples(ids: list[int]) -> list[dict]:
  return [{"input_ids": np.full(4, i, np.int32), "segment_ids": np.zeros(4, np.int32),
           "input_mask": np.ones(4, np.int32), "next_sentence_label": np.int32(0)}
          for i in ids]


def _old_indices(n: int, batch: int, global_batch: int, seed: int, index: int,
                 count: int) -> list[int]:
  """The sampler before streams: epochs of permutations of all n, drawn from (seed, e)."""
  local = global_batch // count
  flat = batch * global_batch + index * local + np.arange(local)
  return [int(np.random.default_rng([seed, f // n]).permutation(n)[f % n]) for f in flat]


def test_one_stream_is_the_sampler_before_streams():
  src = _examples(list(range(N)))
  for count in (1, 2, 4):
    for index in range(count):
      it = input_pipeline.TrainIterator(src, 8, seed=5, process_index=index,
                                        process_count=count, prefetch=0, parts=PARTS)
      for b in (0, 1, 4, 9, 30):  # 4 and 9 wrap from one epoch into the next
        assert it.batch_indices(b).tolist() == _old_indices(N, b, 8, 5, index, count)


def _global_batches(streams: int, count: int, batches: range, host_local: bool,
                    start: int = 0) -> list[list[int]]:
  """Global batches (the processes' local batches concatenated) as stored record ids,
  read through TrainIterator; with `host_local`, each process holds only its parts."""
  per_process = []
  for i in range(count):
    share = dataset.Share(i, count, streams)
    parts = [(p, n) for p, n in PARTS if share.holds(p)] if host_local else PARTS
    ids = [r for p, n in parts for r in range(STARTS[p], STARTS[p] + n)]
    it = input_pipeline.TrainIterator(_examples(ids), 8, seed=3, process_index=i,
                                      process_count=count, start_batch=start, prefetch=1,
                                      streams=streams, parts=parts)
    with it:
      per_process.append([next(it).input_ids_BxL[:, 0].tolist() for _ in batches])
  return [sum((p[b] for p in per_process), []) for b in range(len(batches))]


def test_streams_give_the_same_global_batches_for_1_2_4_processes_and_host_local_parts():
  ref = _global_batches(4, 1, range(12), host_local=False)
  stream_of = {r: p % 4 for p, n in PARTS for r in range(STARTS[p], STARTS[p] + n)}
  for batch in ref:  # sub-batch s holds stream s's examples only
    assert [stream_of[r] for r in batch] == [0, 0, 1, 1, 2, 2, 3, 3]
  # Epoch 0 of stream 3 (part 3, 9 records): its first 9 draws, each record once.
  assert sorted(sum((b[6:] for b in ref[:5]), [])[:9]) == list(range(STARTS[3], STARTS[4]))
  for count in (1, 2, 4):
    for host_local in (False, True):
      assert _global_batches(4, count, range(12), host_local) == ref, (count, host_local)
      resumed = _global_batches(4, count, range(5), host_local, start=7)
      assert resumed == ref[7:], (count, host_local)
  assert ref != _global_batches(1, 1, range(12), host_local=False)


def test_a_host_holds_the_parts_of_its_streams():
  s = DataSettings(streams=4)
  assert [p for p in range(10) if dataset.host_share(s, 1, 2).holds(p)] == [2, 3, 6, 7]
  assert [p for p in range(10) if dataset.host_share(s, 3, 4).holds(p)] == [3, 7]
  # Not a multiple of the process count: every count-th part (per-host sampling).
  assert dataset.host_share(DataSettings(streams=3), 1, 2) == dataset.Share(1, 2)
  assert [p for p in range(6) if dataset.host_share(s, 0, 1).holds(p)] == list(range(6))


def test_bad_streams_are_one_line():
  src = _examples(list(range(N)))
  with pytest.raises(ConfigError, match=r"data.streams=3: expected a divisor of "
                     r"--config.train.batch_size=8"):
    input_pipeline.TrainIterator(src, 8, seed=0, streams=3, parts=PARTS)
  with pytest.raises(ConfigError, match="records no parts"):
    input_pipeline.TrainIterator(src, 8, seed=0, streams=2)
  with pytest.raises(CorpusError, match=r"stream 7 .* has no training examples here; the "
                     r"data has 7 part"):
    input_pipeline.TrainIterator(src, 8, seed=0, streams=8, parts=PARTS)
  with pytest.raises(ConfigError, match=r"--config.data.streams=0: expected an integer >= 1"):
    DataSettings(streams=0)


def test_batch_size_must_be_a_multiple_of_streams():
  from bert_jax import default_config, settings  # pylint: disable=import-outside-toplevel
  c = default_config.get_config()
  c.train.batch_size, c.data.streams = 12, 8
  with pytest.raises(ConfigError, match=r"--config.data.streams=8: expected a divisor of "
                     r"--config.train.batch_size=12"):
    settings.from_config(c)


def test_a_run_resumes_only_with_its_streams():
  from bert_jax.train import resume  # pylint: disable=import-outside-toplevel
  resume.check_same_recipe({"data": {}}, {"data": {"streams": 1}}, "ckpt")  # older checkpoint
  with pytest.raises(CheckpointError, match=r"--config.data.streams=4: checkpoint ckpt was "
                     r"trained with 2"):
    resume.check_same_recipe({"data": {"streams": 2}}, {"data": {"streams": 4}}, "ckpt")


def _train_ids(directory: str) -> list[bytes]:
  src = dataset.open_split(directory, 32, "train")
  b = src.read_batch(list(range(len(src))))
  return [ids.tobytes() for ids in b.input_ids_BxL]


@pytest.mark.slow
def test_host_local_streams_train_as_one_process_on_a_shared_cache(tmp_path, monkeypatch):
  # 4 parts, 4 streams: process i of 2 prepares the parts 2i, 2i+1 only, and the two,
  # stopped at step 3 and resumed, train to the losses of one process (8 devices)
  # reading the merged data.
  from tests import test_distributed as dist  # pylint: disable=import-outside-toplevel
  monkeypatch.setenv("BERT_JAX_PREPARE_PART_BYTES", "1000")  # 4 parts of data/corpus.txt
  jit, steps, streams = str(tmp_path / "jit"), 6, "--config.data.streams=4"
  ref_args, devices = dist._one_process(str(tmp_path / "ref"), steps, 8,  # pylint: disable=protected-access
                                        str(tmp_path / "ref_data"))
  one = dist._run({"ref": (ref_args + [streams], devices)}, str(tmp_path / "l1"), jit)  # pylint: disable=protected-access
  for i, upto in enumerate((3, steps)):
    two = {k: (args + [streams], d) for k, (args, d) in dist._two_processes(  # pylint: disable=protected-access
        str(tmp_path / "two"), upto, (str(tmp_path / "data0"), str(tmp_path / "data1"))).items()}
    out = dist._run(two, str(tmp_path / f"l{i + 2}"), jit)  # pylint: disable=protected-access
    if i == 0:
      assert "4 parts" in one["ref"] and "2 parts" in out["process0"], out
  assert dist._resumed_at(out["process0"], 3), out["process0"]  # pylint: disable=protected-access
  (ref,), (own0,), (own1,) = (glob.glob(str(tmp_path / d / "*"))
                              for d in ("ref_data", "data0", "data1"))
  with open(os.path.join(ref, "seq32", "info.json"), encoding="utf-8") as f:
    parts = json.load(f)["train_parts"]
  assert parts["index"] == [0, 1, 2, 3]
  firsts = np.cumsum([0] + parts["records"])
  ids = _train_ids(ref)
  assert _train_ids(own0) == ids[:firsts[2]] and _train_ids(own1) == ids[firsts[2]:]
  losses = {n: dist._losses(str(tmp_path / n)) for n in ("ref", "two")}  # pylint: disable=protected-access
  assert sorted(losses["ref"]) == sorted(losses["two"]) == list(range(1, steps + 1))
  assert [losses["two"][s] for s in range(1, steps + 1)] == pytest.approx(
      [losses["ref"][s] for s in range(1, steps + 1)], abs=1e-5)


def test_a_corpus_of_fewer_parts_than_streams_is_one_line(monkeypatch, tmp_path):
  from bert_jax.train import data_setup  # pylint: disable=import-outside-toplevel
  src = _examples(list(range(N)))
  fake = type("Source", (list,), {})(src)
  fake.parts = PARTS
  prepared = dataset.Prepared(tokenizer=None, train={32: fake}, eval={}, directory="")
  monkeypatch.setattr(data_setup.dataset, "prepare", lambda *a, **k: prepared)
  assert data_setup.prepare_data(DataSettings(streams=7), [32], 0, str(tmp_path)) is prepared
  with pytest.raises(ConfigError, match=r"--config.data.streams=8: corpus 'builtin' has 7 "
                     r"part\(s\), fewer than the streams"):
    data_setup.prepare_data(DataSettings(streams=8), [32], 0, str(tmp_path))
