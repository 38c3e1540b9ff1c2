"""Byte-level BPE vocabularies (ModernBERT's kind): trained during preparation the same
in every process, a HuggingFace tokenizer.json read with HuggingFace's own ids (its
[PAD] anywhere), text that spells a special token kept as text, and a whole run whose
export transformers loads with the same tokenizer."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

import tiny_run
from bert_jax.data import bpe
from bert_jax.data.tokenizer import SpecialIds
from bert_jax.errors import ConfigError

ROOT = tiny_run.ROOT
TEXTS = ["The quick brown fox jumps over the lazy dog.", "Café, naïve – ✓ 東京 über.",
         "Text about BERT spells [CLS], [SEP], [MASK] and [PAD] as text."] * 40


def _trained(vocab_size: int = 400) -> bpe.BpeTokenizer:
  return bpe.BpeTokenizer.train(lambda: TEXTS, vocab_size, lowercase=False)


def _modernbert_like_json(tmp_path) -> str:
  """A tokenizer.json laid out as the published ModernBERT's: BPE tokens first, then the
  special tokens as added tokens at the end ([PAD] is not id 0), with a post-processor."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
  hf = Tokenizer(models.BPE())
  hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  hf.decoder = decoders.ByteLevel()
  hf.train_from_iterator(TEXTS, trainers.BpeTrainer(
      vocab_size=350, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  hf.add_special_tokens(["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"])
  hf.post_processor = processors.TemplateProcessing(
      single="[CLS] $A [SEP]", special_tokens=[("[CLS]", hf.token_to_id("[CLS]")),
                                               ("[SEP]", hf.token_to_id("[SEP]"))])
  path = str(tmp_path / "tokenizer.json")
  hf.save(path)
  return path


def test_a_trained_bpe_is_the_same_in_another_process():
  code = ("import hashlib, sys; sys.path.insert(0, 'tests'); import test_bpe; "
          "print(hashlib.sha256(test_bpe._trained().json.encode()).hexdigest())")
  runs = {subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, text=True,
                         capture_output=True, env={**os.environ, "PYTHONHASHSEED": str(seed)}
                         ).stdout.strip() for seed in (1, 2)}
  assert len(runs) == 1


def test_a_trained_bpe_puts_the_special_tokens_first_and_never_makes_them_from_text():
  tok = _trained()
  assert list(tok.special_ids()) == [0, 1, 2, 3, 4] and tok.pad_id == 0
  ids = tok.encode(TEXTS[2])
  assert not set(ids) & set(tok.special_ids())
  assert tok.decode(ids) == TEXTS[2]  # byte-level: every character comes back


def test_a_tokenizer_json_gives_huggingfaces_ids_and_its_own_special_ids(tmp_path):
  from tokenizers import Tokenizer
  path = _modernbert_like_json(tmp_path)
  tok = bpe.from_file(path, lowercase=True)  # the file decides casing, not the flag
  hf = Tokenizer.from_file(path)
  assert tok.pad_id == hf.token_to_id("[PAD]") != 0
  assert list(tok.special_ids()) == [hf.token_to_id(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]",
                                                            "[MASK]")]
  for text in TEXTS[:2]:
    assert tok.encode(text) == hf.encode(text, add_special_tokens=False).ids
  assert not tok.lowercase


def test_a_tokenizer_json_without_berts_special_tokens_is_one_line(tmp_path):
  from tokenizers import Tokenizer, models, pre_tokenizers, trainers
  hf = Tokenizer(models.BPE())
  hf.pre_tokenizer = pre_tokenizers.ByteLevel()
  hf.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=300, show_progress=False))
  hf.save(str(tmp_path / "tokenizer.json"))
  with pytest.raises(ConfigError, match=r"has no \[PAD\] token"):
    bpe.from_file(str(tmp_path / "tokenizer.json"), lowercase=False)
  (tmp_path / "bad.json").write_text("{not json")
  with pytest.raises(ConfigError, match="not a HuggingFace tokenizer.json"):
    bpe.from_file(str(tmp_path / "bad.json"), lowercase=False)


