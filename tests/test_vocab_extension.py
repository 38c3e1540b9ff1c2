"""Vocabulary extension of a continued run (`--config.data.extend_vocab`)."""

import os

import numpy as np
import pytest
from safetensors.numpy import load_file

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bert_jax.data import vocab_extension
from bert_jax.io import checkpointing, convert
from bert_jax.commands import convert as convert_cli
from bert_jax.data.tokenizer import Tokenizer  # noqa: E402
from bert_jax.trainer import train_and_evaluate  # noqa: E402
from test_init_from import TOY, config, toy_texts, write_source  # noqa: E402

DOMAIN = ["the photosynthesis of the plant needs chlorophyll and light",
          "chlorophyll makes the leaves green during photosynthesis",
          "a mitochondrion gives the cell energy , like every mitochondrion",
          "photosynthesis and chlorophyll are studied in the botany class"]
PLAIN = "the cat sat on the warm mat by the door"  # toy words only: no new word


def source_tokenizer():
  return Tokenizer.train(toy_texts(), 200, lowercase=True)


def test_learn_appends_frequent_split_words_and_keeps_every_id():
  tok = source_tokenizer()
  ext = vocab_extension.learn(tok, DOMAIN * 3, 2)
  assert ext.words == ("photosynthesis", "chlorophyll") or set(ext.words) <= {
      "photosynthesis", "chlorophyll", "mitochondrion"}
  new = vocab_extension.extended_tokenizer(tok, ext)
  assert new.vocab[:tok.vocab_size] == tok.vocab  # no existing id moves
  for i, w in enumerate(ext.words):
    assert new.encode(w) == [tok.vocab_size + i]  # a new word is one piece
    assert tuple(tok.encode(w)) == ext.pieces[i] and len(ext.pieces[i]) >= 2
  assert new.encode(PLAIN) == tok.encode(PLAIN)


def test_asking_for_more_than_the_corpus_offers_adds_what_it_offers_and_says_so():
  tok = source_tokenizer()
  ext = vocab_extension.learn(tok, DOMAIN * 3, 1000)
  assert len(ext.words) == ext.offered < 1000
  assert f"asked for 1000; the corpus offers only {ext.offered}" in ext.describe(tok.vocab_size)
  assert "the" not in ext.words and all(c >= vocab_extension.MIN_COUNT for c in ext.counts)


def test_new_rows_are_the_mean_of_their_pieces():
  ext = vocab_extension.Extension(("ab",), ((1, 3),), (5,), 1, 1)
  emb = np.arange(12, dtype=np.float32).reshape(4, 3)
  out = vocab_extension.extend_hf_state(
      {"bert.embeddings.word_embeddings.weight": emb, "cls.predictions.bias": np.arange(4.0),
       "other": np.ones(2)}, ext)
  np.testing.assert_array_equal(out["bert.embeddings.word_embeddings.weight"][:4], emb)
  np.testing.assert_allclose(out["bert.embeddings.word_embeddings.weight"][4], (emb[1] + emb[3]) / 2)
  assert out["cls.predictions.bias"][4] == 2.0 and out["other"].shape == (2,)


@pytest.fixture(scope="module")
def extended_run(tmp_path_factory):
  base = tmp_path_factory.mktemp("extend")
  src = write_source(str(base / "src"))
  text = base / "domain.txt"
  with open(TOY, encoding="utf-8") as f:
    toy = f.read().replace("\t", "\n")
  # plain format: one sentence a line, blank line between documents
  docs = toy.strip().split("\n") + DOMAIN * 3
  text.write_text("\n\n".join("\n".join(docs[i:i + 4]) for i in range(0, len(docs), 4)) + "\n")
  workdir = str(base / "run")
  train_and_evaluate(config(src, base / "prepared", steps=1, corpus=str(text),
                            **{"data.extend_vocab": 3}), workdir)
  out = str(base / "hf")
  assert convert_cli.main(["to-hf", workdir, out, "--step", "0"]) == 0
  return base, src, workdir, out


@pytest.mark.slow
def test_extended_run_keeps_source_rows_and_sets_new_rows_to_piece_means(extended_run):
  _, src, workdir, out = extended_run
  source_tok = Tokenizer.from_vocab_file(os.path.join(src, "vocab.txt"), True)
  _, meta = checkpointing.restore_params(workdir, step=0)
  V = source_tok.vocab_size
  assert meta["vocab"][:V] == source_tok.vocab and len(meta["vocab"]) == V + 3
  theirs = load_file(os.path.join(src, "model.safetensors"))
  ours = load_file(os.path.join(out, "model.safetensors"))
  emb, bias = theirs["bert.embeddings.word_embeddings.weight"], theirs["cls.predictions.bias"]
  np.testing.assert_array_equal(ours["bert.embeddings.word_embeddings.weight"][:V], emb)
  for i, word in enumerate(meta["vocab"][V:]):
    pieces = source_tok.encode(word)
    assert len(pieces) >= 2
    np.testing.assert_allclose(ours["bert.embeddings.word_embeddings.weight"][V + i],
                               emb[pieces].mean(0), rtol=1e-6)
    np.testing.assert_allclose(ours["cls.predictions.bias"][V + i], bias[pieces].mean(), rtol=1e-6)


def test_extended_export_loads_in_transformers_with_one_piece_per_new_word(extended_run):
  _, src, _, out = extended_run
  model = transformers.BertForPreTraining.from_pretrained(out).eval()
  tok = transformers.BertTokenizer.from_pretrained(out)
  assert model.config.vocab_size == len(tok.vocab)
  assert tok.tokenize("Photosynthesis needs chlorophyll")[0] == "photosynthesis"
  # A text with no new word: the same ids and the same features as the source
  source_tok = transformers.BertTokenizer(os.path.join(src, "vocab.txt"))
  ids = tok(PLAIN, return_tensors="pt")
  assert ids["input_ids"].tolist() == source_tok(PLAIN, return_tensors="pt")["input_ids"].tolist()
  source = transformers.BertForPreTraining.from_pretrained(src).eval()
  with torch.no_grad():
    a = model.bert(**ids).last_hidden_state.numpy()
    b = source.bert(**ids).last_hidden_state.numpy()
  np.testing.assert_array_equal(a, b)
