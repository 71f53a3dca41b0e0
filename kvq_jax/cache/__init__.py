"""KV caches: per-layer contract (base), dense baseline, shared attention."""

from __future__ import annotations

from typing import Callable

import jax.numpy as jnp

from kvq_jax.cache.attention import attention_mask, gqa_attention
from kvq_jax.cache.base import LayerCache, check_capacity
from kvq_jax.cache.dense import DenseLayerCache
from kvq_jax.models.config import ModelConfig


def init_layer_caches(config: ModelConfig,
                      make_layer: Callable[[int], LayerCache]
                      ) -> list[LayerCache]:
  """One cache per layer: `make_layer(layer_index)` for each decoder layer.

  The single place a whole-model cache is assembled, so per-layer mixed
  kinds (e.g. a dense first layer, quantized others) plug in here.
  """
  return [make_layer(i) for i in range(config.num_layers)]


def init_dense_cache(config: ModelConfig, batch_size: int, capacity: int,
                     dtype=None) -> list[DenseLayerCache]:
  """A DenseLayerCache per layer; `dtype` None means float32."""
  dtype = jnp.float32 if dtype is None else dtype
  return init_layer_caches(
      config, lambda _: DenseLayerCache.create(
          batch_size, capacity, config.num_kv_heads, config.head_dim, dtype))


__all__ = [
    "DenseLayerCache", "LayerCache", "attention_mask", "check_capacity",
    "gqa_attention", "init_dense_cache", "init_layer_caches",
]
