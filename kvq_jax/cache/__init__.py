"""KV caches: per-layer contract (base), dense baseline, shared attention.

Local (sliding-window) layers get ring-buffer caches (`cache/sliding.py`,
`cache/sliding_quantized.py`) wherever a model cache is built here or in
`cache/factory.py`.
"""

from __future__ import annotations

from typing import Callable

import jax.numpy as jnp

from kvq_jax.cache.attention import attention_mask, gqa_attention
from kvq_jax.cache.base import LayerCache, check_capacity
from kvq_jax.cache.dense import DenseLayerCache
from kvq_jax.cache.sliding import SlidingDenseLayerCache
from kvq_jax.models.config import ModelConfig


def init_layer_caches(config: ModelConfig,
                      make_layer: Callable[[int], LayerCache]
                      ) -> list[LayerCache]:
  """One cache per layer: `make_layer(layer_index)` for each decoder layer.

  The single place a whole-model cache is assembled, so per-layer mixed
  kinds (e.g. a dense first layer, quantized others) plug in here.
  """
  return [make_layer(i) for i in range(config.num_layers)]


def dense_layer_cache(config: ModelConfig, index: int, batch_size: int,
                      capacity: int, dtype
                      ) -> DenseLayerCache | SlidingDenseLayerCache:
  """Layer `index`'s full-precision cache: a ring of the layer's window on
  a local layer (`config.layer_window`), else `capacity` linear slots."""
  window = config.layer_window(index)
  if window is None:
    return DenseLayerCache.create(batch_size, capacity, config.num_kv_heads,
                                  config.head_dim, dtype)
  return SlidingDenseLayerCache.create(batch_size, capacity,
                                       config.num_kv_heads, config.head_dim,
                                       dtype, sliding_window=window)


def init_dense_cache(config: ModelConfig, batch_size: int, capacity: int,
                     dtype=None
                     ) -> list[DenseLayerCache | SlidingDenseLayerCache]:
  """A full-precision cache per layer (`dense_layer_cache`); `dtype` None
  means float32."""
  dtype = jnp.float32 if dtype is None else dtype
  return init_layer_caches(
      config, lambda i: dense_layer_cache(config, i, batch_size, capacity,
                                          dtype))


__all__ = [
    "DenseLayerCache", "LayerCache", "SlidingDenseLayerCache",
    "attention_mask", "check_capacity", "dense_layer_cache", "gqa_attention",
    "init_dense_cache", "init_layer_caches",
]
