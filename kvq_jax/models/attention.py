"""GQA self-attention: projections + RoPE; the cache does the attending."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from kvq_jax.cache.base import LayerCache
from kvq_jax.models.config import ModelConfig
from kvq_jax.models.layers import Dense, RMSNorm
from kvq_jax.models.rope import Rope


class Attention(nnx.Module):
  """q/k/v/o projections; calls `layer_cache.attend` (see cache/base.py).

  Options for other architectures than llama:
    rope: this layer's RoPE (e.g. Gemma 3's local layers use another base);
      None means `config.rope_theta` over `config.rotary_dim`.
    qk_norm: RMSNorm over head_dim of every q and k head before RoPE
      (Gemma 3); the norm weights multiply in float32 (Gemma3RMSNorm).
  The cache scales q.k by 1/sqrt(head_dim); when `config.query_scale`
  differs (Gemma's query_pre_attn_scalar), the rotated queries are
  pre-multiplied by the ratio so the logits come out as configured.
  Sliding windows are the cache's business, never masked here.
  """

  def __init__(self, config: ModelConfig, *, rope: Rope | None = None,
               qk_norm: bool = False, dtype=jnp.float32,
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    d, n, k, h = (config.hidden_size, config.num_heads, config.num_kv_heads,
                  config.head_dim)
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.num_heads, self.num_kv_heads, self.head_dim = n, k, h
    self.dtype = dtype
    self.rope = rope if rope is not None else Rope(
        theta=float(config.rope_theta), rotary_dim=config.rotary_dim)
    self.q = Dense(d, n * h, use_bias=config.attention_bias, **kw)
    self.k = Dense(d, k * h, use_bias=config.attention_bias, **kw)
    self.v = Dense(d, k * h, use_bias=config.attention_bias, **kw)
    self.o = Dense(n * h, d, use_bias=False, **kw)
    norm_kw = dict(eps=config.rms_norm_eps, dtype=dtype,
                   param_dtype=param_dtype, weight_in_float32=True)
    self.q_norm = RMSNorm(h, **norm_kw) if qk_norm else None
    self.k_norm = RMSNorm(h, **norm_kw) if qk_norm else None
    self.query_prescale = (
        None if config.query_pre_attn_scalar in (None, h)
        else config.query_scale * h ** 0.5)

  def __call__(self, x_BxTxD: jax.Array, positions_BxT: jax.Array,
               layer_cache: LayerCache) -> tuple[jax.Array, LayerCache]:
    b, t, _ = x_BxTxD.shape
    n, k, h = self.num_heads, self.num_kv_heads, self.head_dim
    q_BxTxNxH = self.q(x_BxTxD).reshape(b, t, n, h)
    k_BxTxKxH = self.k(x_BxTxD).reshape(b, t, k, h)
    v_BxTxKxH = self.v(x_BxTxD).reshape(b, t, k, h)
    if self.q_norm is not None:
      q_BxTxNxH = self.q_norm(q_BxTxNxH)
      k_BxTxKxH = self.k_norm(k_BxTxKxH)
    q_BxTxNxH = self.rope(q_BxTxNxH, positions_BxT)
    if self.query_prescale is not None:
      q_BxTxNxH = q_BxTxNxH * jnp.asarray(self.query_prescale, self.dtype)
    out_BxTxNxH, new_cache = layer_cache.attend(
        q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, positions_BxT, self.rope)
    return self.o(out_BxTxNxH.reshape(b, t, n * h)), new_cache
