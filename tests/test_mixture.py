"""Mixtures (data/mixture.py, config.data.sources): rows drawn by weight when batches are
made, a pure function of (seed, row number).

The law: source i gets the share p_i ∝ weight_i * tokens_i ** temperature of the real
tokens drawn. Rows come in blocks of K with exactly c_i rows of source i each, so the
only randomness in a source's token count is which of its examples are drawn; the
tests hold the drawn token shares to 4 binomial standard deviations over the rows
drawn, sqrt(p(1 - p) / rows), a bound looser than that randomness (the examples'
lengths vary far less than a coin).
"""

import numpy as np
import pytest

from bert_jax.data import mixture
from bert_jax.data.input_pipeline import TrainIterator
from bert_jax.errors import ConfigError
from bert_jax.settings.data import DataSettings, parse_source

L = 16


def source(n: int, lengths: tuple[int, int], tag: int, seed: int) -> list[dict]:
  """n examples whose input_ids are all `tag` over a random length in [lo, hi]."""
  rng = np.random.default_rng(seed)
  out = []
  for k in range(n):
    m = int(rng.integers(lengths[0], lengths[1] + 1))
    ids = np.zeros(L, np.int32)
    ids[:m] = tag
    mask = (np.arange(L) < m).astype(np.int32)
    out.append({"input_ids": ids, "segment_ids": np.zeros(L, np.int32), "input_mask": mask,
                "next_sentence_label": k % 2})
  return out


SOURCES = [source(300, (12, 16), 1, 0), source(2000, (4, 10), 2, 1), source(60, (14, 16), 3, 2)]
NAMES = ["web", "code", "books"]


def mixed(weights, temperature, sources=SOURCES) -> mixture.MixedSource:
  tokens = [sum(int(e["input_mask"].sum()) for e in s) for s in sources]
  shares = mixture.token_shares(weights, tokens, temperature)
  means = [t / len(s) for t, s in zip(tokens, sources)]
  counts = mixture.block_counts(mixture.row_shares(shares, means))
  return mixture.MixedSource(sources, NAMES[:len(sources)], shares, counts)


def drawn_tokens(src: mixture.MixedSource, steps: int, batch: int = 64, seed: int = 0,
                 **kw) -> tuple[np.ndarray, int]:
  it = TrainIterator(src, batch, seed=seed, prefetch=0, **kw)
  tokens = np.zeros(len(src.sources))
  for _ in range(steps):
    b = next(it)
    tag = b.input_ids_BxL[:, 0] - 1  # every row's ids are its source's tag
    tokens += np.bincount(tag, weights=b.input_mask_BxL.sum(1), minlength=len(tokens))
  return tokens, steps * batch


@pytest.mark.parametrize("temperature", [1.0, 0.5, 0.3])
def test_tokens_drawn_follow_the_shares_within_the_binomial_bound(temperature):
  src = mixed([1.0, 1.0, 1.0], temperature)
  sizes = np.asarray([sum(int(e["input_mask"].sum()) for e in s) for s in SOURCES], float)
  want = sizes ** temperature / (sizes ** temperature).sum()
  np.testing.assert_allclose(src.shares, want)  # p_i ∝ n_i ** temperature
  tokens, rows = drawn_tokens(src, steps=400)
  share = tokens / tokens.sum()
  bound = 4 * np.sqrt(want * (1 - want) / rows)
  assert np.all(np.abs(share - want) <= bound), (share, want, bound)


def test_weights_alone_at_temperature_0_give_the_token_shares_asked():
  src = mixed([0.7, 0.2, 0.1], 0.0)
  np.testing.assert_allclose(src.shares, [0.7, 0.2, 0.1])
  tokens, rows = drawn_tokens(src, steps=400)
  share = tokens / tokens.sum()
  assert np.all(np.abs(share - src.shares) <= 4 * np.sqrt(src.shares * (1 - src.shares) / rows))


