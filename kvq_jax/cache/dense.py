"""Full-precision (float32 / bfloat16 / float16) KV cache: the baseline.

Keys are stored *after* RoPE, so reading them back needs no rotation. The
storage dtype may differ from the compute dtype; keys/values are cast to it
when written, which is exactly the rounding a bf16/fp16 cache introduces.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from kvq_jax.cache.attention import (attention_mask,
                                     causal_blockwise_attention,
                                     gqa_attention)
from kvq_jax.models.rope import Rope

_ALLOWED_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)
# A cache of more slots than this is read block by block, up to the tokens
# it holds (`causal_blockwise_attention`); a smaller one in one softmax.
ATTENTION_BLOCK = 512


def write_slots(buffer_BxSxKxH: jax.Array, new_BxTxKxH: jax.Array,
                start_B: jax.Array) -> jax.Array:
  """Writes new_BxTxKxH at slots [start_b, start_b + T) of each sequence b."""
  def write_one(buffer_SxKxH, new_TxKxH, start):
    return jax.lax.dynamic_update_slice(
        buffer_SxKxH, new_TxKxH.astype(buffer_SxKxH.dtype),
        (start, jnp.int32(0), jnp.int32(0)))
  return jax.vmap(write_one)(buffer_BxSxKxH, new_BxTxKxH,
                             start_B.astype(jnp.int32))


def check_dense_args(batch_size: int, capacity: int, num_kv_heads: int,
                     head_dim: int, dtype, where: str) -> jnp.dtype:
  """ValueError naming `where` for a bad argument; returns the dtype."""
  for name, value in (("batch_size", batch_size), ("capacity", capacity),
                      ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
      raise ValueError(
          f"{where}.{name}={value!r}: must be a positive integer.")
  dtype = jnp.dtype(dtype)
  if dtype not in [jnp.dtype(d) for d in _ALLOWED_DTYPES]:
    raise ValueError(
        f"{where}.dtype={dtype}: allowed are float32, bfloat16, float16.")
  return dtype


@struct.dataclass
class DenseLayerCache:
  """One layer's keys (post-RoPE) and values, [B, S=capacity, K, H]."""

  k_BxSxKxH: jax.Array
  v_BxSxKxH: jax.Array
  length_B: jax.Array  # int32 [B]
  capacity: int = struct.field(pytree_node=False)

  @classmethod
  def create(cls, batch_size: int, capacity: int, num_kv_heads: int,
             head_dim: int, dtype=jnp.float32) -> DenseLayerCache:
    dtype = check_dense_args(batch_size, capacity, num_kv_heads, head_dim,
                             dtype, "DenseLayerCache")
    shape = (batch_size, capacity, num_kv_heads, head_dim)
    return cls(k_BxSxKxH=jnp.zeros(shape, dtype),
               v_BxSxKxH=jnp.zeros(shape, dtype),
               length_B=jnp.zeros((batch_size,), jnp.int32),
               capacity=capacity)

  @property
  def dtype(self) -> jnp.dtype:
    return self.k_BxSxKxH.dtype

  def attend(self, q_BxTxNxH: jax.Array, k_BxTxKxH: jax.Array,
             v_BxTxKxH: jax.Array, positions_BxT: jax.Array,
             rope: Rope) -> tuple[jax.Array, DenseLayerCache]:
    """Writes the T new tokens, then attends over the whole cache."""
    return write_and_attend(self, q_BxTxNxH, rope(k_BxTxKxH, positions_BxT),
                            v_BxTxKxH)


def write_and_attend(cache, q_BxTxNxH: jax.Array, k_BxTxKxH: jax.Array,
                     v_BxTxKxH: jax.Array, window: int | None = None):
  """Stores K (already rotated) / V at slots [length_b, length_b + T) of a
  dense-layout cache (fields k_BxSxKxH, v_BxSxKxH, length_B, capacity), then
  attends over every slot (only the last `window` tokens of each query with
  a sliding window); returns (out_BxTxNxH, the updated cache). Without a
  window, a cache of more than ATTENTION_BLOCK slots is read block by block
  up to the tokens it holds, so a step costs what the cache holds, not its
  capacity."""
  num_new = q_BxTxNxH.shape[1]
  k_all = write_slots(cache.k_BxSxKxH, k_BxTxKxH, cache.length_B)
  v_all = write_slots(cache.v_BxSxKxH, v_BxTxKxH, cache.length_B)
  if window is None and cache.capacity > ATTENTION_BLOCK:
    out_BxTxNxH = causal_blockwise_attention(
        q_BxTxNxH, k_all, v_all, cache.length_B, ATTENTION_BLOCK)
  else:
    mask_BxTxS = attention_mask(cache.length_B, num_new, cache.capacity,
                                window)
    out_BxTxNxH = gqa_attention(q_BxTxNxH, k_all, v_all, mask_BxTxS)
  return out_BxTxNxH, cache.replace(k_BxSxKxH=k_all, v_BxSxKxH=v_all,
                                    length_B=cache.length_B + num_new)