def test_a_tokenizer_json_where_two_tokens_share_an_id_is_one_line(tmp_path):
  """Accepted before, it left a gap (null) in the vocabulary a checkpoint keeps."""
  with open(_modernbert_like_json(tmp_path)) as f:
    doc = json.load(f)
  vocab = doc["model"]["vocab"]
  first, second = sorted(vocab, key=vocab.get)[-2:]
  vocab[second] = vocab[first]
  (tmp_path / "shared.json").write_text(json.dumps(doc))
  with pytest.raises(ConfigError) as e:
    bpe.from_file(str(tmp_path / "shared.json"), lowercase=False)
  assert f"share id {vocab[first]}; expected one token per id" in str(e.value)
  assert "\n" not in str(e.value)


def test_a_checkpoints_meta_gives_back_the_same_bpe():
  tok = _trained()
  back = bpe.from_meta(json.loads(json.dumps(bpe.to_meta(tok))), source="meta")
  assert isinstance(back, bpe.BpeTokenizer) and back.json == tok.json


def test_the_prepared_datas_key_covers_the_tokenizer_kind():
  from bert_jax import settings
  from bert_jax.data import dataset
  keys = {kind: dataset.key(settings.DataSettings(corpus=tiny_run.TOY, tokenizer=kind), 0)
          for kind in ("wordpiece", "bpe")}
  assert keys["wordpiece"] != keys["bpe"]


def test_whole_word_masking_with_a_bpe_is_refused_before_any_work():
  from bert_jax import settings
  config = tiny_run.config(**{"data.tokenizer": "bpe", "masking.whole_word": True})
  with pytest.raises(ConfigError, match="masking.whole_word"):
    settings.from_config(config)


def test_padding_becomes_the_vocabularys_pad_id_and_is_never_masked():
  """Prepared rows pad with 0; with [PAD] at another id the step puts that id there, so
  no padded position is a masking candidate (id 0 is an ordinary token then)."""
  from bert_jax import settings
  from bert_jax.train.steps import Batch, make_steps
  s = settings.from_config(tiny_run.config(**{
      "model.family": "modernbert", "objective": "mlm", "model.num_layers": 1,
      "model.local_attention": 8, "masking.mask_prob": 0.9}))
  pad = 300
  steps = make_steps(s, 320, SpecialIds(pad, 301, 302, 303, 304))
  ids = np.array([[302] + [7] * 6 + [303] + [0] * 8] * 8, np.int32)  # 8 real, 8 padding
  mask = (ids != 0).astype(np.int32)
  mask[:, 1:7] = 1
  batch = Batch(input_ids_BxL=ids, segment_ids_BxL=np.zeros_like(ids), input_mask_BxL=mask,
                next_sentence_label_B=np.zeros(8, np.int32),
                example_mask_B=np.ones(8, np.float32))
  masked = steps._mask(jax.random.PRNGKey(0), batch, 8)  # pylint: disable=protected-access
  positions = np.asarray(masked.positions_BxP)[np.asarray(masked.weights_BxP) > 0]
  assert positions.size and positions.min() >= 1 and positions.max() <= 6
  assert (np.asarray(masked.ids_BxL)[:, 8:] == pad).all()