def test_every_block_holds_exactly_its_counts_of_each_source():
  src = mixed([0.7, 0.2, 0.1], 0.0)
  m = mixture.Mixture(src.counts, seed=3)
  for block in (0, 1, 57):
    which, draws = m.assign(block * m.block + np.arange(m.block))
    np.testing.assert_array_equal(np.bincount(which, minlength=3), src.counts)
    for i in range(3):  # the block's draws of a source are the next c_i, each once
      mine = np.sort(draws[which == i])
      np.testing.assert_array_equal(mine, block * src.counts[i] + np.arange(src.counts[i]))


def test_a_tiny_weight_still_gets_rows_and_the_block_grows_for_it():
  counts = mixture.block_counts(np.asarray([0.9999, 0.0001]))
  assert counts[1] >= 1 and counts.sum() > mixture.MIN_BLOCK
  assert abs(counts[1] / counts.sum() - 0.0001) < 0.0001 / 10


def test_the_same_seed_draws_the_same_batches_and_another_seed_others():
  src = mixed([1.0, 1.0, 1.0], 0.5)
  a = [TrainIterator(src, 32, seed=5, prefetch=0).batch_indices(b) for b in range(20)]
  b = [TrainIterator(src, 32, seed=5, prefetch=2).batch_indices(b) for b in range(20)]
  c = [TrainIterator(src, 32, seed=6, prefetch=0).batch_indices(b) for b in range(20)]
  assert all(np.array_equal(x, y) for x, y in zip(a, b))
  assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_a_resumed_iterator_draws_what_the_uninterrupted_one_did():
  src = mixed([0.5, 0.3, 0.2], 0.0)
  straight = TrainIterator(src, 48, seed=1, prefetch=2)
  expected = [next(straight) for _ in range(30)]
  straight.close()
  resumed = TrainIterator(src, 48, seed=1, prefetch=2, start_batch=17)
  for want in expected[17:]:
    got = next(resumed)
    for x, y in zip(want, got):
      np.testing.assert_array_equal(x, y)
  resumed.close()


def test_two_hosts_draw_the_global_batch_of_one():
  src = mixed([0.5, 0.3, 0.2], 0.3)
  one = TrainIterator(src, 64, seed=2, prefetch=0)
  hosts = [TrainIterator(src, 64, seed=2, process_index=i, process_count=2, prefetch=0)
           for i in range(2)]
  for b in range(10):
    np.testing.assert_array_equal(one.batch_indices(b), np.concatenate(
        [h.batch_indices(b) for h in hosts]))


def test_over_a_whole_block_each_example_of_a_source_is_drawn_equally_often():
  # Draws are a source's own epochs of permutations: within any prefix of its draws
  # no example is drawn twice more than another; a whole block holds a prefix.
  src = mixed([1.0, 1.0, 1.0], 0.0)
  k = int(src.counts.sum())
  it = TrainIterator(src, k, seed=0, prefetch=0)
  rows = it.batch_indices(0)  # the first block, exactly: a prefix of every source's draws
  for i, n in enumerate(len(s) for s in SOURCES):
    mine = rows[src.source_of(rows) == i] - src.offsets[i]
    times = np.bincount(mine, minlength=n)
    assert times.sum() == src.counts[i] and times.max() - times.min() <= 1


def test_eval_reads_every_source_in_order():
  src = mixture.MixedSource(SOURCES, NAMES, np.ones(3) / 3)
  batch = src.read_batch([0, 300, 2300, 1])
  np.testing.assert_array_equal(batch.input_ids_BxL[:, 0], [1, 2, 3, 1])


# --- the settings ---


def test_a_source_entry_is_parsed_with_its_options():
  s = parse_source("code=gs://b/stack/*.jsonl.zst,weight=0.25,field=content")
  assert (s.name, s.corpus, s.weight, s.field, s.format) == (
      "code", "gs://b/stack/*.jsonl.zst", 0.25, "content", "auto")


