"""GQA self-attention: projections + RoPE; the cache does the attending."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from kvq_jax.cache.base import LayerCache
from kvq_jax.models.config import ModelConfig
from kvq_jax.models.layers import Dense
from kvq_jax.models.rope import Rope


class Attention(nnx.Module):
  """q/k/v/o projections; calls `layer_cache.attend` (see cache/base.py)."""

  def __init__(self, config: ModelConfig, *, dtype=jnp.float32,
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    d, n, k, h = (config.hidden_size, config.num_heads, config.num_kv_heads,
                  config.head_dim)
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.num_heads, self.num_kv_heads, self.head_dim = n, k, h
    self.rope = Rope(theta=float(config.rope_theta),
                     rotary_dim=config.rotary_dim)
    self.q = Dense(d, n * h, use_bias=config.attention_bias, **kw)
    self.k = Dense(d, k * h, use_bias=config.attention_bias, **kw)
    self.v = Dense(d, k * h, use_bias=config.attention_bias, **kw)
    self.o = Dense(n * h, d, use_bias=False, **kw)

  def __call__(self, x_BxTxD: jax.Array, positions_BxT: jax.Array,
               layer_cache: LayerCache) -> tuple[jax.Array, LayerCache]:
    b, t, _ = x_BxTxD.shape
    n, k, h = self.num_heads, self.num_kv_heads, self.head_dim
    q_BxTxNxH = self.rope(self.q(x_BxTxD).reshape(b, t, n, h), positions_BxT)
    k_BxTxKxH = self.k(x_BxTxD).reshape(b, t, k, h)
    v_BxTxKxH = self.v(x_BxTxD).reshape(b, t, k, h)
    out_BxTxNxH, new_cache = layer_cache.attend(
        q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, positions_BxT, self.rope)
    return self.o(out_BxTxNxH.reshape(b, t, n * h)), new_cache
