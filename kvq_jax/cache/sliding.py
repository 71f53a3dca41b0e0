"""Sliding-window (local-attention) KV caches: a ring buffer per layer.

On a local layer of window W (Gemma 3: `ModelConfig.local_layers`,
`sliding_window`), query token i sees only the tokens j with
i - W < j <= i. Such a layer never needs a token older than its window, so
its cache holds a ring buffer of R slots whose size does not depend on the
context or the capacity: token j lives in slot j mod R, overwriting token
j - R. `init_cache` / `init_dense_cache` build one for every local layer
(`ModelConfig.layer_window(i)`); global layers keep the linear caches.

Each `attend` call with T new tokens (old length n0, new length n1 = n0 + T)
  1. attends over the old ring followed by the T new tokens: every key
     carries its token index (a slot not yet written has a negative one) and
     query token i = n0 + t sees exactly the keys with
     max(0, i - W + 1) <= j <= i (`attention.band_mask`). Before the write
     the ring still holds every token the chunk's first query needs, so a
     chunk of any T (even T > R) gives the same result as T single steps;
     the [R + T] keys of the chunk are the only transient room it takes;
  2. writes the new tokens: slot r receives the newest token j in [n0, n1)
     with j = r mod R, if any (a gather, so a chunk longer than the ring
     keeps only its last R tokens, deterministically).
`length_B` counts every token written (it is the next token's index and
position); a ring never overflows, so `check_capacity` skips these layers.
`capacity` is kept (static) only as the capacity the model was built with.

This module holds the index arithmetic shared by the ring caches and the
full-precision one, `SlidingDenseLayerCache` (R = W). The quantized one is
`cache/sliding_quantized.py`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from kvq_jax.cache.attention import band_mask, gqa_attention
from kvq_jax.cache.dense import check_dense_args
from kvq_jax.models.rope import Rope


def check_window(sliding_window, where: str) -> None:
  """ValueError unless `sliding_window` is a positive integer."""
  if (not isinstance(sliding_window, int) or isinstance(sliding_window, bool)
      or sliding_window < 1):
    raise ValueError(
        f"{where}.sliding_window={sliding_window!r}: must be a positive "
        "integer (the number of tokens a local layer's query sees).")


def ring_tokens(end: jax.Array, size: int) -> jax.Array:
  """Token held by each of `size` ring slots once tokens [0, end) were
  written, [..., size]: the newest j < end with j = slot mod size (negative
  where no token was written yet). `end` is a scalar or [B]."""
  end = jnp.asarray(end, jnp.int32)[..., None]
  slots = jnp.arange(size, dtype=jnp.int32)
  return end - 1 - jnp.mod(end - 1 - slots, size)


def ring_update(ring: jax.Array, new: jax.Array, start: jax.Array,
                end: jax.Array, axis: int) -> jax.Array:
  """`ring` with tokens [start, end) written, for one sequence.

  Args:
    ring: the ring, its slots along `axis` (the token of slot r is r mod
      size, see `ring_tokens`).
    new: new[..., i, ...] (along `axis`) holds token start + i; it may be
      longer than end - start (the rest is ignored).
    start, end: int32 scalars, the token range written.
    axis: the slot / token axis of both arrays.

  Returns:
    The updated ring, in ring's dtype: a slot whose newest token (below
    `end`) is >= start takes it from `new`, the others keep their token.
  """
  size = ring.shape[axis]
  tok_R = ring_tokens(end, size)
  index_R = jnp.clip(tok_R - start, 0, new.shape[axis] - 1)
  gathered = jnp.take(new, index_R, axis=axis).astype(ring.dtype)
  shape = [1] * ring.ndim
  shape[axis] = size
  take = jnp.reshape(tok_R >= start, shape)
  return jnp.where(take, gathered, ring)


@struct.dataclass
class SlidingDenseLayerCache:
  """A full-precision local layer: keys (post-RoPE) and values of its last
  W tokens in a ring, [B, R = W, K, H] (module docstring)."""

  k_BxRxKxH: jax.Array
  v_BxRxKxH: jax.Array
  length_B: jax.Array  # int32 [B]: tokens written (not capped at R).
  capacity: int = struct.field(pytree_node=False)
  sliding_window: int = struct.field(pytree_node=False)

  @classmethod
  def create(cls, batch_size: int, capacity: int, num_kv_heads: int,
             head_dim: int, dtype=jnp.float32, *,
             sliding_window: int) -> SlidingDenseLayerCache:
    """Arguments as `DenseLayerCache.create` (validated the same way); the
    ring has `sliding_window` slots whatever the capacity."""
    dtype = check_dense_args(batch_size, capacity, num_kv_heads, head_dim,
                             dtype, "SlidingDenseLayerCache")
    check_window(sliding_window, "SlidingDenseLayerCache")
    shape = (batch_size, sliding_window, num_kv_heads, head_dim)
    return cls(k_BxRxKxH=jnp.zeros(shape, dtype),
               v_BxRxKxH=jnp.zeros(shape, dtype),
               length_B=jnp.zeros((batch_size,), jnp.int32),
               capacity=capacity, sliding_window=sliding_window)

  @property
  def dtype(self) -> jnp.dtype:
    return self.k_BxRxKxH.dtype

  @property
  def ring_slots(self) -> int:
    """R: tokens the ring holds (= the window)."""
    return self.k_BxRxKxH.shape[1]

  def attend(self, q_BxTxNxH: jax.Array, k_BxTxKxH: jax.Array,
             v_BxTxKxH: jax.Array, positions_BxT: jax.Array,
             rope: Rope) -> tuple[jax.Array, SlidingDenseLayerCache]:
    """Attends over [old ring, new tokens] in the window, then writes."""
    t = q_BxTxNxH.shape[1]
    k_new_BxTxKxH = rope(k_BxTxKxH, positions_BxT).astype(self.dtype)
    v_new_BxTxKxH = v_BxTxKxH.astype(self.dtype)
    n0_B = self.length_B
    query_tok_BxT = n0_B[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
    key_tok_BxL = jnp.concatenate(
        [ring_tokens(n0_B, self.ring_slots), query_tok_BxT], axis=1)
    k_BxLxKxH = jnp.concatenate([self.k_BxRxKxH, k_new_BxTxKxH], axis=1)
    v_BxLxKxH = jnp.concatenate([self.v_BxRxKxH, v_new_BxTxKxH], axis=1)
    mask_BxTxL = band_mask(key_tok_BxL, query_tok_BxT, self.sliding_window)
    out_BxTxNxH = gqa_attention(q_BxTxNxH, k_BxLxKxH, v_BxLxKxH, mask_BxTxL)
    write = jax.vmap(lambda ring, new, n0: ring_update(ring, new, n0, n0 + t,
                                                       axis=0))
    return out_BxTxNxH, self.replace(
        k_BxRxKxH=write(self.k_BxRxKxH, k_new_BxTxKxH, n0_B),
        v_BxRxKxH=write(self.v_BxRxKxH, v_new_BxTxKxH, n0_B),
        length_B=n0_B + t)