@pytest.mark.parametrize("sources,says", [
    (("web",), "expected 'NAME=SPEC"),
    (("web=a.parquet,weight=-1",), "weight='-1'; expected a positive number"),
    (("web=a.parquet,weight=x",), "weight='x'"),
    (("web=a.parquet,colour=red",), "option 'colour=red'"),
    (("web=a.parquet,format=csv",), "format='csv'"),
    (("web=a.parquet", "web=b.parquet"), "each source's NAME once"),
])
def test_a_bad_source_entry_is_one_line(sources, says):
  with pytest.raises(ConfigError, match=says) as e:
    DataSettings(sources=sources)
  assert "\n" not in str(e.value) and "--config.data.sources" in str(e.value)


def test_a_corpus_beside_sources_is_refused():
  with pytest.raises(ConfigError, match="expected one of them"):
    DataSettings(corpus="a.txt", sources=("web=b.txt",))


@pytest.mark.parametrize("temperature", [-0.1, 1.5, True])
def test_a_temperature_outside_0_to_1_is_refused(temperature):
  with pytest.raises(ConfigError, match="data.temperature"):
    DataSettings(sources=("web=b.txt",), temperature=temperature)


# --- a run ---
# A ModernBERT mixture with weights per stage, killed inside every stage and at every
# boundary, its drawn shares, and the refusal of changed sources on extension:
# tests/test_stages.py.


def test_a_phase_s_weights_may_change_on_resume_before_it_starts_but_not_inside_it(tmp_path):
  from bert_jax import settings as settings_lib
  from bert_jax.train.resume import check_same_phase_mixture
  import soak_kill

  def settings(weights):
    c = soak_kill.tiny_config(str(tmp_path), 12, 2, **{
        "data.corpus": "builtin", "data.sources": ("a=x.txt", "b=y.txt"),
        "data.phase_weights": weights})
    return settings_lib.from_config(c), c.data.to_dict(), c.train.to_dict()

  saved_settings, saved_data, saved_train = settings(((0.7, 0.3), (0.5, 0.5)))
  later, _, _ = settings(((0.7, 0.3), (0.2, 0.8)))
  check_same_phase_mixture(saved_data, saved_train, 3, later, "w")  # phase 1 not started
  now, _, _ = settings(((0.6, 0.4), (0.5, 0.5)))
  with pytest.raises(ConfigError, match="inside its phase 0") as e:
    check_same_phase_mixture(saved_data, saved_train, 3, now, "w")
  assert "(0.7, 0.3)" in str(e.value) and "(0.6, 0.4)" in str(e.value)


def test_phase_weights_need_one_tuple_per_phase_of_one_weight_per_source():
  with pytest.raises(ConfigError, match="data.phase_weights"):
    DataSettings(sources=("a=x", "b=y"), phase_weights=((0.5,),))
  with pytest.raises(ConfigError, match="data.phase_temperatures"):
    DataSettings(sources=("a=x", "b=y"), phase_temperatures=(2.0,))
  with pytest.raises(ConfigError, match="without --config.data.sources"):
    DataSettings(phase_weights=((0.5, 0.5),))


def test_a_phase_may_leave_a_source_out_but_not_all_of_them():
  """mmBERT adds languages in later stages: a weight of 0 draws none of that source in
  that phase; a phase of zeros only (or a negative weight) is one line."""
  DataSettings(sources=("a=x", "b=y", "c=z"), phase_weights=((0.7, 0.3, 0), (0.4, 0.3, 0.3)))
  for bad in (((0, 0, 0), (1, 1, 1)), ((0.5, -0.1, 0.6), (1, 1, 1))):
    with pytest.raises(ConfigError, match="data.phase_weights") as e:
      DataSettings(sources=("a=x", "b=y", "c=z"), phase_weights=bad)
    assert "\n" not in str(e.value)
  counts = mixture.block_counts(mixture.row_shares(
      mixture.token_shares((0.7, 0.3, 0.0), (100.0, 50.0, 80.0), 0.5), (10.0, 10.0, 10.0)))
  assert counts[2] == 0 and counts[0] > counts[1] > 0
  rows = np.arange(3 * int(counts.sum()))
  source, _ = mixture.Mixture(counts, seed=3).assign(rows)
  assert set(source.tolist()) == {0, 1}
