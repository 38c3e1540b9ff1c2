"""HuggingFace directories as the installed transformers saves them, both ways: a BERT
and a ModernBERT (WordPiece tokenizer, ModernBERT with its own RoPE bases and layer
pattern) saved by `save_pretrained` import, continue pre-training, and export back to a
directory that `AutoModel*` and `AutoTokenizer` of the same version load with the same
ids and logits. transformers 5 saves a tokenizer.json and no vocab.txt, and a
ModernBERT's bases as `rope_parameters` and its pattern as `layer_types`; 4.x saves
both tokenizer files and the 4.x fields. CI runs this module with 4.57 (Python 3.11)
and with 5.x (Python 3.12), so both versions are held on every run."""

import json
import os

import numpy as np
import pytest

from bert_jax.commands import convert as convert_cli
from bert_jax.errors import ConfigError
from bert_jax.io import checkpointing, sources
from bert_jax.settings.model import ModelConfig

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from tokenizers.implementations import BertWordPieceTokenizer  # noqa: E402

MAJOR = int(transformers.__version__.split(".")[0])
WORDS = (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
         + "the cat dog sat on a mat and ran to house tree bird sang river old stone".split()
         + ["##s", "##ed", "##ing", ".", ","])
TEXTS = ["The cats sat on the mat.", "a dog ran to the old stone house", "birds sang"]


def _tokenizer(tmp_path):
  """The installed transformers' BERT tokenizer of WORDS, as a user has one."""
  d = tmp_path / "tok_src"
  d.mkdir()
  BertWordPieceTokenizer({w: i for i, w in enumerate(WORDS)}, lowercase=True).save(
      str(d / "tokenizer.json"))
  (d / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer",
                                                       "do_lower_case": True}))
  return transformers.AutoTokenizer.from_pretrained(str(d))


def _saved(tmp_path, family: str):
  """(directory, model, tokenizer): a random model of `family` and its tokenizer, saved."""
  torch.manual_seed(0)
  if family == "bert":
    config = transformers.BertConfig(vocab_size=len(WORDS), hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=48,
                                     max_position_embeddings=64)
    model = transformers.BertForPreTraining(config)
  else:  # a pattern and bases other than the defaults: read from 5.x's fields too
    config = transformers.ModernBertConfig(
        vocab_size=len(WORDS), hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
        intermediate_size=48, max_position_embeddings=64, local_attention=4,
        global_attn_every_n_layers=2, global_rope_theta=20000.0, local_rope_theta=5000.0,
        pad_token_id=0, cls_token_id=2, sep_token_id=3, bos_token_id=2, eos_token_id=3)
    model = transformers.ModernBertForMaskedLM(config)
  with torch.no_grad():  # random norms and biases, not ones and zeros
    for name, p in model.named_parameters():
      if p.dim() == 1:
        p.normal_(0.0, 0.1) if "bias" in name else p.normal_(1.0, 0.1)
  tok = _tokenizer(tmp_path)
  hf_dir = tmp_path / f"{family}_saved"
  model.save_pretrained(str(hf_dir))
  tok.save_pretrained(str(hf_dir))
  return str(hf_dir), model.eval(), tok


def _logits(model, tok, family):
  enc = tok(TEXTS, padding=True, return_tensors="pt")
  if family != "bert":
    enc.pop("token_type_ids", None)
  with torch.no_grad():
    out = model(**enc)
  logits = out.prediction_logits if family == "bert" else out.logits
  return enc["input_ids"].numpy(), logits.numpy(), enc["attention_mask"].numpy().astype(bool)


def _load(out_dir, family):
  cls = (transformers.AutoModelForPreTraining if family == "bert"
         else transformers.AutoModelForMaskedLM)
  kw = {} if family == "bert" else {"attn_implementation": "eager"}
  return (cls.from_pretrained(out_dir, **kw).eval(),
          transformers.AutoTokenizer.from_pretrained(out_dir))


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_a_saved_directory_imports_and_exports_back_with_the_same_ids_and_logits(
    tmp_path, family):
  hf_dir, model, tok = _saved(tmp_path, family)
  assert ("vocab.txt" in os.listdir(hf_dir)) == (MAJOR < 5)  # 5.x: tokenizer.json alone
  ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "export")
  assert convert_cli.main(["from-hf", hf_dir, ckpt]) == 0
  _, meta = checkpointing.restore_params(ckpt)
  config = ModelConfig.from_dict(meta["model_config"])
  if family == "modernbert":  # 5.x: rope_parameters and layer_types
    assert (config.global_rope_theta, config.local_rope_theta) == (20000.0, 5000.0)
    assert config.global_attn_every_n_layers == 2 and config.local_attention == 4
  assert meta["vocab"] == WORDS and meta["lowercase"] is True
  assert convert_cli.main(["to-hf", ckpt, out]) == 0
  assert {"tokenizer.json", "vocab.txt", "config.json", "model.safetensors"} <= set(
      os.listdir(out))
  loaded, loaded_tok = _load(out, family)
  ids, want, real = _logits(model, tok, family)
  got_ids, got, _ = _logits(loaded, loaded_tok, family)
  np.testing.assert_array_equal(got_ids, ids)
  np.testing.assert_allclose(got[real], want[real], atol=1e-4)


