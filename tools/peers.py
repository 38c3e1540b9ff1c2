"""The peers of the benchmark: Hugging Face BERT in Flax and in PyTorch.

Each runner builds the same model size as ours from the same batch
(`cases.make_batch`) and returns the timing dict `tools.bench` reads.
transformers and torch are optional: imported inside the runners, which
`tools.bench` only calls when they are installed.
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


def run_hf_flax(case: Case, size: ModelSize, dtype: str, warmup: int, steps: int) -> dict:
  from transformers import FlaxBertForPreTraining, FlaxBertModel

  jdtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[dtype]
  mem = measure.Memory("jax")
  batch = {k: jax.device_put(v) for k, v in cases.make_batch(case, size.vocab_size).items()}
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
        out = model(b["masked_ids"], attention_mask=b["input_mask"],
                    token_type_ids=b["segment_ids"], params=p, train=True, dropout_rng=key)
        labels_BxL = b["mlm_labels"]
        w_BxL = (labels_BxL >= 0).astype(jnp.float32)
        nll_BxL = optax.softmax_cross_entropy_with_integer_labels(
            out.prediction_logits.astype(jnp.float32), jnp.maximum(labels_BxL, 0))
        mlm = (nll_BxL * w_BxL).sum() / jnp.maximum(w_BxL.sum(), 1.0)
        nsp = optax.softmax_cross_entropy_with_integer_labels(
            out.seq_relationship_logits.astype(jnp.float32), b["next_sentence_label"]).mean()
        return mlm + nsp
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


def run_hf_torch(case: Case, size: ModelSize, dtype: str, warmup: int, steps: int) -> dict:
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

    def step(i):
      with torch.autocast(device, dtype=tdtype, enabled=tdtype != torch.float32):
        out = model(b["masked_ids"], attention_mask=b["input_mask"],
                    token_type_ids=b["segment_ids"], labels=b["mlm_labels"],
                    next_sentence_label=b["next_sentence_label"])
      out.loss.backward()
      torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
      opt.step()
      opt.zero_grad(set_to_none=True)
      if device == "cuda":
        torch.cuda.synchronize()
  else:
    model = TorchBertModel(_hf_config(size)).to(device).eval()

    def step(i):
      with torch.inference_mode(), torch.autocast(device, dtype=tdtype,
                                                 enabled=tdtype != torch.float32):
        model(b["input_ids"], attention_mask=b["input_mask"], token_type_ids=b["segment_ids"])
      if device == "cuda":
        torch.cuda.synchronize()
  # Eager: no compile. The first step's extra time over the median is reported.
  t = time.perf_counter()
  step(-1)
  first = time.perf_counter() - t
  timing = measure.time_steps(step, max(0, warmup - 1), steps)
  return {**timing, "compile_s": max(0.0, first - timing["median_s"]),
          "peak_mem_bytes": mem.peak(), "mem_kind": mem.kind,
          "compile_note": "eager (first step minus median)"}
