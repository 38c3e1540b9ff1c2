"""The peers of the benchmark: Hugging Face BERT in Flax and in PyTorch.

Each runner builds the same model size as ours from the same batch
(`cases.make_batch`) and returns the timing dict `tools.bench` reads.
transformers and torch are optional: imported inside the runners, which
`tools.bench` only calls when they are installed.

Two forms of each train step: as shipped (`BertForPreTraining` computes the MLM
head's vocabulary logits at every position, and the loss keeps the masked ones),
and `masked=True`, what a skilled user writes for speed: the encoder and pooler,
then the MLM head on the masked positions only (as ours does). PyTorch's reduced
precision is `torch.autocast(dtype=torch.bfloat16)`, its standard mixed precision;
HF Flax's is the model's `dtype` argument.

Shape legend: B batch, L sequence length, P masked positions per sequence, H hidden.
"""

from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bert_jax.train import optim
from tools import cases, measure
from tools.cases import Case, ModelSize


def _hf_config(size: ModelSize, dropout: bool = True):
  from transformers import BertConfig as HFBertConfig
  return HFBertConfig(
      vocab_size=size.vocab_size, hidden_size=size.hidden_size,
      num_hidden_layers=size.num_layers, num_attention_heads=size.num_heads,
      intermediate_size=size.intermediate_size, max_position_embeddings=512,
      hidden_dropout_prob=0.1 if dropout else 0.0,
      attention_probs_dropout_prob=0.1 if dropout else 0.0,
      layer_norm_eps=1e-12, hidden_act="gelu")


def _masked_positions(labels_BxL: np.ndarray) -> np.ndarray:
  """[B, P] positions of the predicted tokens (`cases.make_batch` masks P per sequence)."""
  rows, cols = np.nonzero(labels_BxL >= 0)
  return cols.reshape(labels_BxL.shape[0], -1).astype(np.int32)


def _flax_masked_logits(module, b, deterministic: bool):
  """FlaxBertForPreTraining's forward with the MLM head on the masked positions only."""
  ids_BxL = b["masked_ids"]
  B, L = ids_BxL.shape
  out = module.bert(ids_BxL, b["input_mask"], b["segment_ids"],
                    jnp.broadcast_to(jnp.arange(L), (B, L)), None,
                    deterministic=deterministic, return_dict=True)
  h_BxPxH = jnp.take_along_axis(out.last_hidden_state, b["positions_BxP"][..., None], axis=1)
  shared = module.bert.variables["params"]["embeddings"]["word_embeddings"]["embedding"]
  return module.cls(h_BxPxH, out.pooler_output, shared_embedding=shared)


def flax_loss(model, params, b: dict, key, masked: bool, train: bool = True):
  """MLM (mean over masked positions) + NSP loss of FlaxBertForPreTraining."""
  if masked:
    mlm_logits, nsp_logits = model.module.apply(
        {"params": params}, b, not train, method=_flax_masked_logits, rngs={"dropout": key})
    labels = b["labels_BxP"]
  else:
    out = model(b["masked_ids"], attention_mask=b["input_mask"],
                token_type_ids=b["segment_ids"], params=params, train=train, dropout_rng=key)
    mlm_logits, nsp_logits = out.prediction_logits, out.seq_relationship_logits
    labels = b["mlm_labels"]
  w = (labels >= 0).astype(jnp.float32)
  nll = optax.softmax_cross_entropy_with_integer_labels(
      mlm_logits.astype(jnp.float32), jnp.maximum(labels, 0))
  mlm = (nll * w).sum() / jnp.maximum(w.sum(), 1.0)
  nsp = optax.softmax_cross_entropy_with_integer_labels(
      nsp_logits.astype(jnp.float32), b["next_sentence_label"]).mean()
  return mlm + nsp


def flax_batch(case: Case, vocab_size: int, masked: bool) -> dict:
  host = cases.make_batch(case, vocab_size)
  if masked:
    host["positions_BxP"] = _masked_positions(host["mlm_labels"])
    host["labels_BxP"] = np.take_along_axis(host["mlm_labels"], host["positions_BxP"], axis=1)
  return {k: jax.device_put(v) for k, v in host.items()}


