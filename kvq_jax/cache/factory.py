"""Building a whole model's cache: one layer cache per decoder layer."""

from __future__ import annotations

import jax.numpy as jnp

from kvq_jax.cache import dense_layer_cache, init_layer_caches
from kvq_jax.cache.quantized import QuantizedLayerCache
from kvq_jax.cache.sliding_quantized import SlidingQuantizedLayerCache
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.models.config import ModelConfig


def init_cache(config: ModelConfig, batch_size: int, capacity: int,
               spec: CacheSpec | None = None, dtype=jnp.float32) -> list:
  """Per-layer caches: dense where a layer is full precision, else quantized.

  `dtype` is the full-precision dtype (the dense baseline's storage and what
  the quantized cache quantizes from); the quantized cache's sink/residual
  buffers use `spec.window_dtype`. A layer override naming a layer the
  model does not have is a ValueError.

  A sliding-window layer (`config.layer_window(i)` not None) gets the ring
  buffer of its kind, `SlidingDenseLayerCache` or
  `SlidingQuantizedLayerCache` (without sinks), sized by the window, not
  by `capacity`; global layers get the linear caches of size `capacity`.
  """
  if spec is not None:
    spec.check_num_layers(config.num_layers)
  return init_layer_caches(config, lambda i: layer_cache(
      config, i, batch_size, capacity, spec, dtype))


def layer_cache(config: ModelConfig, index: int, batch_size: int,
                capacity: int, spec: CacheSpec | None = None,
                dtype=jnp.float32):
  """Layer `index`'s cache, as `init_cache` builds it."""
  layer = None if spec is None else spec.layer(index)
  if layer is None or layer.is_full_precision:
    return dense_layer_cache(config, index, batch_size, capacity, dtype)
  window = config.layer_window(index)
  if window is None:
    return QuantizedLayerCache.create(layer, batch_size, capacity,
                                      config.num_kv_heads, config.head_dim,
                                      dtype)
  return SlidingQuantizedLayerCache.create(
      layer, batch_size, capacity, config.num_kv_heads, config.head_dim,
      dtype, sliding_window=window)
