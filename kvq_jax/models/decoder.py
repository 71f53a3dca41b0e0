"""The llama-family decoder: embed -> N pre-norm blocks -> norm -> LM head.

`Decoder` is also the base of other architectures (`models.gemma3`): a
subclass overrides `make_block` (its block type) and `embed_scale`; the
token loop, the LM head (tied or not, optional final-logit soft-capping)
and `init_cache` are shared.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from kvq_jax.cache.base import LayerCache
from kvq_jax.cache.factory import init_cache as init_model_cache
from kvq_jax.models.attention import Attention
from kvq_jax.models.config import ModelConfig
from kvq_jax.models.layers import GatedMLP, RMSNorm
from kvq_jax.models.rope import Rope

_EMBED_INIT = nnx.initializers.normal(stddev=0.02)


def layer_rope(config: ModelConfig, index: int) -> Rope:
  """The RoPE of layer `index` (its own base on local layers)."""
  return Rope(theta=float(config.layer_rope_theta(index)),
              rotary_dim=config.rotary_dim)


class DecoderBlock(nnx.Module):
  """x + attn(norm(x)), then x + mlp(norm(x))."""

  def __init__(self, config: ModelConfig, index: int = 0, *,
               dtype=jnp.float32, param_dtype=jnp.float32, rngs: nnx.Rngs):
    kw = dict(dtype=dtype, param_dtype=param_dtype)
    self.attn_norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps, **kw)
    self.attn = Attention(config, rope=layer_rope(config, index), rngs=rngs,
                          **kw)
    self.mlp_norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps, **kw)
    self.mlp = GatedMLP(config.hidden_size, config.intermediate_size,
                        activation="silu", rngs=rngs, **kw)

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
        [self.make_block(config, i, rngs=rngs, **kw)
         for i in range(config.num_layers)])
    self.final_norm = self.make_norm(config.hidden_size, **kw)
    self.lm_head = (None if config.tie_embeddings else nnx.Param(_EMBED_INIT(
        rngs.params(), (config.hidden_size, config.vocab_size), param_dtype)))

  def make_block(self, config: ModelConfig, index: int, *, dtype,
                 param_dtype, rngs: nnx.Rngs) -> nnx.Module:
    """Block `index`: called (x_BxTxD, positions_BxT, layer_cache)."""
    return DecoderBlock(config, index, dtype=dtype, param_dtype=param_dtype,
                        rngs=rngs)

  def make_norm(self, dim: int, *, dtype, param_dtype) -> RMSNorm:
    """The final norm's type."""
    return RMSNorm(dim, eps=self.config.rms_norm_eps, dtype=dtype,
                   param_dtype=param_dtype)

  def embed_scale(self) -> float | None:
    """Multiplier of the token embeddings (None: none)."""
    return None

  def __call__(self, tokens_BxT: jax.Array, positions_BxT: jax.Array,
               cache: Sequence[LayerCache]
               ) -> tuple[jax.Array, list[LayerCache]]:
    """(float32 logits [B, T, V], the updated cache)."""
    x_BxTxD, new_cache = self.hidden(tokens_BxT, positions_BxT, cache)
    return self.logits(x_BxTxD), new_cache

  def hidden(self, tokens_BxT: jax.Array, positions_BxT: jax.Array,
             cache: Sequence[LayerCache]
             ) -> tuple[jax.Array, list[LayerCache]]:
    """(final-normed hidden states [B, T, D], the updated cache): the
    forward pass without the output head."""
    name = type(self).__name__
    if len(cache) != self.config.num_layers:
      raise ValueError(
          f"{name}: cache has {len(cache)} layer caches; the model has "
          f"num_layers={self.config.num_layers}.")
    if tokens_BxT.shape != positions_BxT.shape:
      raise ValueError(
          f"{name}: tokens shape {tokens_BxT.shape} != positions shape "
          f"{positions_BxT.shape}; both must be [B, T].")
    x_BxTxD = jnp.take(self.embed[...], tokens_BxT, axis=0).astype(self.dtype)
    scale = self.embed_scale()
    if scale is not None:
      x_BxTxD = x_BxTxD * jnp.asarray(scale, self.dtype)
    new_cache = []
    for block, layer_cache in zip(self.layers, cache):
      x_BxTxD, layer_cache = block(x_BxTxD, positions_BxT, layer_cache)
      new_cache.append(layer_cache)
    return self.final_norm(x_BxTxD), new_cache

  def logits(self, x_BxTxD: jax.Array) -> jax.Array:
    """The output head (soft-capped where the model does): float32
    [B, T, V] from `hidden`'s states."""
    if self.lm_head is None:
      logits = jnp.einsum("btd,vd->btv", x_BxTxD,
                          self.embed[...].astype(self.dtype),
                          preferred_element_type=jnp.float32)
    else:
      logits = jnp.einsum("btd,dv->btv", x_BxTxD,
                          self.lm_head[...].astype(self.dtype),
                          preferred_element_type=jnp.float32)
    logits = logits.astype(jnp.float32)
    cap = self.config.final_logit_softcapping
    if cap is not None:
      logits = cap * jnp.tanh(logits / cap)
    return logits

  def init_cache(self, batch_size: int, capacity: int,
                 dtype=None) -> list[LayerCache]:
    """An empty full-precision cache (`cache.factory.init_cache` with no
    spec: sliding-window layers get their window caches there); `dtype`
    None means the compute dtype."""
    return init_model_cache(self.config, batch_size, capacity, None,
                            self.dtype if dtype is None else dtype)