def test_a_modernbert_saved_by_transformers_continues_pre_training_and_exports_back(tmp_path):
  """The issue's whole path: a transformers-saved ModernBERT (WordPiece tokenizer.json)
  through `init_from`, two steps of training, and an export that the same transformers
  loads, tokenizer included, with the run's own logits."""
  import soak_kill  # pylint: disable=import-outside-toplevel
  from bert_jax.trainer import train_and_evaluate  # pylint: disable=import-outside-toplevel
  hf_dir, _, tok = _saved(tmp_path, "modernbert")
  workdir = str(tmp_path / "run")
  train_and_evaluate(soak_kill.tiny_config(str(tmp_path / "prepared"), 2, **{
      "init_from": hf_dir, "model.family": "modernbert", "objective": "mlm",
      "data.packing": True, "train.seq_lens": (32,), "train.max_predictions": (5,),
      "model.hidden_size": 32, "model.num_heads": 4, "model.intermediate_size": 48,
      "model.num_layers": 4, "model.max_position_embeddings": 64,
      "model.local_attention": 4, "model.global_attn_every_n_layers": 2,
      "model.layer_norm_eps": 1e-5}), workdir)
  out = str(tmp_path / "export")
  assert convert_cli.main(["to-hf", workdir, out]) == 0
  loaded, loaded_tok = _load(out, "modernbert")
  assert loaded_tok(TEXTS)["input_ids"] == tok(TEXTS)["input_ids"]
  params, meta = checkpointing.restore_params(workdir)
  assert meta["step"] == 2
  from bert_jax.model import build  # pylint: disable=import-outside-toplevel
  config = ModelConfig.from_dict(meta["model_config"])
  ids, theirs, real = _logits(loaded, loaded_tok, "modernbert")
  B, L = ids.shape
  pos = np.broadcast_to(np.arange(L), (B, L))
  ours = build.pretraining_model(config).apply(
      {"params": params}, ids, np.zeros_like(ids), real.astype(np.int32), pos)
  np.testing.assert_allclose(np.asarray(ours.mlm_logits_BxPxV)[..., :len(WORDS)][real],
                             theirs[real], atol=1e-4)


def _write_tokenizer_files(d, vocab_txt=None, tok_json=None):
  d.mkdir()
  (d / "config.json").write_text(json.dumps({"model_type": "bert"}))
  if vocab_txt is not None:
    (d / "vocab.txt").write_text("".join(w + "\n" for w in vocab_txt))
  if tok_json is not None:
    BertWordPieceTokenizer({w: i for i, w in enumerate(tok_json)}, lowercase=True).save(
        str(d / "tokenizer.json"))
  return str(d)


@pytest.mark.parametrize("files", ["vocab.txt", "tokenizer.json", "both"])
def test_the_vocabulary_is_read_from_either_file_or_both(tmp_path, files):
  d = _write_tokenizer_files(tmp_path / "d", WORDS if files != "tokenizer.json" else None,
                             WORDS if files != "vocab.txt" else None)
  config = ModelConfig(vocab_size=len(WORDS))
  tok, lower_from = sources.read_hf_tokenizer(d, {}, config, "config.json")
  assert tok.vocab == WORDS and tok.lowercase
  if files == "tokenizer.json":
    assert lower_from == "the normalizer of tokenizer.json"
    assert tok.encode("The cats sat.") == [WORDS.index(w) for w in ("the", "cat", "##s", "sat",
                                                                    ".")]


def test_a_vocab_txt_and_tokenizer_json_that_disagree_are_one_line(tmp_path):
  other = WORDS[:6] + ["dog", "cat"] + WORDS[8:]
  d = _write_tokenizer_files(tmp_path / "d", WORDS, other)
  with pytest.raises(ConfigError) as e:
    sources.read_hf_tokenizer(d, {}, ModelConfig(vocab_size=len(WORDS)), "config.json")
  assert "disagree at id 6: 'cat' in vocab.txt, 'dog' in tokenizer.json" in str(e.value)
  assert "\n" not in str(e.value)
