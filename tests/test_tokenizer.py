"""WordPiece tokenizer: special ids, training, vocab.txt loading, round trips."""

import json
import random
import os

import numpy as np
import pytest

from bert_jax.errors import ConfigError
from bert_jax.data.tokenizer import SPECIAL_TOKENS, Tokenizer

TEXTS = [
    "The cat sat on the warm mat.",
    "A small dog ran across the green field after the ball.",
    "Unbelievable things happen when nobody is watching the unbelievers.",
    "Running, runner, runs and ran are forms of run.",
] * 20

# A google-style vocab with bert-base-uncased's special layout: [PAD] 0,
# [unused*] fillers, [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103.
BASE_LAYOUT = (["[PAD]"] + [f"[unused{i}]" for i in range(99)] +
               ["[UNK]", "[CLS]", "[SEP]", "[MASK]"])


def write_vocab(tmp_path, tokens, name="vocab.txt"):
  path = tmp_path / name
  path.write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
  return str(path)


def trained(vocab_size=120, lowercase=True):
  return Tokenizer.train(TEXTS, vocab_size=vocab_size, lowercase=lowercase)


def test_trained_vocab_puts_specials_first_in_order():
  tok = trained()
  assert tok.vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
  assert list(tok.special_ids()) == [0, 1, 2, 3, 4]


def test_trained_vocab_has_exactly_vocab_size_when_corpus_is_big_enough():
  assert trained(vocab_size=80).vocab_size == 80


def test_trained_vocab_is_smaller_when_corpus_is_tiny():
  tok = Tokenizer.train(["a b"], vocab_size=1000, lowercase=True)
  assert tok.vocab_size < 1000
  assert tok.vocab_size == len(tok.vocab)


def test_train_rejects_vocab_size_not_above_specials():
  with pytest.raises(ConfigError, match="vocab_size"):
    Tokenizer.train(TEXTS, vocab_size=5, lowercase=True)


def test_encode_adds_no_special_tokens():
  tok = trained()
  ids = tok.encode("the cat sat")
  assert ids and not set(ids) & set(tok.special_ids())


def test_encode_batch_matches_encode():
  tok = trained()
  texts = ["The cat sat.", "", "unbelievable runners"]
  assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]


def test_is_continuation_marks_exactly_the_hash_hash_pieces():
  tok = trained()
  cont = tok.is_continuation()
  assert cont.dtype == np.bool_ and cont.shape == (tok.vocab_size,)
  assert cont.tolist() == [t.startswith("##") for t in tok.vocab]
  assert cont.any()


def test_decode_joins_word_pieces_back_into_words():
  tok = trained()
  assert tok.decode(tok.encode("unbelievable runners")) == "unbelievable runners"


def test_save_writes_vocab_txt_in_id_order_and_config(tmp_path):
  tok = trained(lowercase=False)
  path = tok.save(str(tmp_path / "tok"))
  assert path == str(tmp_path / "tok" / "vocab.txt")
  assert (tmp_path / "tok" / "vocab.txt").read_text(encoding="utf-8").splitlines() == tok.vocab
  config = json.loads((tmp_path / "tok" / "tokenizer_config.json").read_text())
  assert config == {"lowercase": False}


def test_save_load_round_trip_gives_identical_ids(tmp_path):
  tok = trained()
  tok.save(str(tmp_path))
  loaded = Tokenizer.load(str(tmp_path))
  assert loaded.vocab == tok.vocab
  assert loaded.lowercase == tok.lowercase
  assert loaded.encode_batch(TEXTS[:4]) == tok.encode_batch(TEXTS[:4])
  assert not [f for f in os.listdir(tmp_path) if ".tmp" in f]


def test_vocab_file_keeps_its_own_special_ids(tmp_path):
  tok = Tokenizer.from_vocab_file(write_vocab(tmp_path, BASE_LAYOUT + ["hello"]), True)
  assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 100, 101, 102, 103)
  assert tok.encode("hello") == [104]


def test_vocab_file_with_lowercase_lowercases_and_strips_accents(tmp_path):
  tok = Tokenizer.from_vocab_file(write_vocab(tmp_path, BASE_LAYOUT + ["hello", "cafe"]), True)
  assert tok.convert_ids_to_tokens(tok.encode("HeLLo Café")) == ["hello", "cafe"]


