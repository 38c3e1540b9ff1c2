"""The 'cudnn' attention kernel (model/bert.fused_attention) against the reference
'einsum' core, for both families: padded rows, packed rows of several documents, and
ModernBERT's sliding windows.

Here, without a GPU, the model's cuDNN call runs through jax's XLA implementation,
which takes the same arguments: float32 (cuDNN takes bf16 only, but the bf16 dots of a
GPU program do not run on XLA:CPU), 1e-5. On a GPU (`JAX_PLATFORMS=cuda`, as
tools/gpu_lease.sh runs it) the real kernel in bf16: 2e-2 absolute on hidden states,
5e-2 relative on the loss and gradients (a bf16 kernel summing in its own order).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.model import build, precision
from bert_jax.settings.model import ModelConfig

GPU = jax.default_backend() == "gpu"
L = 16
BERT = ModelConfig(vocab_size=97, hidden_size=32, num_layers=2, num_heads=4,
                  intermediate_size=48, max_position_embeddings=64, dropout_rate=0.0,
                  attention_dropout_rate=0.0)
# Windows shorter than the row (6) and longer (40); 3 layers: global, local, global.
MODERN = [dataclasses.replace(BERT, family="modernbert", num_layers=3, local_attention=w,
                              global_attn_every_n_layers=2) for w in (6, 40)]
CONFIGS = {"bert": BERT, "modernbert_window_6": MODERN[0], "modernbert_window_40": MODERN[1]}


def _rows(packed: bool):
  """(ids, mask, documents or None): a full row, a padded one, and (packed) a row of
  three documents with padding after them."""
  rng = np.random.default_rng(0)
  mask = np.ones((3, L), np.int32)
  mask[1, 11:] = 0
  mask[2, 13:] = 0
  ids = rng.integers(5, 97, (3, L)).astype(np.int32) * mask
  if not packed:
    return ids, mask, None
  docs = np.zeros((3, L), np.int32)
  docs[0, 9:] = 1  # two documents
  docs[2, 4:] = 1  # three, then padding
  docs[2, 8:] = 2
  docs[2, 13:] = 3
  return ids, mask, jnp.asarray(docs)


def _run(config, params, rows):
  """Hidden states (real positions) and the gradients of a loss over every output."""
  ids, mask, docs = rows
  B = ids.shape[0]
  model = build.pretraining_model(config)
  positions = jnp.broadcast_to(jnp.arange(3), (B, 3))

  def loss(p):
    out = model.apply({"params": p}, jnp.asarray(ids), jnp.zeros_like(ids), jnp.asarray(mask),
                      positions, deterministic=True, documents_BxL=docs)
    logits = out.mlm_logits_BxPxV[..., :97].astype(jnp.float32)
    return jnp.sum(logits ** 2) / logits.size, out.encoder.sequence_BxLxD

  (value, seq), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  return np.where(mask[..., None] > 0, np.asarray(seq, np.float32), 0), value, grads


def _compare(reference, kernel_config, atol, rtol, packed):
  params = build.init_params(reference, jax.random.key(1))
  rows = _rows(packed)
  seq_a, loss_a, grads_a = _run(reference, params, rows)
  seq_b, loss_b, grads_b = _run(kernel_config, params, rows)
  np.testing.assert_allclose(seq_b, seq_a, atol=atol)
  np.testing.assert_allclose(loss_b, loss_a, rtol=rtol)
  for a, b in zip(jax.tree.leaves(grads_a), jax.tree.leaves(grads_b)):
    scale = max(float(np.abs(a).max()), 1e-6)
    assert float(np.abs(np.asarray(b, np.float32) - a).max()) / scale < rtol


@pytest.fixture
def cudnn_as_xla(monkeypatch):
  """The model's cuDNN calls, run by the XLA implementation; yields the keyword
  arguments of each call."""
  calls = []
  real = jax.nn.dot_product_attention

  def as_xla(*args, implementation=None, **kwargs):
    calls.append((implementation, {k: getattr(v, "shape", v) for k, v in kwargs.items()}))
    return real(*args, implementation="xla", **kwargs)

  monkeypatch.setattr(jax.nn, "dot_product_attention", as_xla)
  monkeypatch.setattr(precision, "target_backend", lambda: "gpu")
  return calls


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_the_cudnn_call_computes_what_einsum_does(cudnn_as_xla, name, packed):
  config = CONFIGS[name]
  _compare(config, dataclasses.replace(config, attention_kernel="cudnn"), 1e-5, 1e-4, packed)
  assert cudnn_as_xla and all(impl == "cudnn" for impl, _ in cudnn_as_xla)


def test_padding_alone_goes_as_key_lengths_and_documents_or_windows_as_a_mask(cudnn_as_xla):
  """A bias that is the same for every query is a prefix of real keys: key lengths,
  with which cuDNN skips padded blocks. Documents and windows vary by query: a mask."""
  _compare(BERT, dataclasses.replace(BERT, attention_kernel="cudnn"), 1e-5, 1e-4, False)
  assert {tuple(sorted(kw)) for _, kw in cudnn_as_xla} == {("key_value_seq_lengths", "scale")}
  assert all(kw["key_value_seq_lengths"] == (3,) for _, kw in cudnn_as_xla)
  cudnn_as_xla.clear()
  _compare(BERT, dataclasses.replace(BERT, attention_kernel="cudnn"), 1e-5, 1e-4, True)
  assert all(kw["mask"] == (3, 1, L, L) for _, kw in cudnn_as_xla), cudnn_as_xla
  cudnn_as_xla.clear()
  modern = MODERN[0]
  _compare(modern, dataclasses.replace(modern, attention_kernel="cudnn"), 1e-5, 1e-4, False)
  kinds = [tuple(sorted(kw)) for _, kw in cudnn_as_xla]
  assert ("key_value_seq_lengths", "scale") in kinds and ("mask", "scale") in kinds, kinds


@pytest.mark.skipif(not GPU, reason="needs an NVIDIA GPU (run with JAX_PLATFORMS=cuda)")
@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_cudnn_on_a_gpu_computes_what_einsum_does(name, packed):
  config = dataclasses.replace(CONFIGS[name], dtype="bfloat16")
  _compare(config, dataclasses.replace(config, attention_kernel="cudnn").validate(),
           2e-2, 5e-2, packed)
