"""Pure-jnp reference for decode attention over a (packed) heads-major cache.

Dequantizes the whole cache, then computes a masked softmax attention in
float32. It is the "xla" implementation of `dispatch` and the oracle of the
kernel tests.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from kvq_jax.kernels.cache_layout import describe_packed
from kvq_jax.quant import dequantize
from kvq_jax.quant.packing import unpack


def dequantize_cache(x, head_dim: int) -> jax.Array:
  """Dequantizes a packed [B, K, S, H] cache tensor to float32.

  Layouts the kernel reads are unpacked here independently of the quant
  library (a cross-check of the byte contract); other formats (fp8, int3,
  per_tensor) go through `kvq_jax.quant.dequantize`. Plain arrays are
  returned as float32.
  """
  if not hasattr(x, "data"):
    return jnp.asarray(x, jnp.float32)
  num_slots = x.data.shape[2]
  layout = describe_packed(x, head_dim, "cache", num_slots)
  if isinstance(layout, str):
    return dequantize(x, jnp.float32)
  codes = unpack(x.data, layout.bits).astype(jnp.float32)  # [B, K, S, H]
  def expand(s):
    s = s.astype(jnp.float32)
    if layout.scale_axis == -1:
      return jnp.repeat(s, head_dim // layout.n_groups, axis=-1)
    return jnp.repeat(s, layout.token_group, axis=-2)
  if layout.symmetric:
    return (codes - layout.offset) * expand(x.scale)
  return codes * expand(x.scale) + expand(x.zero)


@functools.partial(jax.jit, static_argnames=("return_lse",))
def decode_attention_reference(q_BxKxGxH: jax.Array, k, v,
                               length_B: jax.Array, return_lse: bool = False,
                               start_B: jax.Array | None = None):
  """Masked softmax attention of one query token per sequence.

  Args:
    q_BxKxGxH: queries, G query heads per KV head.
    k, v: QuantizedArray caches over [B, K, S, H] or plain [B, K, S, H] arrays.
    length_B: int [B]; slots >= length_b are masked.
    return_lse: also return the natural-log log-sum-exp [B, K, G] of the
      scaled scores (-inf for empty sequences).
    start_B: int [B] or None (zeros); slots < start_b are masked.

  Returns:
    out [B, K, G, H] float32 (zeros for empty sequences), and lse if asked.
  """
  head_dim = q_BxKxGxH.shape[-1]
  k_f = dequantize_cache(k, head_dim)
  v_f = dequantize_cache(v, head_dim)
  q = q_BxKxGxH.astype(jnp.float32) / math.sqrt(head_dim)
  scores = jnp.einsum("bkgh,bksh->bkgs", q, k_f,
                      precision=jax.lax.Precision.HIGHEST)
  num_slots = k_f.shape[2]
  slots_S = jnp.arange(num_slots)[None, :]
  valid = slots_S < length_B[:, None]
  if start_B is not None:
    valid &= slots_S >= start_B[:, None]
  valid = valid[:, None, None]
  scores = jnp.where(valid, scores, -jnp.inf)
  m = jnp.max(scores, axis=-1, keepdims=True)
  m = jnp.where(jnp.isfinite(m), m, 0.0)
  p = jnp.where(valid, jnp.exp(scores - m), 0.0)
  l = jnp.sum(p, axis=-1, keepdims=True)
  denom = jnp.where(l > 0, l, 1.0)
  out = jnp.einsum("bkgs,bksh->bkgh", p / denom, v_f,
                   precision=jax.lax.Precision.HIGHEST)
  if not return_lse:
    return out
  lse = jnp.where(l > 0, m + jnp.log(denom), -jnp.inf)[..., 0]
  return out, lse
