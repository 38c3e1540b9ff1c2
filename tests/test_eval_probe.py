"""Linear probes: logistic regression equals scikit-learn's; ridge; the probe and its CLI."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression, Ridge as SkRidge

from bert_jax.io import checkpointing
from bert_jax.commands import probe as probe_cli
from bert_jax.eval import logreg, probe, tasks, word_order
from bert_jax.features.extract import Extractor
from bert_jax.model.build import init_params
from bert_jax.data.tokenizer import SPECIAL_TOKENS, Tokenizer
import tiny_run


def _problem(seed, n=600, d=20, k=4, noise=2.0, sample=0):
  """Gaussian classes with overlapping means: accuracy well between chance and 1.

  `seed` draws the class means, `sample` the examples (train and test share means).
  """
  means = np.random.RandomState(seed).normal(0, 1, (k, d))
  rs = np.random.RandomState(1000 + 7 * seed + sample)
  y = rs.randint(0, k, n)
  X = means[y] + noise * rs.normal(0, 1, (n, d))
  X[:, 0] = 3.0  # a constant feature: standardisation must not divide by zero
  X[:, 1] *= 50  # badly scaled
  return X, y


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_logreg_accuracy_equals_sklearn_on_the_same_standardized_features(seed):
  X, y = _problem(seed)
  Xt, yt = _problem(seed, sample=1)
  std = logreg.Standardizer.fit(X)
  Cs = [0.001, 0.1, 10.0]
  models = logreg.fit_logreg(std(X), y, Cs, num_classes=4)
  for m in models:
    sk = LogisticRegression(C=m.C, max_iter=10000, tol=1e-8).fit(std(X), y)
    assert m.converged and m.grad_max < logreg.TOL
    for A, b in ((X, y), (Xt, yt)):
      ours = np.mean(m.predict(std(A)) == b)
      theirs = sk.score(std(A), b)
      assert abs(ours - theirs) <= 0.005, (m.C, ours, theirs)
    # The same objective, hence the same coefficients (sklearn's C scaling).
    np.testing.assert_allclose(m.W_DxK, sk.coef_.T, atol=2e-3 * max(1, np.abs(sk.coef_).max()))
  # A weak penalty fits the training set better than a strong one.
  assert np.mean(models[-1].predict(std(X)) == y) > np.mean(models[0].predict(std(X)) == y)


@pytest.mark.slow
def test_fit_probe_picks_C_on_held_out_train_and_predicts_each_eval_split():
  X, y = _problem(3, n=400, d=60, noise=3.0)
  Xa, ya = _problem(3, n=200, d=60, noise=3.0, sample=1)
  fit = logreg.fit_probe(X, y, {"a": Xa, "b": Xa[:7]}, num_classes=4, seed=0)
  assert set(fit.holdout_scores) == set(logreg.DEFAULT_CS)
  assert fit.holdout_scores[fit.penalty] == max(fit.holdout_scores.values())
  assert fit.predictions["a"].shape == (200,) and fit.predictions["b"].shape == (7,)
  np.testing.assert_array_equal(fit.predictions["b"], fit.predictions["a"][:7])
  # Refit on all of train with the chosen C; features standardized with train statistics.
  std = logreg.Standardizer.fit(X)
  sk = LogisticRegression(C=fit.penalty, max_iter=10000, tol=1e-8).fit(std(X), y)
  assert abs(np.mean(fit.predictions["a"] == ya) - sk.score(std(Xa), ya)) <= 0.005
  assert np.mean(fit.predictions["a"] == ya) > 0.5  # chance is 0.25
  # Seeded: the same split and choice again.
  again = logreg.fit_probe(X, y, Xa, num_classes=4, seed=0)
  np.testing.assert_array_equal(again.predictions, fit.predictions["a"])


@pytest.mark.slow
def test_lbfgs_for_large_problems_equals_sklearn_too(monkeypatch):
  """Above NEWTON_MAX_PARAMS parameters the fit uses L-BFGS: the same objective, same answers."""
  monkeypatch.setattr(logreg, "NEWTON_MAX_PARAMS", 0)
  X, y = _problem(0)
  std = logreg.Standardizer.fit(X)
  for m in logreg.fit_logreg(std(X), y, [0.01, 10.0], num_classes=4):
    sk = LogisticRegression(C=m.C, max_iter=10000, tol=1e-8).fit(std(X), y)
    assert m.converged and m.grad_max < logreg.TOL
    assert abs(np.mean(m.predict(std(X)) == y) - sk.score(std(X), y)) <= 0.005
    np.testing.assert_allclose(m.W_DxK, sk.coef_.T, atol=2e-3 * max(1, np.abs(sk.coef_).max()))


@pytest.mark.slow
def test_newton_converges_on_badly_scaled_features_and_weak_penalties():
  """fit_logreg takes features as given: scales over four decades make the Hessian too
  ill-conditioned for float32 at weak penalties; its damping must keep the steps useful
  (damping by the Hessian's mean diagonal, or none, stalls here)."""
  rs = np.random.RandomState(1)
  X = (rs.normal(size=(300, 40)) * np.logspace(-2, 2, 40)).astype(np.float32)
  y = rs.randint(0, 3, 300)
  models = logreg.fit_logreg(X, y, [1.0, 1e3, 1e6], num_classes=3, max_iter=100)
  for m in models:
    assert m.converged and m.grad_max < logreg.TOL, (m.C, m.iterations, m.grad_max)
  # Weaker penalties fit the training set better.
  train_acc = [np.mean(m.predict(X) == y) for m in models]
  assert train_acc[0] < train_acc[1] <= train_acc[2], train_acc


@pytest.mark.slow
def test_held_out_rows_are_weight_0_padding_and_both_fits_share_one_program():
  X, y = _problem(2, n=200)
  std = logreg.Standardizer.fit(X)
  keep = np.arange(200) % 5 != 0
  padded = logreg._fit_path(std(X), y, keep.astype(float), [0.1, 100.0], 4, logreg.MAX_ITER,
                            logreg.TOL)
  alone = logreg.fit_logreg(std(X)[keep], y[keep], [0.1, 100.0], num_classes=4)
  for a, b in zip(padded, alone):
    np.testing.assert_allclose(a.W_DxK, b.W_DxK, atol=1e-3 * max(1, np.abs(b.W_DxK).max()))
  # fit_probe on a new shape: its holdout grid and its refit compile one program between them.
  Xp, yp = _problem(2, n=173)
  before = logreg._fit_one._cache_size()
  logreg.fit_probe(Xp, yp, Xp[:3], num_classes=4)
  assert logreg._fit_one._cache_size() == before + 1


def test_ridge_equals_sklearn_and_probe_picks_alpha():
  rs = np.random.RandomState(0)
  X = rs.normal(size=(300, 10))
  y = X @ rs.normal(size=10) + 0.5 * rs.normal(size=300) + 2.0
  for alpha in (0.01, 1.0):
    ours = logreg.fit_ridge(X, y, alpha)
    sk = SkRidge(alpha=alpha * len(y)).fit(X, y)  # sklearn's alpha multiplies the summed loss
    np.testing.assert_allclose(ours.w_D, sk.coef_, atol=1e-8)
    assert ours.b == pytest.approx(sk.intercept_)
  fit = logreg.fit_ridge_probe(X, y, X[:5])
  assert fit.penalty in logreg.DEFAULT_ALPHAS
  assert np.corrcoef(fit.predictions, y[:5])[0, 1] > 0.9


# --- the probe on model features, and its command line ---

# Whole words of the held-out text, so no word is [UNK] and order is all that differs.
WORDS = sorted({w for s in word_order.read_sentences() for w in s.split()} | {"cat", "dog"})
VOCAB = list(SPECIAL_TOKENS) + WORDS
CONFIG = tiny_run.bert_config(len(VOCAB))


@pytest.fixture(scope="module")
def random_params():
  """The model's own initialisation (truncated normal 0.02, as BERT): random weights."""
  return jax.device_get(init_params(CONFIG, jax.random.key(0)))


@pytest.fixture(scope="module")
def extractor(random_params):
  return Extractor(random_params["bert"], CONFIG, Tokenizer(VOCAB, True), batch_size=64)


@pytest.fixture(scope="module")
def ckpt(random_params, tmp_path_factory):
  """A training-style checkpoint (as tests/test_features.py writes one)."""
  workdir = str(tmp_path_factory.mktemp("probe") / "run")
  mngr = checkpointing.manager(os.path.join(workdir, "checkpoints"), async_save=False)
  checkpointing.save(mngr, 3, random_params, {"opt_state": {"count": jnp.int32(3)},
                                              "rng": jax.random.key_data(jax.random.key(0))},
                     {"model_config": CONFIG.to_dict(), "vocab": VOCAB, "lowercase": True,
                      "seed": 0, "config": {}, "step": 3, "phase": 0, "data_position": 0})
  mngr.wait_until_finished()
  mngr.close()
  return workdir


@pytest.mark.slow
def test_word_order_is_near_chance_for_random_weights(extractor):
  """Mean-pooled random features carry the words but not their order: the task needs order."""
  r = probe.probe(extractor, tasks.load_task("word_order"), layers=(-1,), pooling="mean")
  assert 0.3 < r["word_order/accuracy"] < 0.6, r
  assert r["C"] in logreg.DEFAULT_CS and r["num_train"] == 287 and r["seconds"] > 0


def _plain(root, name, rows_train, rows_dev):
  d = os.path.join(root, name)
  os.makedirs(d)
  for split, rows in (("train", rows_train), ("dev", rows_dev)):
    with open(os.path.join(d, f"{split}.tsv"), "w") as f:
      f.write("label\ttext\n" + "".join(f"{l}\t{t}\n" for l, t in rows))
  return d


@pytest.mark.slow
def test_a_bag_of_words_task_is_solved_by_the_same_random_features(extractor, tmp_path):
  """The contrast to word_order: which word occurs is linearly readable from random features."""
  rs = np.random.RandomState(0)
  sentences = word_order.read_sentences()

  def rows(n, regression):
    out = []
    for _ in range(n):
      s = sentences[rs.randint(len(sentences))].split()
      k = rs.randint(0, 3)
      for _ in range(k):  # "cat" 0-2 times at random places
        s.insert(rs.randint(len(s) + 1), "cat")
      out.append((f"{k + 0.5}" if regression else int(k > 0), " ".join(s)))
    return out

  cls = tasks.load_task(_plain(str(tmp_path), "has_cat", rows(300, False), rows(100, False)))
  r = probe.probe(extractor, cls)
  assert r["has_cat/accuracy"] > 0.85, r
  reg = tasks.load_task(_plain(str(tmp_path), "cats", rows(300, True), rows(100, True)))
  assert reg.kind == "regression"
  r = probe.probe(extractor, reg)
  assert r["cats/pearson"] > 0.8 and "alpha" in r, r


@pytest.mark.slow
def test_cli_prints_the_metric_and_writes_json(ckpt, tmp_path, capsys):
  out = str(tmp_path / "r.json")
  assert probe_cli.main(["--checkpoint", ckpt, "--task", "word_order", "--output", out,
                         "--layers", "-2,-1", "--max_examples", "100"]) == 0
  stdout = capsys.readouterr().out.strip().splitlines()
  with open(out) as f:
    result = json.load(f)
  acc, n = result["word_order/accuracy"], result["word_order/num_eval"]
  base = result["word_order/majority_accuracy"]
  below = ", below it" if acc < base else ""
  # The answer to "is it any good?" in one line: ±, and the best constant guess.
  assert stdout == [f"word_order/accuracy: {acc:.4f} ± {(acc * (1 - acc) / n) ** 0.5:.4f} "
                    f"(majority class {base:.4f}{below}; {int(n)} examples)"]
  assert n == 100 and abs(base - 0.5) <= 0.02  # balanced dev: majority ~0.5
  assert result["step"] == 3  # which checkpoint of a live workdir was read
  assert result["task"] == "word_order" and result["layers"] == [-2, -1]
  assert result["num_train"] == 100 and result["pooling"] == "mean"
  assert 0.0 <= result["word_order/accuracy"] <= 1.0
  assert sorted(os.listdir(tmp_path)) == ["r.json"]  # no temporary file left


BAD_CLI = {
    "missing checkpoint": (["--checkpoint", "{tmp}/none"], ["none"]),
    "bad task dir": (["--task", "{tmp}/task"], ["task", "train.tsv"]),
    "unknown task": (["--task", "glue_cola"], ["glue_cola", "no such directory"]),
    "per-token pooling": (["--pooling", "none"], ["--pooling", "cls, mean, pooler"]),
    "missing output dir": (["--output", "{tmp}/nodir/r.json"], ["nodir", "does not exist"]),
    "bad layers": (["--layers", "last"], ["--layers"]),
    "missing argument": (["--task"], ["--task"]),
}


@pytest.mark.parametrize("case", list(BAD_CLI))
def test_cli_bad_input_is_one_error_line_exit_2_nothing_written(case, ckpt, tmp_path, capsys):
  changes, words = BAD_CLI[case]
  os.makedirs(tmp_path / "task")
  with open(tmp_path / "task" / "dev.tsv", "w") as f:
    f.write("label\ttext\n0\ta\n")
  args = {"--checkpoint": ckpt, "--task": "word_order", "--output": str(tmp_path / "r.json")}
  argv = [x for kv in args.items() for x in kv] + [c.format(tmp=tmp_path) for c in changes]
  before = sorted(os.listdir(tmp_path))
  assert probe_cli.main(argv) == 2
  err = [l for l in capsys.readouterr().err.strip().splitlines() if not l.startswith("task ")]
  assert len(err) == 1 and err[0].startswith("error: "), err
  for w in words:
    assert w in err[0], err[0]
  assert sorted(os.listdir(tmp_path)) == before


def test_measure_probe_table_gives_accuracy_with_its_standard_error():
  from tools import measure_probe
  result = {"task": "word_order", "layers": [-1], "pooling": "mean", "num_dev": {"dev": 100},
            "majority": {"dev": 0.5}, "metric_names": ["accuracy"],
            "rows": [{"model": "runs/tiny", "word_order/accuracy": 0.7, "C": 1.0},
                     {"model": "random", "word_order/accuracy": 0.5, "C": 0.1}]}
  table = measure_probe.markdown(result).splitlines()
  assert table[2] == "| runs/tiny | 0.700 ± 0.046 |"  # sqrt(0.7 * 0.3 / 100)
  assert table[3] == "| random | 0.500 ± 0.050 |" and table[4] == "| majority class | 0.500 |"
