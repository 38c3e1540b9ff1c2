"""ModernBERT (model/modernbert.py) against transformers' own ModernBertForMaskedLM and
ModernBertModel (PyTorch, float32, eager attention), with random weights (biases and
norms too): hidden states, logits, loss and gradients; export loaded by
`AutoModelForMaskedLM.from_pretrained` (no remote code) and `save_pretrained` imported
back; packed rows; the settings it refuses."""

import dataclasses
import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.errors import ConfigError
from bert_jax.data.tokenizer import SpecialIds
from bert_jax.io import hf_modernbert
from bert_jax.model import build, losses
from bert_jax.settings.model import ModelConfig

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
TRANSFORMERS_MAJOR = int(transformers.__version__.split(".")[0])

V = 97
# (name, ModernBertConfig overrides): an odd layer count, windows shorter and longer than
# the sequence (L = 16), with and without biases.
SHAPES = {
    "odd_layers_short_window_biases": dict(num_hidden_layers=5, local_attention=6,
                                           global_attn_every_n_layers=2, attention_bias=True,
                                           mlp_bias=True, norm_bias=True, classifier_bias=True),
    "no_biases_window_longer_than_the_row": dict(num_hidden_layers=4, local_attention=40,
                                                 global_attn_every_n_layers=3),
    "every_layer_local_but_the_first_no_decoder_bias": dict(
        num_hidden_layers=3, local_attention=4, global_attn_every_n_layers=100,
        decoder_bias=False, hidden_activation="gelu_pytorch_tanh",
        classifier_activation="gelu_pytorch_tanh"),
}


def hf_model(seed: int = 0, **overrides):
  torch.manual_seed(seed)
  cfg = transformers.ModernBertConfig(
      vocab_size=V, hidden_size=32, num_attention_heads=4, intermediate_size=48,
      max_position_embeddings=64, pad_token_id=0, cls_token_id=2, sep_token_id=3,
      bos_token_id=2, eos_token_id=3, global_rope_theta=160000.0, local_rope_theta=10000.0,
      **{"num_hidden_layers": 2, **overrides})
  cfg._attn_implementation = "eager"  # pylint: disable=protected-access
  model = transformers.ModernBertForMaskedLM(cfg).eval()
  with torch.no_grad():  # random norms and biases, not ones and zeros
    for name, p in model.named_parameters():
      if p.dim() == 1:
        p.normal_(0.0, 0.1) if "bias" in name else p.normal_(1.0, 0.1)
  return model


def ours_of(model, pad_multiple: int = 8):
  config = dataclasses.replace(hf_modernbert.config_from_hf(model.config.to_dict(), "test"),
                               vocab_pad_multiple=pad_multiple)
  abstract = nn.meta.unbox(build.abstract_params(config))
  state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
  params, missing, unused = hf_modernbert.hf_state_to_params(state, config, abstract,
                                                              source="test")
  assert missing == [] and unused == []
  return config, jax.tree.map(jnp.asarray, params)


def batch(B: int = 3, L: int = 16, seed: int = 0):
  rng = np.random.default_rng(seed)
  mask = np.ones((B, L), np.int64)
  mask[1, 11:] = 0  # padded rows
  mask[2, 4:] = 0
  ids = rng.integers(5, V, (B, L)) * mask
  return ids, mask