@pytest.mark.slow
def test_a_modernbert_on_a_trained_bpe_exports_a_tokenizer_transformers_loads(tmp_path):
  """train.py with data.tokenizer='bpe', then convert to-hf: AutoTokenizer gives
  [CLS] + our ids + [SEP], and the model loads in ModernBertForMaskedLM."""
  workdir, hf_dir = str(tmp_path / "run"), str(tmp_path / "hf")
  flags = tiny_run.flags(**{
      "data.tokenizer": "bpe", "data.vocab_size": 600, "data.lowercase": False,
      "model.family": "modernbert", "objective": "mlm", "data.packing": True,
      "model.num_layers": 2, "model.local_attention": 8, "train.num_steps": 4,
      "eval_every": 4, "eval_batches": 1, "checkpoint_every": 4, "probe.tasks": ()})
  env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
  subprocess.run([sys.executable, "train.py", "--workdir", workdir, *flags], cwd=ROOT,
                 check=True, capture_output=True, env=env)
  prepared = [d for d in os.listdir(os.path.join(workdir, "prepared"))]
  assert os.path.isfile(os.path.join(workdir, "prepared", prepared[0], "tokenizer",
                                     "tokenizer.json"))
  subprocess.run([sys.executable, "-m", "bert_jax.convert", "to-hf", workdir, hf_dir],
                 cwd=ROOT, check=True, capture_output=True, env=env)
  import transformers
  ours = bpe.load(os.path.join(workdir, "prepared", prepared[0], "tokenizer"))
  theirs = transformers.AutoTokenizer.from_pretrained(hf_dir)
  text = "The lazy dog jumps over the quick brown fox."
  assert theirs(text)["input_ids"] == [ours.cls_id, *ours.encode(text), ours.sep_id]
  # transformers' users write "[MASK]" for the fill-mask pipeline: there it is the mask id.
  assert ours.mask_id in theirs("The lazy [MASK] jumps.")["input_ids"]
  model = transformers.AutoModelForMaskedLM.from_pretrained(hf_dir)
  assert type(model).__name__ == "ModernBertForMaskedLM"
  assert model.config.vocab_size == ours.vocab_size


@pytest.mark.slow
def test_a_huggingface_modernbert_with_a_tokenizer_json_continues_and_exports_it(tmp_path):
  """A ModernBertForMaskedLM directory as published (tokenizer.json, no vocab.txt, [PAD]
  not id 0) as init_from: the run trains on its tokenizer, pads with its [PAD], and its
  export carries the same tokenizer back."""
  import torch
  import transformers
  from tokenizers import Tokenizer
  hf_dir, workdir, out = str(tmp_path / "hf"), str(tmp_path / "run"), str(tmp_path / "out")
  os.makedirs(hf_dir)
  path = _modernbert_like_json(tmp_path)
  hf_tok = Tokenizer.from_file(path)
  ids = {t: hf_tok.token_to_id(t) for t in ("[PAD]", "[CLS]", "[SEP]")}
  cfg = transformers.ModernBertConfig(
      vocab_size=hf_tok.get_vocab_size(), hidden_size=32, num_attention_heads=2,
      intermediate_size=64, num_hidden_layers=2, max_position_embeddings=128,
      local_attention=8, pad_token_id=ids["[PAD]"], cls_token_id=ids["[CLS]"],
      sep_token_id=ids["[SEP]"], bos_token_id=ids["[CLS]"], eos_token_id=ids["[SEP]"])
  torch.manual_seed(0)
  transformers.ModernBertForMaskedLM(cfg).save_pretrained(hf_dir)
  hf_tok.save(os.path.join(hf_dir, "tokenizer.json"))
  flags = tiny_run.flags(**{
      "init_from": hf_dir, "objective": "mlm", "data.packing": True, "train.num_steps": 2,
      "train.seq_lens": (32,), "train.max_predictions": (10,), "eval_every": 2,
      "eval_batches": 1, "checkpoint_every": 2, "probe.tasks": ()})
  env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
  proc = subprocess.run([sys.executable, "train.py", "--workdir", workdir, *flags], cwd=ROOT,
                        capture_output=True, text=True, env=env)
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = [json.loads(l) for l in open(os.path.join(workdir, "metrics.jsonl"))]
  assert all(np.isfinite(r["mlm_loss"]) for r in rows if r["split"] == "eval")
  subprocess.run([sys.executable, "-m", "bert_jax.convert", "to-hf", workdir, out], cwd=ROOT,
                 check=True, capture_output=True, env=env)
  text = "The quick brown fox."
  assert (Tokenizer.from_file(os.path.join(out, "tokenizer.json")).encode(text).ids
          == hf_tok.encode(text).ids)