def test_vocab_file_without_lowercase_keeps_case(tmp_path):
  vocab = BASE_LAYOUT + ["hello", "Hello", "##LO", "He"]
  tok = Tokenizer.from_vocab_file(write_vocab(tmp_path, vocab), False)
  assert tok.convert_ids_to_tokens(tok.encode("Hello hello HeLO")) == [
      "Hello", "hello", "He", "##LO"]


def test_unknown_word_becomes_unk(tmp_path):
  tok = Tokenizer.from_vocab_file(write_vocab(tmp_path, BASE_LAYOUT + ["hello"]), True)
  assert tok.encode("hello zebra") == [104, tok.unk_id]


def test_vocab_file_missing_mask_raises_naming_file_and_token(tmp_path):
  path = write_vocab(tmp_path, ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "hello"])
  with pytest.raises(ConfigError, match=r"vocab\.txt.*\[MASK\]") as e:
    Tokenizer.from_vocab_file(path, True)
  assert "\n" not in str(e.value)


def test_vocab_file_duplicate_token_raises_naming_file_and_line(tmp_path):
  path = write_vocab(tmp_path, BASE_LAYOUT + ["hello", "world", "hello"])
  with pytest.raises(ConfigError, match=r"vocab\.txt' line 107 repeats token 'hello'"):
    Tokenizer.from_vocab_file(path, True)


def test_vocab_file_pad_not_at_id_zero_raises(tmp_path):
  path = write_vocab(tmp_path, ["[UNK]", "[PAD]", "[CLS]", "[SEP]", "[MASK]"])
  with pytest.raises(ConfigError, match=r"vocab\.txt.*\[PAD\] at id 1"):
    Tokenizer.from_vocab_file(path, True)


def test_missing_vocab_file_raises_naming_it(tmp_path):
  with pytest.raises(ConfigError, match="nope.txt"):
    Tokenizer.from_vocab_file(str(tmp_path / "nope.txt"), True)


def test_load_without_config_raises_naming_it(tmp_path):
  write_vocab(tmp_path, BASE_LAYOUT)
  with pytest.raises(ConfigError, match="tokenizer_config.json"):
    Tokenizer.load(str(tmp_path))


# --- the fast path gives HF's ids ---


def hf_ids(tok, texts):
  return [e.ids for e in tok.backend.encode_batch(list(texts), add_special_tokens=False)]


@pytest.fixture(scope="module")
def builtin_sentences():
  from bert_jax.data import corpus
  return [s for d in corpus.read_documents("builtin") for s in d]


@pytest.mark.parametrize("lowercase", [True, False])
def test_encode_batch_equals_hf_pipeline_on_the_builtin_corpus(builtin_sentences, lowercase):
  tok = Tokenizer.train(builtin_sentences, vocab_size=800, lowercase=lowercase)
  assert tok.encode_batch(builtin_sentences) == hf_ids(tok, builtin_sentences)


def test_training_twice_on_the_same_text_gives_the_same_vocabulary(builtin_sentences):
  # Unseeded, tokenizers 0.22/0.23 gave a different vocabulary on almost every call here
  # (huggingface/tokenizers#1794).
  vocabs = {tuple(Tokenizer.train(builtin_sentences, 1000, lowercase=True).vocab)
            for _ in range(3)}
  assert len(vocabs) == 1


def test_a_one_shot_iterator_trains_like_a_list(builtin_sentences):
  from_list = Tokenizer.train(builtin_sentences, 1000, lowercase=True)
  from_iterator = Tokenizer.train(iter(builtin_sentences), 1000, lowercase=True)
  assert from_iterator.vocab == from_list.vocab


def test_a_trained_vocabulary_lists_specials_then_the_alphabet_then_its_pieces():
  vocab = Tokenizer.train(TEXTS, 200, lowercase=True).vocab
  singles = [i for i, t in enumerate(vocab) if len(t) == 1]
  pieces = [i for i, t in enumerate(vocab) if len(t) == 3 and t.startswith("##")]
  assert vocab[:5] == list(SPECIAL_TOKENS)
  assert singles == list(range(5, 5 + len(singles)))
  assert pieces == list(range(5 + len(singles), 5 + len(singles) + len(pieces)))