def forward(config, params, ids, mask, positions=None, documents=None):
  B, L = ids.shape
  positions = (jnp.broadcast_to(jnp.arange(L), (B, L)) if positions is None
               else jnp.asarray(positions))
  return build.pretraining_model(config).apply(
      {"params": params}, jnp.asarray(ids, jnp.int32), jnp.zeros((B, L), jnp.int32),
      jnp.asarray(mask, jnp.int32), positions, output_hidden_states=True,
      documents_BxL=documents)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_hidden_states_and_logits_equal_transformers(shape):
  model = hf_model(**SHAPES[shape])
  config, params = ours_of(model)
  ids, mask = batch()
  with torch.no_grad():
    ref = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                output_hidden_states=True)
  out = forward(config, params, ids, mask)
  real = mask.astype(bool)  # padded positions' outputs are not defined the same way
  # One numbering, transformers 5's: the last entry is after the final norm (the sequence
  # output); transformers 4 gave it before the norm, and the others are the same in both.
  want_all = list(ref.hidden_states)
  if TRANSFORMERS_MAJOR < 5:
    want_all[-1] = model.model.final_norm(want_all[-1])
  assert len(want_all) == len(out.encoder.hidden_states) == model.config.num_hidden_layers + 1
  for i, (want, got) in enumerate(zip(want_all, out.encoder.hidden_states)):
    np.testing.assert_allclose(np.asarray(got)[real], want.detach().numpy()[real], atol=1e-4,
                               err_msg=f"hidden state {i}")
  np.testing.assert_array_equal(out.encoder.hidden_states[-1], out.encoder.sequence_BxLxD)
  np.testing.assert_allclose(np.asarray(out.encoder.sequence_BxLxD)[real],
                             model.model(input_ids=torch.tensor(ids),
                                         attention_mask=torch.tensor(mask))
                             .last_hidden_state.detach().numpy()[real], atol=1e-4)
  np.testing.assert_allclose(np.asarray(out.mlm_logits_BxPxV)[..., :V][real],
                             ref.logits.numpy()[real], atol=1e-5)
  assert (np.asarray(out.mlm_logits_BxPxV)[..., V:] < -1e8).all()  # padded vocab never wins


def test_mlm_loss_and_gradients_equal_transformers():
  model = hf_model(**SHAPES["odd_layers_short_window_biases"])
  config, params = ours_of(model)
  ids, mask = batch()
  positions = np.array([[1, 5, 9, 12], [0, 3, 7, 10], [1, 2, 0, 0]])
  weights = np.array([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0]], np.float32)
  labels = np.take_along_axis(ids, positions, 1)
  hf_labels = np.full(ids.shape, -100)
  for b in range(3):
    for p, w, l in zip(positions[b], weights[b], labels[b]):
      if w:
        hf_labels[b, p] = l
  model.train()  # dropout is 0: train mode only turns on autograd bookkeeping
  out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
              labels=torch.tensor(hf_labels))
  out.loss.backward()

  def loss_fn(p):
    logits = forward(config, p, ids, mask, positions).mlm_logits_BxPxV
    s = losses.mlm_sums(logits, jnp.asarray(labels, jnp.int32), jnp.asarray(weights))
    return s.loss / s.count
  loss, grads = jax.value_and_grad(loss_fn)(params)
  np.testing.assert_allclose(float(loss), float(out.loss.detach()), rtol=1e-5)
  ours = hf_modernbert.params_to_hf_state(jax.device_get(grads), config)
  for name, p in model.named_parameters():
    want, got = p.grad.numpy(), ours[name]
    # Relative to the tensor's largest gradient. transformers 5's sliding-window layers
    # differ from 4.57's (and ours) by ~1e-6 in their outputs (float32 rounding of its
    # new mask and RoPE code: global layers agree to 5e-7), which moves those layers'
    # small attention gradients by up to 9.3e-4 of their largest (measured).
    scale = max(np.abs(want).max(), 1e-6)
    rtol = 1e-4 if TRANSFORMERS_MAJOR < 5 else 2e-3
    assert np.abs(got - want).max() < rtol * scale, name


def test_the_deferred_softmax_computes_what_the_standard_order_does(monkeypatch):
  """One attention core serves both families: attention_softmax='deferred' was silently
  the standard order for ModernBERT. Same loss and gradients, sliding windows included,
  and the deferred order is the one that ran."""
  from bert_jax.model import bert
  orders, core = [], bert._einsum_attention  # pylint: disable=protected-access
  monkeypatch.setattr(bert, "_einsum_attention", lambda c, *a: (
      orders.append(c.attention_softmax), core(c, *a))[1])
  model = hf_model(**SHAPES["odd_layers_short_window_biases"])
  config, params = ours_of(model)
  ids, mask = batch()
  positions = jnp.asarray(np.array([[1, 5, 9, 12], [0, 3, 7, 10], [1, 2, 0, 0]]))

  def loss_and_grads(c):
    loss = lambda p: jnp.sum(forward(c, p, ids, mask, positions).mlm_logits_BxPxV[..., :V] ** 2)
    return jax.value_and_grad(loss)(params)
  la, ga = loss_and_grads(config)
  lb, gb = loss_and_grads(dataclasses.replace(config, attention_softmax="deferred"))
  first = orders.index("deferred")  # the layers' cores, traced for each config in turn
  assert first and set(orders[:first]) == {"standard"} and set(orders[first:]) == {"deferred"}
  np.testing.assert_allclose(la, lb, rtol=1e-5)
  for x, y in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
    np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)


