"""The llama-family decoder: embed -> N pre-norm blocks -> norm -> LM head."""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from kvq_jax import cache as cache_lib
from kvq_jax.cache.base import LayerCache
from kvq_jax.models.attention import Attention
from kvq_jax.models.config import ModelConfig
from kvq_jax.models.layers import RMSNorm, SwiGLU

_EMBED_INIT = nnx.initializers.normal(stddev=0.02)


class DecoderBlock(nnx.Module):
  """x + attn(norm(x)), then x + mlp(norm(x))."""

  def __init__(self, config: ModelConfig, *, dtype=jnp.float32,
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    kw = dict(dtype=dtype, param_dtype=param_dtype)
    self.attn_norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps, **kw)
    self.attn = Attention(config, rngs=rngs, **kw)
    self.mlp_norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps, **kw)
    self.mlp = SwiGLU(config.hidden_size, config.intermediate_size,
                      rngs=rngs, **kw)

  def __call__(self, x_BxTxD: jax.Array, positions_BxT: jax.Array,
               layer_cache: LayerCache) -> tuple[jax.Array, LayerCache]:
    attn_out, new_cache = self.attn(self.attn_norm(x_BxTxD), positions_BxT,
                                    layer_cache)
    x_BxTxD = x_BxTxD + attn_out
    x_BxTxD = x_BxTxD + self.mlp(self.mlp_norm(x_BxTxD))
    return x_BxTxD, new_cache


class Decoder(nnx.Module):
  """Decoder-only LM; `__call__` returns float32 logits and the new cache."""

  def __init__(self, config: ModelConfig, *, dtype=jnp.float32,
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    self.config = config
    self.dtype = dtype
    self.param_dtype = param_dtype
    kw = dict(dtype=dtype, param_dtype=param_dtype)
    self.embed = nnx.Param(_EMBED_INIT(
        rngs.params(), (config.vocab_size, config.hidden_size), param_dtype))
    self.layers = nnx.List(
        [DecoderBlock(config, rngs=rngs, **kw)
         for _ in range(config.num_layers)])
    self.final_norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps,
                              **kw)
    self.lm_head = (None if config.tie_embeddings else nnx.Param(_EMBED_INIT(
        rngs.params(), (config.hidden_size, config.vocab_size), param_dtype)))

  def __call__(self, tokens_BxT: jax.Array, positions_BxT: jax.Array,
               cache: Sequence[LayerCache]
               ) -> tuple[jax.Array, list[LayerCache]]:
    if len(cache) != self.config.num_layers:
      raise ValueError(
          f"Decoder: cache has {len(cache)} layer caches; the model has "
          f"num_layers={self.config.num_layers}.")
    if tokens_BxT.shape != positions_BxT.shape:
      raise ValueError(
          f"Decoder: tokens shape {tokens_BxT.shape} != positions shape "
          f"{positions_BxT.shape}; both must be [B, T].")
    x_BxTxD = jnp.take(self.embed[...], tokens_BxT, axis=0).astype(self.dtype)
    new_cache = []
    for block, layer_cache in zip(self.layers, cache):
      x_BxTxD, layer_cache = block(x_BxTxD, positions_BxT, layer_cache)
      new_cache.append(layer_cache)
    x_BxTxD = self.final_norm(x_BxTxD)
    if self.lm_head is None:
      logits = jnp.einsum("btd,vd->btv", x_BxTxD,
                          self.embed[...].astype(self.dtype),
                          preferred_element_type=jnp.float32)
    else:
      logits = jnp.einsum("btd,dv->btv", x_BxTxD,
                          self.lm_head[...].astype(self.dtype),
                          preferred_element_type=jnp.float32)
    return logits.astype(jnp.float32), new_cache

  def init_cache(self, batch_size: int, capacity: int,
                 dtype=None) -> list[LayerCache]:
    """An empty dense cache; `dtype` None means the compute dtype."""
    return cache_lib.init_dense_cache(
        self.config, batch_size, capacity,
        self.dtype if dtype is None else dtype)