def run_hf_flax(case: Case, size: ModelSize, dtype: str, warmup: int, steps: int,
                masked: bool = False) -> dict:
  from transformers import FlaxBertForPreTraining, FlaxBertModel

  jdtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[dtype]
  mem = measure.Memory("jax")
  batch = flax_batch(case, size.vocab_size, masked)
  cls = FlaxBertForPreTraining if case.kind == "train" else FlaxBertModel
  # _do_init=False + a jitted init: HF's eager init takes minutes for BERT-Base.
  model = cls(_hf_config(size), seed=0, dtype=jdtype, _do_init=False)
  params = jax.jit(lambda k: model.init_weights(k, (1, 8)))(jax.random.key(0))
  if case.kind == "train":
    tx = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(1e-4, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01,
                    mask=optim.decay_mask))
    opt_state = jax.jit(tx.init)(params)

    def train_step(params, opt_state, key, b):
      def loss_fn(p):
        return flax_loss(model, p, b, key, masked)
      loss, grads = jax.value_and_grad(loss_fn)(params)
      updates, opt_state = tx.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state, loss

    key = jax.random.key(1)
    t = time.perf_counter()
    compiled = jax.jit(train_step, donate_argnums=(0, 1)).lower(
        params, opt_state, key, batch).compile()
    compile_s = time.perf_counter() - t
    state = [params, opt_state]

    def step(i):
      state[0], state[1], loss = compiled(state[0], state[1], jax.random.fold_in(key, i), batch)
      jax.block_until_ready((state, loss))
  else:
    def extract(p, b):
      out = model(b["input_ids"], attention_mask=b["input_mask"],
                  token_type_ids=b["segment_ids"], params=p, train=False)
      return out.last_hidden_state, out.pooler_output

    t = time.perf_counter()
    compiled = jax.jit(extract).lower(params, batch).compile()
    compile_s = time.perf_counter() - t

    def step(i):
      jax.block_until_ready(compiled(params, batch))
  return {**measure.time_steps(step, warmup, steps), "compile_s": compile_s,
          "peak_mem_bytes": mem.peak(), "mem_kind": mem.kind,
          "compile_note": "jit lower + compile"}


def torch_loss(model, b: dict, masked: bool):
  """MLM (mean over masked positions) + NSP loss of a transformers BertForPreTraining."""
  import torch.nn.functional as F
  if not masked:
    return model(b["masked_ids"], attention_mask=b["input_mask"],
                 token_type_ids=b["segment_ids"], labels=b["mlm_labels"],
                 next_sentence_label=b["next_sentence_label"]).loss
  chosen_BxL = b["mlm_labels"] >= 0  # N = B * P masked positions
  seq_BxLxH, pooled_BxH = model.bert(b["masked_ids"], attention_mask=b["input_mask"],
                                     token_type_ids=b["segment_ids"], return_dict=False)[:2]
  mlm_NxV = model.cls.predictions(seq_BxLxH[chosen_BxL])
  nsp_Bx2 = model.cls.seq_relationship(pooled_BxH)
  return (F.cross_entropy(mlm_NxV.float(), b["mlm_labels"][chosen_BxL])
          + F.cross_entropy(nsp_Bx2.float(), b["next_sentence_label"]))


def run_hf_torch(case: Case, size: ModelSize, dtype: str, warmup: int, steps: int,
                 masked: bool = False, compiled: bool = False) -> dict:
  """One PyTorch peer; `compiled`: the loss (train) or the model (features) under
  torch.compile, whose first step compiles (reported as the compile time)."""
  import torch
  from transformers import BertForPreTraining as TorchBertForPreTraining
  from transformers import BertModel as TorchBertModel

  torch.set_num_threads(os.cpu_count() or 1)
  torch.manual_seed(0)
  device = "cuda" if torch.cuda.is_available() else "cpu"
  tdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
  mem = measure.Memory("torch")
  b = {k: torch.from_numpy(v.astype(np.int64)).to(device)
       for k, v in cases.make_batch(case, size.vocab_size).items()}
  if case.kind == "train":
    model = TorchBertForPreTraining(_hf_config(size)).to(device).train()
    no_decay = [p for n, p in model.named_parameters() if "bias" in n or "LayerNorm" in n]
    decay = [p for n, p in model.named_parameters() if not ("bias" in n or "LayerNorm" in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.999), eps=1e-6)

    loss_fn = torch.compile(torch_loss) if compiled else torch_loss

    def step(i):
      with torch.autocast(device, dtype=tdtype, enabled=tdtype != torch.float32):
        value = loss_fn(model, b, masked)
      value.backward()
      torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
      opt.step()
      opt.zero_grad(set_to_none=True)
      if device == "cuda":
        torch.cuda.synchronize()
  else:
    model = TorchBertModel(_hf_config(size)).to(device).eval()
    if compiled:
      model = torch.compile(model)

    def step(i):
      with torch.inference_mode(), torch.autocast(device, dtype=tdtype,
                                                 enabled=tdtype != torch.float32):
        model(b["input_ids"], attention_mask=b["input_mask"], token_type_ids=b["segment_ids"])
      if device == "cuda":
        torch.cuda.synchronize()
  # Eager: no compile; the first step's extra time over the median is reported. Under
  # torch.compile that first step is where it compiles.
  t = time.perf_counter()
  step(-1)
  first = time.perf_counter() - t
  timing = measure.time_steps(step, max(0, warmup - 1), steps)
  return {**timing, "compile_s": max(0.0, first - timing["median_s"]),
          "peak_mem_bytes": mem.peak(), "mem_kind": mem.kind,
          "compile_note": ("torch.compile (first step minus median)" if compiled
                           else "eager (first step minus median)")}
