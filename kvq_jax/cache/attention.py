"""Masked grouped-query attention shared by every KV cache.

A cache materialises (or dequantizes) keys/values for all `S` slots it holds
and hands them here together with a boolean visibility mask. The math is the
standard scaled dot-product attention, softmax in float32, with grouped-query
attention done by reshaping the queries to [B, T, K, G, H] so K/V are never
repeated in memory.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# Large negative logit for masked slots: exp() underflows to exactly 0 while
# staying finite, so no inf - inf = NaN can appear. Every query row sees at
# least its own slot, so a row is never fully masked.
MASK_VALUE = -1e30


def attention_mask(length_B: jax.Array, num_queries: int,
                   num_slots: int) -> jax.Array:
  """Causal/length mask [B, T, S]: query t of sequence b sees s <= length_b + t.

  `length_B` is the number of tokens stored *before* the chunk of
  `num_queries` new tokens was written at slots [length_b, length_b + T).
  """
  slots_S = jnp.arange(num_slots, dtype=jnp.int32)
  last_BxT = (length_B.astype(jnp.int32)[:, None]
              + jnp.arange(num_queries, dtype=jnp.int32)[None, :])
  return slots_S[None, None, :] <= last_BxT[:, :, None]


def split_nonfinite(v: jax.Array, slot_axis: int, head_axis: int,
                    mask_BxTxS: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(v with NaN/Inf rows zeroed, bool [B, K, T]: query sees a bad row).

  Masked probabilities are exactly 0, but 0 * NaN = NaN would still leak a
  non-finite value into queries that cannot see it. Zero the bad rows for
  the product and put NaN back only where a query really attends to one
  (propagation, never masking).
  """
  finite = jnp.isfinite(v)
  bad_BxKxS = jnp.moveaxis(~jnp.all(finite, axis=-1),
                           (slot_axis, head_axis), (-1, 1))
  sees_bad_BxKxT = jnp.einsum(
      "bts,bks->bkt", mask_BxTxS.astype(jnp.float32),
      bad_BxKxS.astype(jnp.float32)) > 0
  return jnp.where(finite, v, 0), sees_bad_BxKxT


def gqa_attention(q_BxTxNxH: jax.Array, k_BxSxKxH: jax.Array,
                  v_BxSxKxH: jax.Array, mask_BxTxS: jax.Array,
                  *, scale: float | None = None) -> jax.Array:
  """softmax(q k^T * scale + mask) v with N = G * K query heads.

  Args:
    q_BxTxNxH: queries (already rotated), in the compute dtype.
    k_BxSxKxH: keys for every cache slot (already rotated); any float dtype.
    v_BxSxKxH: values for every cache slot; any float dtype.
    mask_BxTxS: True where query t may attend to slot s.
    scale: logit scale; defaults to 1/sqrt(H).

  Returns:
    out_BxTxNxH in q's dtype.
  """
  b, t, n, h = q_BxTxNxH.shape
  num_kv = k_BxSxKxH.shape[2]
  if n % num_kv:
    raise ValueError(
        f"gqa_attention: q has N={n} heads, not a multiple of the K={num_kv} "
        "key/value heads.")
  if scale is None:
    scale = h ** -0.5
  compute_dtype = q_BxTxNxH.dtype
  q_BxTxKxGxH = (q_BxTxNxH * jnp.asarray(scale, compute_dtype)).reshape(
      b, t, num_kv, n // num_kv, h)
  k_BxSxKxH = k_BxSxKxH.astype(compute_dtype)
  v_BxSxKxH, sees_bad_BxKxT = split_nonfinite(
      v_BxSxKxH.astype(compute_dtype), 1, 2, mask_BxTxS)
  logits_BxKxGxTxS = jnp.einsum(
      "btkgh,bskh->bkgts", q_BxTxKxGxH, k_BxSxKxH,
      preferred_element_type=jnp.float32)
  logits_BxKxGxTxS = jnp.where(mask_BxTxS[:, None, None, :, :],
                               logits_BxKxGxTxS, MASK_VALUE)
  probs_BxKxGxTxS = jax.nn.softmax(logits_BxKxGxTxS, axis=-1)
  out_BxTxKxGxH = jnp.einsum(
      "bkgts,bskh->btkgh", probs_BxKxGxTxS.astype(compute_dtype), v_BxSxKxH,
      preferred_element_type=jnp.float32)
  sees_bad_BxTxKx1x1 = jnp.moveaxis(sees_bad_BxKxT, 2, 1)[..., None, None]
  out_BxTxKxGxH = jnp.where(sees_bad_BxTxKx1x1, jnp.nan, out_BxTxKxGxH)
  return out_BxTxKxGxH.reshape(b, t, n, h).astype(compute_dtype)
