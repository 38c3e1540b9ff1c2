"""`python -m bert_jax.merge` (bert_jax/io/merge.py): the weighted mean of checkpoints'
parameters, written as a checkpoint the readers (and `convert to-hf`) take."""

import os

import jax
import numpy as np
import pytest

from bert_jax.commands import merge as merge_cli
from bert_jax.data.tokenizer import SPECIAL_TOKENS
from bert_jax.io import checkpointing
from bert_jax.model.build import init_params
import tiny_run

VOCAB = list(SPECIAL_TOKENS) + [f"w{i}" for i in range(40)]
BERT = tiny_run.bert_config(len(VOCAB), num_layers=1)
MODERN = tiny_run.bert_config(len(VOCAB), family="modernbert", num_layers=2, num_heads=2,
                              global_attn_every_n_layers=2, local_attention=4,
                              layer_norm_eps=1e-5, dropout_rate=0.0, attention_dropout_rate=0.0)


def save(path, config, seed: int, step: int = 0) -> dict:
  params = init_params(config, jax.random.key(seed))
  checkpointing.save_params(str(path), step, params, {"model_config": config.to_dict(),
                                                      "vocab": VOCAB, "lowercase": True,
                                                      "step": step})
  return jax.tree.map(np.asarray, params)


def restored(path):
  params, meta = checkpointing.restore_params(str(path))
  return jax.tree.map(np.asarray, params), meta


def test_the_merge_of_three_is_numpys_mean_of_their_arrays(tmp_path):
  trees = [save(tmp_path / f"c{i}", BERT, seed=i) for i in range(3)]
  assert merge_cli.main([str(tmp_path / "out"), *(str(tmp_path / f"c{i}") for i in range(3))]) == 0
  got, meta = restored(tmp_path / "out")
  want = jax.tree.map(lambda *x: np.mean(np.stack(x).astype(np.float64), 0).astype(x[0].dtype),
                      *trees)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(a, b)
  assert [m["weight"] for m in meta["merged_from"]] == pytest.approx([1 / 3] * 3)


def test_weights_give_numpys_weighted_average(tmp_path):
  trees = [save(tmp_path / f"c{i}", BERT, seed=i) for i in range(3)]
  assert merge_cli.main([str(tmp_path / "out"), *(str(tmp_path / f"c{i}") for i in range(3)),
                         "--weights", "1,1,2"]) == 0
  got, _ = restored(tmp_path / "out")
  want = jax.tree.map(lambda *x: np.average(np.stack(x).astype(np.float64), 0,
                                            weights=[1, 1, 2]).astype(x[0].dtype), *trees)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-7)


def test_last_k_of_a_workdir_are_its_newest_checkpoints(tmp_path):
  trees = {step: save(tmp_path / "run", BERT, seed=step, step=step) for step in range(1, 6)}
  assert merge_cli.main([str(tmp_path / "out"), str(tmp_path / "run"), "--last", "3"]) == 0
  got, meta = restored(tmp_path / "out")
  assert [m["step"] for m in meta["merged_from"]] == [3, 4, 5] and meta["step"] == 5
  want = jax.tree.map(lambda *x: np.mean(np.stack(x).astype(np.float64), 0).astype(x[0].dtype),
                      *(trees[s] for s in (3, 4, 5)))
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(a, b)


def test_a_step_is_chosen_with_at(tmp_path):
  trees = {step: save(tmp_path / "run", BERT, seed=step, step=step) for step in (1, 2)}
  save(tmp_path / "other", BERT, seed=9)
  assert merge_cli.main([str(tmp_path / "out"), f"{tmp_path / 'run'}@1",
                         str(tmp_path / "other")]) == 0
  _, meta = restored(tmp_path / "out")
  assert meta["merged_from"][0]["step"] == 1
  got, _ = restored(tmp_path / "out")
  other = restored(tmp_path / "other")[0]
  want = jax.tree.map(lambda a, b: ((a.astype(np.float64) + b) / 2).astype(a.dtype),
                      trees[1], other)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(a, b)


def _error(capsys) -> list[str]:
  return [l for l in capsys.readouterr().err.splitlines() if l.startswith("error:")]


def test_checkpoints_of_two_models_are_refused_in_one_line(tmp_path, capsys):
  save(tmp_path / "a", BERT, seed=0)
  save(tmp_path / "b", tiny_run.bert_config(len(VOCAB), num_layers=2), seed=1)
  assert merge_cli.main([str(tmp_path / "out"), str(tmp_path / "a"), str(tmp_path / "b")]) == 2
  errors = _error(capsys)
  assert len(errors) == 1 and "num_layers=2" in errors[0] and "one model" in errors[0]
  assert not os.path.exists(tmp_path / "out")


def test_an_output_inside_a_source_is_refused_before_anything_is_read(tmp_path, capsys):
  save(tmp_path / "a", BERT, seed=0)
  save(tmp_path / "b", BERT, seed=1)
  out = tmp_path / "a" / "merged"
  assert merge_cli.main([str(out), str(tmp_path / "a"), str(tmp_path / "b")]) == 2
  assert len(_error(capsys)) == 1 and not out.exists()


@pytest.mark.parametrize("argv,says", [
    (["--weights", "1,x"], "--weights"), (["--weights", "1"], "expected 2 numbers"),
    (["--weights", "1,-1"], "positive")])
def test_bad_weights_are_one_line(tmp_path, capsys, argv, says):
  save(tmp_path / "a", BERT, seed=0)
  save(tmp_path / "b", BERT, seed=1)
  assert merge_cli.main([str(tmp_path / "out"), str(tmp_path / "a"), str(tmp_path / "b"),
                         *argv]) == 2
  errors = _error(capsys)
  assert len(errors) == 1 and says in errors[0], errors


def test_a_merged_modernbert_exports_and_loads_in_transformers(tmp_path):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  from bert_jax.io.convert import export_hf
  trees = [save(tmp_path / f"c{i}", MODERN, seed=i) for i in range(2)]
  assert merge_cli.main([str(tmp_path / "out"), str(tmp_path / "c0"), str(tmp_path / "c1")]) == 0
  export_hf(str(tmp_path / "out"), str(tmp_path / "hf"))
  model, info = transformers.ModernBertForMaskedLM.from_pretrained(
      str(tmp_path / "hf"), output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"]
  emb = model.model.embeddings.tok_embeddings.weight.detach().numpy()
  mean = (trees[0]["bert"]["tok_embeddings"]["embedding"].astype(np.float64)
          + trees[1]["bert"]["tok_embeddings"]["embedding"]) / 2
  np.testing.assert_allclose(emb, mean[:len(emb)].astype(np.float32), rtol=0, atol=1e-7)
  with torch.no_grad():
    out = model(torch.tensor([[2, 5, 6, 3]])).logits
  assert out.shape == (1, 4, len(emb)) and torch.isfinite(out).all()