def test_packed_rows_give_each_document_what_it_gets_alone():
  """Two documents in one row: each one's hidden states and logits equal its own row's
  (positions restart; no attention, global or windowed, crosses the boundary)."""
  model = hf_model(**SHAPES["odd_layers_short_window_biases"])
  config, params = ours_of(model)
  rng = np.random.default_rng(1)
  a, b = rng.integers(5, V, 7), rng.integers(5, V, 6)
  L = 16
  packed = np.zeros((1, L), np.int64)
  packed[0, :7], packed[0, 7:13] = a, b
  pmask = (packed > 0).astype(np.int64)
  docs = np.concatenate([np.zeros(7), np.ones(6), np.full(3, 2)]).astype(np.int32)[None]
  out = forward(config, params, packed, pmask, documents=jnp.asarray(docs))
  for start, piece in ((0, a), (7, b)):
    alone = np.zeros((1, L), np.int64)
    alone[0, :len(piece)] = piece
    ref = forward(config, params, alone, (alone > 0).astype(np.int64))
    got = np.asarray(out.encoder.sequence_BxLxD)[0, start:start + len(piece)]
    np.testing.assert_allclose(got, np.asarray(ref.encoder.sequence_BxLxD)[0, :len(piece)],
                               atol=1e-5)


def test_export_loads_in_transformers_own_class_with_the_same_outputs(tmp_path):
  from bert_jax.io import convert
  model = hf_model(**SHAPES["no_biases_window_longer_than_the_row"])
  config, params = ours_of(model)
  convert.write_hf(str(tmp_path / "hf"), params, config, SpecialIds(0, 1, 2, 3, 4))
  loaded = transformers.AutoModelForMaskedLM.from_pretrained(
      str(tmp_path / "hf"), attn_implementation="eager").eval()
  assert type(loaded).__name__ == "ModernBertForMaskedLM"
  ids, mask = batch()
  with torch.no_grad():
    want = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits
    got = loaded(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits
  real = mask.astype(bool)
  np.testing.assert_allclose(got.numpy()[real], want.numpy()[real], atol=1e-5)


def test_a_save_pretrained_model_imports_with_its_outputs(tmp_path):
  from bert_jax.io import convert
  model = hf_model(**SHAPES["odd_layers_short_window_biases"])
  model.save_pretrained(str(tmp_path / "saved"))
  config, params, _ = convert.read_hf(str(tmp_path / "saved"))
  ids, mask = batch()
  with torch.no_grad():
    want = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits
  got = forward(config, params, ids, mask)
  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(got.mlm_logits_BxPxV)[..., :V][real], want.numpy()[real],
                             atol=1e-5)
  # A bare ModernBertModel (no head): the encoder imports, the head is the caller's to init.
  model.model.save_pretrained(str(tmp_path / "bare"))
  with open(tmp_path / "bare" / "config.json") as f:
    assert json.load(f)["architectures"] == ["ModernBertModel"]
  _, bare, report = convert.read_hf(str(tmp_path / "bare"))
  assert report.groups["mlm"] == "initialised"
  np.testing.assert_array_equal(bare["bert"]["tok_embeddings"]["embedding"],
                                params["bert"]["tok_embeddings"]["embedding"])


def _saved(path, model) -> str:
  """`model` saved by transformers, with a WordPiece vocab.txt of its V tokens."""
  model.save_pretrained(str(path))
  words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(V - 5)]
  (path / "vocab.txt").write_text("".join(w + "\n" for w in words))
  return str(path)


