"""Splash attention (Pallas, `jax.experimental.pallas.ops.tpu.splash_attention`) for padded, packed and sliding-window rows: `config.model.attention_kernel='splash'`.

Splash takes segment ids and a static mask and skips every block of the score matrix
the mask and the segments leave empty. Here:

- segment ids: each real token's document (0 in an unpacked row; packed rows number
  their documents), padding its own segment (PAD_SEGMENT), so padding is never attended
  by a real token and a padded query, which sees only padding, never yields an empty
  softmax row. Padded positions' outputs are not the einsum core's (they attend to
  padding, not to the real tokens), and nothing reads them: losses, features and the
  next layer's real tokens see real positions only.
- the static mask: full (global layers, every BERT layer) or a local window
  |i - j| <= window (ModernBERT's local layers), shared by every head.
- no attention dropout (ModelConfig refuses a nonzero attention_dropout_rate with it).

Mosaic kernels are not partitioned by XLA, so inside a step traced in `sharded_over(mesh)`
(the train and eval steps set it) the call goes through `shard_map`: batch on the mesh's
'data' axis, heads on 'model'. Off TPU the kernel runs
in Pallas' interpret mode (the same program as plain JAX ops: slow, for tests).

Block sizes: min(512, L) for queries and keys (TPU tiles are multiples of 128, so L must
be a multiple of 128 on TPU; interpret mode takes any L that the block divides).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.model import precision

PAD_SEGMENT = 2**30  # padding's segment id: no document ever has it
MAX_BLOCK = 512


def block_size(seq_len: int) -> int:
  """The query and key block of a row of `seq_len` (the kernel's tile)."""
  return min(MAX_BLOCK, seq_len)


@functools.lru_cache(maxsize=64)
def _kernel(seq_len: int, heads: int, window: Optional[int], interpret: bool):
  from jax.experimental.pallas.ops.tpu.splash_attention import (  # pylint: disable=import-outside-toplevel
      splash_attention_kernel as sk, splash_attention_mask as sm)
  shape = (seq_len, seq_len)
  one = (sm.FullMask(shape) if window is None
         else sm.LocalMask(shape, window_size=(window, window), offset=0))
  b = block_size(seq_len)
  sizes = sk.BlockSizes(block_q=b, block_kv=b, block_kv_compute=b, block_q_dkv=b,
                        block_kv_dkv=b, block_kv_dkv_compute=b, block_q_dq=b, block_kv_dq=b)
  # Its mask tables are built as concrete arrays even when first asked for inside a trace:
  # the kernel is cached and reused by every later trace.
  with jax.ensure_compile_time_eval():
    return sk.make_splash_mha(sm.MultiHeadMask([one] * heads), block_sizes=sizes,
                              head_shards=1, q_seq_shards=1, interpret=interpret)


def segment_ids(mask_BxL: jax.Array, documents_BxL: Optional[jax.Array] = None) -> jax.Array:
  """int32 [B, L]: each real token's document (0 unpacked), PAD_SEGMENT for padding."""
  docs_BxL = (jnp.zeros(mask_BxL.shape, jnp.int32) if documents_BxL is None
              else documents_BxL.astype(jnp.int32))
  return jnp.where(mask_BxL > 0, docs_BxL, PAD_SEGMENT)


def attention(q_BxLxHxK: jax.Array, k_BxLxHxK: jax.Array, v_BxLxHxK: jax.Array,
              segments_BxL: jax.Array, window: Optional[int] = None) -> jax.Array:
  """softmax(q k^T) v within each segment (and window), [B, L, H, K]; q already scaled."""
  _, length, heads, _ = q_BxLxHxK.shape
  interpret = precision.target_backend() != "tpu"  # the platform the step is compiled for
  mesh = _mesh()

  def run(q, k, v, seg):
    from jax.experimental.pallas.ops.tpu.splash_attention import (  # pylint: disable=import-outside-toplevel
        splash_attention_kernel as sk)
    kernel = _kernel(length, q.shape[2], window, interpret)
    to_bhlk = lambda x: x.transpose(0, 2, 1, 3)
    ids = sk.SegmentIds(q=seg, kv=seg)
    out = jax.vmap(kernel)(to_bhlk(q), to_bhlk(k), to_bhlk(v), segment_ids=ids)
    return out.transpose(0, 2, 1, 3)

  if mesh is None:
    return run(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, segments_BxL)
  P = jax.sharding.PartitionSpec  # noqa: N806
  data = "data" if "data" in mesh.axis_names else None
  model = "model" if "model" in mesh.axis_names and heads % mesh.shape["model"] == 0 else None
  qkv, seg = P(data, None, model, None), P(data, None)
  return jax.shard_map(run, mesh=mesh, in_specs=(qkv, qkv, qkv, seg), out_specs=qkv,
                       check_vma=False)(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, segments_BxL)


_MESH: list = []  # the mesh of the step being traced (`sharded_over`), innermost last


@contextlib.contextmanager
def sharded_over(mesh) -> Iterator[None]:
  """Inside the block, splash calls go through shard_map over `mesh` (the train and eval
  steps trace their model in it; the model itself knows no mesh)."""
  _MESH.append(mesh)
  try:
    yield
  finally:
    _MESH.pop()


def _mesh():
  """The mesh set by `sharded_over`, or None (one device, or not under a step)."""
  mesh = _MESH[-1] if _MESH else None
  return None if mesh is None or mesh.size == 1 else mesh


def reference(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, segments_BxL, window=None) -> np.ndarray:
  """The same attention with dense masks in float32 (tests)."""
  s = jnp.einsum("bqhk,bshk->bhqs", q_BxLxHxK.astype(jnp.float32),
                 k_BxLxHxK.astype(jnp.float32))
  same = segments_BxL[:, :, None] == segments_BxL[:, None, :]
  if window is not None:
    idx = jnp.arange(q_BxLxHxK.shape[1])
    same = same & (jnp.abs(idx[:, None] - idx[None, :]) <= window)[None]
  p = jax.nn.softmax(jnp.where(same[:, None], s, -1e9), axis=-1)
  return jnp.einsum("bhqs,bshk->bqhk", p, v_BxLxHxK.astype(jnp.float32))
