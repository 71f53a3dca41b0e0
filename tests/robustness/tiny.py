"""Tiny models and cache specs shared by the robustness tests."""

from __future__ import annotations

import functools

from kvq_jax.cache.spec import CacheSpec
from kvq_jax.models.config import ModelConfig
from kvq_jax.models.params import decoder_from_params, random_params
from kvq_jax.models.runtime import Runtime
from kvq_jax.quant import QuantSpec

CONFIG = ModelConfig(vocab_size=61, hidden_size=32, intermediate_size=64,
                     num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                     name="llama")
INT4_G8 = QuantSpec("int4", "symmetric", "per_group", 8)
# Layer 0 dense, layer 1 int4 with sink and residual window: every leaf kind.
MIXED = CacheSpec(k=INT4_G8, v=INT4_G8, layer_overrides=((0, None, None),),
                  residual=3, sink=2, block_size=16)
INT4 = CacheSpec(k=INT4_G8, v=INT4_G8, block_size=16)


@functools.lru_cache(maxsize=None)
def runtime(seed: int = 0) -> Runtime:
  return Runtime(decoder_from_params(CONFIG, random_params(CONFIG, seed,
                                                           scale=0.1)))
