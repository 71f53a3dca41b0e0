"""Attention-output error of a layer whose K/V pass through fake quantization.

loss(c_k, c_v) = mean |attn(q, fq(k; c_k), fq(v; c_v)) - attn(q, k, v)|^2
                 / mean |attn(q, k, v)|^2
with causal grouped-query attention in float32 over recorded q/k/v. The
quantized keys follow the layer's cache: post-RoPE or pre-RoPE (rotated after
fake quantization), optionally Hadamard-rotated along head_dim first (the
rotation is undone after, as the cache does at read time).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kvq_jax.cache import hadamard
from kvq_jax.cache.spec import LayerSpec
from kvq_jax.calibration.fake_quant import fake_quant
from kvq_jax.models.rope import Rope


def causal_attention(q_BxQxNxH: jax.Array, query_pos_Q: jax.Array,
                     k_BxTxKxH: jax.Array, v_BxTxKxH: jax.Array) -> jax.Array:
  """Softmax attention of queries at positions `query_pos_Q` over keys
  0..T-1 (key s visible to a query at position p when s <= p)."""
  b, nq, n, h = q_BxQxNxH.shape
  kh = k_BxTxKxH.shape[2]
  t = k_BxTxKxH.shape[1]
  q = (q_BxQxNxH * h ** -0.5).reshape(b, nq, kh, n // kh, h)
  logits = jnp.einsum("bqkgh,bskh->bkgqs", q, k_BxTxKxH)
  mask_QxS = jnp.arange(t)[None, :] <= query_pos_Q[:, None]
  logits = jnp.where(mask_QxS, logits, -1e30)
  probs = jax.nn.softmax(logits, axis=-1)
  out = jnp.einsum("bkgqs,bskh->bqkgh", probs, v_BxTxKxH)
  return out.reshape(b, nq, n, h)


def _fq_tokens_major(x_BxTxKxH: jax.Array, spec, clip, rotate: bool,
                     key: hadamard.RotationKey = None):
  """fake_quant in the cache's [B, K, T, H] layout, back to [B, T, K, H]."""
  if spec is None:
    return x_BxTxKxH
  x = jnp.swapaxes(x_BxTxKxH, 1, 2)
  if rotate:
    x = hadamard.rotate(x, key)
  x = fake_quant(x, spec, clip)
  if rotate:
    x = hadamard.unrotate(x, key)
  return jnp.swapaxes(x, 1, 2)


def quantized_keys_values(k_pre_BxTxKxH, k_post_BxTxKxH, v_BxTxKxH,
                          layer: LayerSpec, rope: Rope, clip_k, clip_v):
  """(keys to dot with post-RoPE queries, values) after fake quantization."""
  if layer.key_rope == "pre":
    k = _fq_tokens_major(k_pre_BxTxKxH, layer.k, clip_k, layer.hadamard_k,
                         layer.rotation_key)
    b, t = k.shape[:2]
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    k = rope(k, positions).astype(jnp.float32)
  else:
    k = _fq_tokens_major(k_post_BxTxKxH, layer.k, clip_k, layer.hadamard_k,
                         layer.rotation_key)
  v = _fq_tokens_major(v_BxTxKxH, layer.v, clip_v, layer.hadamard_v,
                       layer.rotation_key)
  return k, v


def attention_error(clip_k, clip_v, q_BxQxNxH, query_pos_Q, k_pre_BxTxKxH,
                    k_post_BxTxKxH, v_BxTxKxH, reference_BxQxNxH,
                    layer: LayerSpec, rope: Rope) -> jax.Array:
  """Relative squared error of the attention output (module docstring)."""
  k, v = quantized_keys_values(k_pre_BxTxKxH, k_post_BxTxKxH, v_BxTxKxH,
                               layer, rope, clip_k, clip_v)
  out = causal_attention(q_BxQxNxH, query_pos_Q, k, v)
  err = jnp.mean(jnp.square(out - reference_BxQxNxH))
  return err / jnp.maximum(jnp.mean(jnp.square(reference_BxQxNxH)), 1e-30)