@pytest.mark.parametrize("lowercase", [True, False])
def test_encode_batch_equals_hf_pipeline_on_random_unicode(lowercase):
  rng = random.Random(lowercase)
  common = [chr(i) for i in range(128)] + [
      " ", "the", "##", "[MASK]", "[SEP]", "é", "É", "Σ", "İ", "ß", "中", "—", "“", "\u00a0",
      "\u2003", "\u200b", "\ufeff", "\u0301", "\u0345", "ﬁ", "½", "😀"]
  texts = []
  for _ in range(3000):
    chars = [rng.choice(common) if rng.random() < 0.8 else chr(rng.randint(128, 0x2FFFF))
             for _ in range(rng.randint(0, 40))]
    texts.append("".join(chars).encode("utf-8", "replace").decode("utf-8"))  # no surrogates
  tok = Tokenizer.train(TEXTS + texts, vocab_size=300, lowercase=lowercase)
  assert tok.encode_batch(texts) == hf_ids(tok, texts)


def test_encode_batch_flat_concatenates_with_lengths():
  tok = trained()
  texts = ["The cat sat.", "", "naïve runners", "a [MASK] b"]
  ids, lengths = tok.encode_batch_flat(texts)
  assert ids.dtype == np.int32 and lengths.tolist() == [len(tok.encode(t)) for t in texts]
  assert ids.tolist() == [i for t in texts for i in tok.encode(t)]


@pytest.mark.parametrize("lowercase", [True, False])
def test_text_that_spells_a_special_token_is_ordinary_pieces_as_in_the_reference(lowercase):
  """google-research/bert's tokenizer never makes a special id from corpus text: "[CLS]"
  is "[", "cls" (or its pieces), "]" (issue 41: a packed document that said "[CLS]" was
  split in two by the step)."""
  tok = Tokenizer.train(TEXTS + ["cls sep mask pad the cat"], 200, lowercase=lowercase)
  for special in SPECIAL_TOKENS:
    text = f"the {special} and {special.lower()} sat"
    ids = tok.encode(text)
    assert not set(ids) & set(tok.special_ids()) - {tok.unk_id}, (special, ids)
    assert ids == tok.encode(text.replace("[", " [ ").replace("]", " ] "))  # split at punctuation
    assert ids == hf_ids(tok, [text])[0]


def test_a_megabyte_word_is_one_unk_and_not_cached():
  tok = trained()
  assert tok.encode("cat " + "x" * 1_000_000 + " cat") == [
      tok.encode("cat")[0], tok.unk_id, tok.encode("cat")[0]]
  assert max(map(len, tok._chunks)) <= 100 and max(map(len, tok._chunks._words)) <= 100


def test_word_cache_stays_bounded_and_ids_stay_right(monkeypatch):
  from bert_jax.data import tokenizer
  monkeypatch.setattr(tokenizer, "_WORD_CACHE_SIZE", 50)
  tok = trained()
  words = [f"cat{i}dog (the{i})." for i in range(400)]
  assert tok.encode_batch(words) == hf_ids(tok, words)
  assert len(tok._chunks) <= 51 and len(tok._chunks._words) <= 50


def test_vocab_file_starting_with_a_byte_order_mark_reads_token_0_without_it(tmp_path):
  plain = Tokenizer.from_vocab_file(write_vocab(tmp_path, BASE_LAYOUT + ["hello"]), True)
  path = tmp_path / "bom_vocab.txt"
  path.write_bytes(b"\xef\xbb\xbf" + "".join(t + "\n" for t in BASE_LAYOUT + ["hello"]).encode())
  tok = Tokenizer.from_vocab_file(str(path), True)
  assert tok.vocab == plain.vocab and tok.vocab[0] == "[PAD]" and tok.pad_id == 0
  assert tok.encode("hello") == plain.encode("hello") == [104]
  # Only a leading mark is dropped: one inside the file stays part of its token.
  path.write_bytes("".join(t + "\n" for t in BASE_LAYOUT + ["\ufeffhello"]).encode())
  assert Tokenizer.from_vocab_file(str(path), True).vocab[-1] == "\ufeffhello"
