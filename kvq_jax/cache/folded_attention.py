"""Block attention over per-token storage with the scales folded out.

A per-token symmetric code vector c_j with one scale d_j stands for
k_j = d_j * c_j, so

  q . k_j = d_j * (q . c_j)        sum_j p_j v_j = sum_j (p_j e_j) c_j

(e_j the value scale). Dotting the query with the centred codes and scaling
the L scores, and scaling the L probabilities before the value dot, skips
the multiply of every element of the dequantized [L, H] blocks and hands
the dots the codes as unpacked. `experiments.profile_read` times both
loops per format (attend_ms: the cache's path; attend_dequantized_ms: the
dequantize-then-dot loop), figures in WORKSPACE.md "Decode speed on this
CPU". Per-group layouts (q4_0, int4_g32: several scales per vector) are
read as bit planes instead (`quant.planes`, `attention.
planar_block_attention`): folding their scales measured no gain, so only
per-token formats take this path (`folds_scales`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kvq_jax.cache.attention import MASK_VALUE, split_nonfinite
from kvq_jax.quant import QuantizedArray, QuantSpec
from kvq_jax.quant.packing import unpack


def folds_scales(spec: QuantSpec | None) -> bool:
  """Whether `spec`'s storage is read with its scale folded out: integer
  per-token codes, one scale and no zero per vector, no outliers."""
  return (spec is not None and spec.granularity == "per_token"
          and spec.has_scale and not spec.has_zero and not spec.is_codebook
          and not spec.is_float and not spec.outliers)


def centred_codes(store: QuantizedArray) -> tuple[jax.Array, jax.Array]:
  """(codes [..., L, H] float32 centred at 0, scales [..., L] float32)."""
  spec = store.spec
  codes = unpack(store.data, spec.bits).astype(jnp.float32) - 2 ** (
      spec.bits - 1)
  return codes, store.scale.astype(jnp.float32)[..., 0]


def folded_block_attention(q_BxKxGxTxH: jax.Array, k_store: QuantizedArray,
                           v_store: QuantizedArray, mask_BxTxL: jax.Array):
  """`cache.attention.block_attention` of a block of per-token storage
  ([B, K, L, ...] leaves), the scales folded out (module docstring); the
  same partial softmax state (max, sum, weighted values)."""
  k_codes, k_scale_BxKxL = centred_codes(k_store)
  v_codes, v_scale_BxKxL = centred_codes(v_store)
  scores = jnp.einsum("bkgth,bklh->bkgtl", q_BxKxGxTxH, k_codes,
                      preferred_element_type=jnp.float32)
  scores = scores * k_scale_BxKxL[:, :, None, None, :]
  mask = mask_BxTxL[:, None, None]
  scores = jnp.where(mask, scores, MASK_VALUE)
  m = jnp.max(scores, axis=-1)
  p = jnp.where(mask, jnp.exp(scores - m[..., None]), 0.0)
  # A NaN / Inf value scale (a non-finite value row) reaches only the
  # queries that attend to it, as in block_attention.
  v_scale_BxKxLx1, sees_bad_BxKxT = split_nonfinite(
      v_scale_BxKxL[..., None], 2, 1, mask_BxTxL)
  weights = p * v_scale_BxKxLx1[:, :, None, None, :, 0]
  acc = jnp.einsum("bkgtl,bklh->bkgth", weights, v_codes,
                   preferred_element_type=jnp.float32)
  acc = jnp.where(sees_bad_BxKxT[:, :, None, :, None], jnp.nan, acc)
  return m, jnp.sum(p, axis=-1), acc
