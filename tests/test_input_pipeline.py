"""Per-host batches: disjoint hosts, exact resume, per-epoch shuffles, padded eval."""

import os
import subprocess
import sys

import numpy as np
import pytest

from bert_jax.errors import ConfigError
from bert_jax.data.input_pipeline import TrainIterator, eval_batches

L = 4


def make_source(n):
  """Example i has input_ids all i, so a batch's ids tell which examples it holds."""
  return [{"input_ids": np.full(L, i, np.int32), "segment_ids": np.zeros(L, np.int32),
           "input_mask": np.ones(L, np.int32), "next_sentence_label": i % 2}
          for i in range(n)]


def ids(batch):
  return batch.input_ids_BxL[:, 0].tolist()


def take(iterator, k):
  return [next(iterator) for _ in range(k)]


def test_batch_has_stacked_int32_arrays_of_local_size():
  batch = next(TrainIterator(make_source(10), 8, seed=0, process_index=1, process_count=2))
  assert batch.input_ids_BxL.shape == (4, L) and batch.input_ids_BxL.dtype == np.int32
  assert batch.next_sentence_label_B.shape == (4,)
  assert batch.next_sentence_label_B.dtype == np.int32


def test_hosts_read_disjoint_slices_whose_union_is_the_global_batch():
  source = make_source(50)
  whole = take(TrainIterator(source, 12, seed=3, prefetch=0), 6)
  hosts = [take(TrainIterator(source, 12, seed=3, process_index=p, process_count=3), 6)
           for p in range(3)]
  for b in range(6):
    parts = [ids(hosts[p][b]) for p in range(3)]
    assert sum(parts, []) == ids(whole[b])  # contiguous slices, in host order
    assert len(set(sum(parts, []))) == 12


@pytest.mark.parametrize("hosts", [2, 4])
def test_hosts_split_each_global_batch_exactly_after_a_resume(hosts):
  # 30 examples, batches of 8 from batch 3 on: stream items 24..63, which wrap
  # twice into a new epoch. The hosts' slices, in host order, are the global batch.
  source, start = make_source(30), 3
  whole = take(TrainIterator(source, 8, seed=7, start_batch=start, prefetch=0), 5)
  per_host = [take(TrainIterator(source, 8, seed=7, process_index=p, process_count=hosts,
                                 start_batch=start), 5) for p in range(hosts)]
  for b in range(5):
    parts = [ids(per_host[p][b]) for p in range(hosts)]
    assert [len(part) for part in parts] == [8 // hosts] * hosts
    assert sum(parts, []) == ids(whole[b])


def test_resume_from_position_gives_the_identical_next_batches():
  source = make_source(37)
  first = TrainIterator(source, 8, seed=1)
  take(first, 7)
  position = first.position
  assert position == 7
  expected = take(first, 5)
  resumed = TrainIterator(source, 8, seed=1, start_batch=position)
  assert [ids(b) for b in take(resumed, 5)] == [ids(b) for b in expected]


def test_each_epoch_is_a_new_permutation_of_all_examples():
  it = TrainIterator(make_source(40), 10, seed=0)
  epochs = [sum((ids(b) for b in take(it, 4)), []) for _ in range(3)]
  for epoch in epochs:
    assert sorted(epoch) == list(range(40))
  assert epochs[0] != epochs[1] != epochs[2]
  assert epochs[0] != list(range(40))


def test_batches_wrap_across_epochs_without_dropping_examples():
  # 25 examples, batches of 10: batch 2 holds the last 5 of epoch 0 and 5 of epoch 1.
  it = TrainIterator(make_source(25), 10, seed=0)
  stream = sum((ids(b) for b in take(it, 5)), [])
  assert sorted(stream[:25]) == list(range(25))
  assert sorted(stream[25:]) == list(range(25))


def test_source_smaller_than_a_batch_still_works():
  batch = next(TrainIterator(make_source(3), 8, seed=0))
  assert len(ids(batch)) == 8 and set(ids(batch)) == {0, 1, 2}


def test_same_seed_same_order_other_seed_differs():
  source = make_source(30)
  a, b, c = (ids(next(TrainIterator(source, 10, seed=s))) for s in (5, 5, 6))
  assert a == b and a != c


def test_prefetch_does_not_change_the_batches():
  source = make_source(30)
  sync = take(TrainIterator(source, 6, seed=2, prefetch=0), 9)
  with TrainIterator(source, 6, seed=2, prefetch=3) as background:
    assert [ids(b) for b in take(background, 9)] == [ids(b) for b in sync]


def test_position_counts_consumed_batches_not_prefetched_ones():
  it = TrainIterator(make_source(30), 6, seed=2, prefetch=4)
  take(it, 2)
  assert it.position == 2
  it.close()
  assert ids(next(it)) == ids(next(TrainIterator(make_source(30), 6, seed=2, start_batch=2)))


def test_dropping_an_iterator_stops_its_prefetch_thread():
  it = TrainIterator(make_source(30), 6, seed=2, prefetch=1)
  next(it)
  thread = it._thread
  del it
  thread.join(timeout=5)
  assert not thread.is_alive()


def test_errors_in_the_prefetch_thread_reach_the_caller():
  class Broken:
    def __len__(self):
      return 10

    def __getitem__(self, i):
      raise OSError("disk on fire")

  with pytest.raises(OSError, match="disk on fire"):
    next(TrainIterator(Broken(), 4, seed=0, prefetch=2))


def test_batch_size_not_divisible_by_hosts_is_a_config_error():
  with pytest.raises(ConfigError, match="divisible"):
    TrainIterator(make_source(10), 10, seed=0, process_index=0, process_count=3)


def test_eval_pads_the_last_batch_and_marks_it_in_example_mask():
  batches = list(eval_batches(make_source(10), 4))
  assert [ids(b) for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 0]]
  assert batches[-1].example_mask_B.tolist() == [1.0, 1.0, 0.0, 0.0]
  assert batches[-1].example_mask_B.dtype == np.float32
  assert (batches[-1].input_mask_BxL[2:] == 0).all()  # padding is all-zero examples


def test_eval_hosts_get_equal_batch_counts_and_together_cover_all_once():
  source = make_source(11)
  per_host = [list(eval_batches(source, 8, process_index=p, process_count=2))
              for p in range(2)]
  assert len(per_host[0]) == len(per_host[1]) == 2
  real = [i for host in per_host for b in host
          for i, m in zip(ids(b), b.example_mask_B) if m]
  assert sorted(real) == list(range(11))


def test_eval_batch_size_not_divisible_by_hosts_raises_before_iterating():
  with pytest.raises(ConfigError, match="divisible"):
    eval_batches(make_source(10), 10, process_index=0, process_count=4)


def test_data_modules_do_not_import_jax():
  code = ("import sys, tensorflow_datasets; import bert_jax.data.tokenizer, bert_jax.data.corpus, "
          "bert_jax.data.pretraining_data, bert_jax.data.dataset, bert_jax.data.input_pipeline; "
          "sys.exit('jax imported' if 'jax' in sys.modules else 0)")
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  subprocess.run([sys.executable, "-c", code], check=True, cwd=repo)