def _one_error_line(capsys) -> str:
  err = capsys.readouterr().err
  assert err.startswith("error: ") and err.count("\n") == 1, err
  return err


def test_an_untied_decoder_is_refused_in_one_line_not_dropped(tmp_path, capsys):
  """transformers' tie_word_embeddings=False keeps a decoder of its own; bert-jax's
  ModernBERT decodes with its token table, so importing would change every logit."""
  from bert_jax.commands import convert as convert_cli
  model = hf_model(**SHAPES["no_biases_window_longer_than_the_row"], tie_word_embeddings=False)
  with torch.no_grad():
    model.decoder.weight.normal_(0.0, 0.5)
  hf_dir = _saved(tmp_path / "untied", model)
  capsys.readouterr()  # transformers 5's save_pretrained draws a progress bar
  assert convert_cli.main(["from-hf", hf_dir, str(tmp_path / "out")]) == 2
  assert "'decoder.weight' differs from the token embeddings" in _one_error_line(capsys)
  assert not (tmp_path / "out").exists()
  # Without the heads the encoder imports, and the unused tensors are named.
  assert convert_cli.main(["from-hf", hf_dir, str(tmp_path / "out"), "--no-heads"]) == 0
  out = capsys.readouterr().out
  assert "MLM head (cls.predictions.*): initialised randomly (--no-heads)" in out
  assert "ignored 4 tensor(s): decoder.bias, decoder.weight, head.dense.weight" in out


def test_a_bare_model_says_its_head_was_initialised(tmp_path, capsys):
  from bert_jax.commands import convert as convert_cli
  model = hf_model(**SHAPES["no_biases_window_longer_than_the_row"])
  hf_dir = _saved(tmp_path / "bare", model.model)
  assert convert_cli.main(["from-hf", hf_dir, str(tmp_path / "out")]) == 0
  assert ("MLM head (cls.predictions.*): initialised randomly (not in the source)"
          in capsys.readouterr().out)
  from bert_jax.io import checkpointing
  assert checkpointing.restore_params(str(tmp_path / "out"))[1]["heads"]["mlm"] == "initialised"


def test_a_config_that_disagrees_with_the_weights_is_one_line(tmp_path, capsys):
  from bert_jax.commands import convert as convert_cli
  hf_dir = _saved(tmp_path / "hf", hf_model(**SHAPES["no_biases_window_longer_than_the_row"]))
  capsys.readouterr()  # transformers 5's save_pretrained draws a progress bar
  with open(os.path.join(hf_dir, "config.json")) as f:
    config = json.load(f)
  config["hidden_size"] = 64
  with open(os.path.join(hf_dir, "config.json"), "w") as f:
    json.dump(config, f)
  assert convert_cli.main(["from-hf", hf_dir, str(tmp_path / "out")]) == 2
  err = _one_error_line(capsys)
  assert ("tensor 'model.embeddings.tok_embeddings.weight' has shape (97, 32); the config.json "
          "beside it implies (97, 64)") in err, err


def test_the_family_trains_only_with_the_mlm_objective():
  from bert_jax import settings
  import tiny_run
  config = tiny_run.config(**{"model.family": "modernbert", "objective": "mlm+nsp"})
  with pytest.raises(ConfigError) as e:
    settings.from_config(config)
  assert "--config.objective" in str(e.value) and "'modernbert'" in str(e.value)


@pytest.mark.parametrize("field, value", [("local_attention", 0),
                                          ("global_attn_every_n_layers", -1),
                                          ("global_rope_theta", 0.0),
                                          ("global_rope_theta", float("inf")),
                                          ("local_rope_theta", float("nan"))])
def test_a_bad_modernbert_field_is_one_line_naming_it(field, value):
  with pytest.raises(ConfigError) as e:
    ModelConfig(vocab_size=10, family="modernbert", hidden_size=32, num_heads=4,
               **{field: value}).validate()
  assert f"config.model.{field}" in str(e.value) and "\n" not in str(e.value)


