"""The contract every per-layer KV cache satisfies.

The decoder never touches cache internals. For each layer it calls

    out_BxTxNxH, new_layer_cache = layer_cache.attend(
        q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, positions_BxT, rope)

where `q` is already rotated by RoPE, `k` is *not* (so a cache may quantize
keys before RoPE and rotate after dequantization, as KVQuant does), `v` is the
plain value projection, and `rope` is the static `models.rope.Rope`.

Semantics (llama.cpp's): the T new tokens are first written into the cache at
slots [length_b, length_b + T) of each sequence b -- quantized, if the cache
quantizes -- and the attention then reads *every* key/value, the new ones
included, back from the cache. The query at chunk index t sees slots
s <= length_b + t (causal). The returned cache has length_b + T.
Writing past `capacity` is an error (checked eagerly by `check_capacity`).

Sliding-window (local) layers narrow the visibility to the band
length_b + t - W < s <= length_b + t and hold only their window, in a ring
buffer (`cache/sliding.py`): such a cache has a `sliding_window` attribute
W (absent or None on a global layer's cache), never overflows, and is
skipped by `check_capacity`. Its `length_B` still counts every token.

A layer cache is a pytree (`flax.struct.dataclass`): arrays are leaves;
capacity, dtypes and quantization specs are static fields, so caches of
different kinds (per-layer mixed precision) compile to different programs and a
list of them is itself a pytree: `cache = [layer_0_cache, layer_1_cache, ...]`.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import jax
import numpy as np

from kvq_jax.models.rope import Rope


class LayerCache(Protocol):
  capacity: int
  length_B: jax.Array  # int32 [B]: tokens written per sequence.

  def attend(self, q_BxTxNxH: jax.Array, k_BxTxKxH: jax.Array,
             v_BxTxKxH: jax.Array, positions_BxT: jax.Array,
             rope: Rope) -> tuple[jax.Array, "LayerCache"]:
    ...


def check_capacity(cache: Sequence[LayerCache], num_new_tokens: int) -> None:
  """Raises ValueError if writing `num_new_tokens` would overflow any layer.

  Call outside `jit` (it reads the concrete lengths); the jitted step itself
  never wraps around or clamps. Sliding-window layers (ring buffers) are
  skipped: they never overflow.
  """
  for i, layer in enumerate(cache):
    if getattr(layer, "sliding_window", None) is not None:
      continue
    longest = int(np.max(np.asarray(layer.length_B)))
    if longest + num_new_tokens > layer.capacity:
      raise ValueError(
          f"KV cache overflow at layer {i}: {longest} tokens stored + "
          f"{num_new_tokens} new > capacity {layer.capacity}. Allocate a "
          "larger cache with init_cache(..., capacity=N).")