def test_bert_is_unchanged_by_the_family_field():
  """The default family builds the very tree and values BERT always had."""
  from bert_jax.model import bert
  c = ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64)
  ids = jnp.ones((1, 8), jnp.int32)
  want = nn.meta.unbox(bert.BertForPreTraining(c).init(
      {"params": jax.random.key(0), "dropout": jax.random.key(0)}, ids, ids, ids,
      jnp.zeros((1, 1), jnp.int32))["params"])
  got = build.init_params(c, jax.random.key(0))
  assert jax.tree.structure(got) == jax.tree.structure(want)
  assert all(bool((a == b).all()) for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)))


def test_hf_config_round_trips():
  model = hf_model(**SHAPES["odd_layers_short_window_biases"])
  config, _ = ours_of(model, pad_multiple=1)
  back = hf_modernbert.hf_config(config, SpecialIds(0, 1, 2, 3, 4))
  again = hf_modernbert.config_from_hf(back, "test")
  assert again == config
  assert os.path.basename(__file__)  # (a module-level file, for pytest's rewrite)


# --- context extension inside one run (config.train.phase_rope_thetas) ---


def _extension_settings(**extra):
  from bert_jax import settings
  import tiny_run
  return settings.from_config(tiny_run.config(**{
      "model.family": "modernbert", "objective": "mlm", "model.num_layers": 2,
      "model.global_attn_every_n_layers": 2, "model.local_attention": 8,
      "train.phase_fractions": (0.5, 0.5), "train.seq_lens": (32, 64),
      "train.max_predictions": (5, 10), **extra}))


@pytest.mark.parametrize("extra, field", [
    ({"train.phase_rope_thetas": (10000.0,)}, "train.phase_rope_thetas"),  # one per phase
    ({"train.phase_rope_thetas": (10000.0, 0.0)}, "train.phase_rope_thetas"),
    ({"train.phase_rope_thetas": (10000.0, 160000.0), "model.family": "bert",
      "objective": "mlm+nsp"}, "train.phase_rope_thetas"),  # learned positions: no base
])
def test_a_bad_phase_rope_base_is_one_line_naming_it(extra, field):
  with pytest.raises(ConfigError) as e:
    _extension_settings(**extra)
  assert f"--config.{field}" in str(e.value) and "\n" not in str(e.value)


def test_each_phase_applies_its_own_rope_base_to_the_same_parameters():
  """A phase's steps apply the model with its base: the same parameters and batch give
  another loss under 10000 than under 160000, and exactly the model's own under the
  model's base (what a run without phase_rope_thetas applies)."""
  from bert_jax.data.pretraining_data import Batch
  from bert_jax.train.steps import make_steps
  s = _extension_settings(**{"train.phase_rope_thetas": (10000.0, 160000.0)})
  assert [ph.rope_theta for ph in s.train.phases] == [10000.0, 160000.0]
  steps = make_steps(s, 300, SpecialIds(0, 1, 2, 3, 4))
  assert steps.config_at(0).global_rope_theta == 10000.0
  assert steps.config_at(1) == steps.bert_config  # 160000: default_config's base
  params, _ = steps.init_state()
  # Sharper attention than at initialisation (scores ~0.05 there: nearly uniform, so
  # any rotation gives the same loss to float32's digits): queries and keys x 30.
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: x * 30 if "Wqkv" in jax.tree_util.keystr(path) else x, params)
  rng = np.random.default_rng(0)
  ids = rng.integers(5, 300, (8, 64)).astype(np.int32)
  ids[:, 0] = 2
  batch = Batch(input_ids_BxL=ids, segment_ids_BxL=np.zeros_like(ids),
                input_mask_BxL=np.ones_like(ids), next_sentence_label_B=np.zeros(8, np.int32),
                example_mask_B=np.ones(8, np.float32))
  phase = lambda theta: dataclasses.replace(steps.phases[0], max_predictions=10, rope_theta=theta)
  loss = {theta: steps.evaluate(params, [batch], phase(theta))["mlm_loss"]
          for theta in (0.0, 10000.0, 160000.0)}
  assert loss[160000.0] == loss[0.0]
  assert abs(loss[10000.0] - loss[160000.0]) > 1e-6
