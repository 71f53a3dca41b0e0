"""Block attention that reads vector codes directly (`code_read='lookup'`).

Scheme `vector` (`kvq_jax.quant.quantize`) stores, for each c-element
sub-vector j of a token's head vector, one uint8 index u_j into the
256 x c table C of its format (`kvq_jax.quant.vector_codebook`), and one
scale s per group of g elements along head_dim: x'[j] = s C[u_j]. A block
of L slots can then be attended without its dequantized copy [L, H]:

  scores  q . x'_l = sum_j s_l,grp(j) T[j, u_l,j],  T[j, m] = q[j] . C[m]
          (one table of H/c x 256 entries per query row, shared by every
          slot of every block);
  values  sum_l p_l x'_l [j] = sum_m W[j, m] C[m],
          W[j, m] = sum_{l : u_l,j = m} p_l s_l,grp(j)
          (a histogram of the attention weights per sub-vector, scattered by
          index, then one [256, c] product per sub-vector).

Pre-RoPE keys cannot be looked up: RoPE turns each slot's reconstructed
key by its own angle before the dot, so the table would differ per slot;
`lookup_reason` says so for them and for every other layout the identities
above do not cover (outliers, scales along the tokens).

Same softmax state as `planar_block_attention` of the dequantized block,
up to float summation order. A value row with a non-finite scale gives a
NaN output to every query that sees it (its weight is left out of the
histogram and the row marked, as `split_nonfinite_planes` does); a key row
with one gives a NaN score, as its dequantized key would.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kvq_jax.cache.attention import (plane_scores, plane_value_reader,
                                     rows_seen, weighted_block_state)
from kvq_jax.quant import QuantizedArray, QuantSpec, vector_codebook
from kvq_jax.quant.planes import nonfinite_rows

CODE_READS = ("dequantize", "lookup")


def lookup_reason(spec: QuantSpec | None, name: str,
                  key_rope: str = "post") -> str | None:
  """Why tensor `name` ('k' or 'v') of this format cannot be read by
  lookup, or None. Tensors that are not vector-coded are read as before and
  need no reason."""
  if spec is None or not spec.is_vector:
    return None
  if name == "k" and key_rope == "pre":
    return ("k: pre-RoPE vector keys are rotated by each slot's own angle "
            "after reconstruction, so one q . centroid table cannot serve "
            "every slot; use key_rope='post' or code_read='dequantize'.")
  if spec.outliers:
    return (f"{name}.outliers={spec.outliers}: the lookup reads indices and "
            "scales only, not sparse outliers; use code_read='dequantize'.")
  if spec.granularity not in ("per_token", "per_group"):
    return (f"{name}.granularity={spec.granularity!r}: the lookup needs "
            "scales grouped along head_dim (per_token or per_group).")
  return None


def lookup_refusal(k: QuantSpec | None, v: QuantSpec | None,
                   key_rope: str = "post") -> str | None:
  """The first `lookup_reason` of a layer's k and v, or None."""
  for name, spec in (("k", k), ("v", v)):
    reason = lookup_reason(spec, name, key_rope)
    if reason:
      return reason
  return None


def _scale_per_index(store: QuantizedArray) -> jax.Array:
  """float32 [..., L, H/c]: the scale of every index's sub-vector."""
  spec = store.spec
  c = spec.vector_dim
  h = store.last_dim
  g = spec.group_size if spec.granularity == "per_group" else h
  scale = store.scale.astype(jnp.float32)  # [..., L, H/g]
  return jnp.repeat(scale, g // c, axis=-1)


def query_table(q_BxKxGxTxH: jax.Array, spec: QuantSpec) -> jax.Array:
  """T [B, K, G, T, H/c, 256]: each query sub-vector's dot with every
  centroid of `spec`'s table. It depends on the queries only, so a block
  loop builds it once and reads every block's keys from it."""
  c = spec.vector_dim
  b, kh, g, t, h = q_BxKxGxTxH.shape
  table_Mxc = jnp.asarray(vector_codebook.centroids(spec.bits))
  q_BxKxGxTxJxc = q_BxKxGxTxH.astype(jnp.float32).reshape(
      b, kh, g, t, h // c, c)
  return jnp.einsum("bkgtjc,mc->bkgtjm", q_BxKxGxTxJxc, table_Mxc)


def table_scores(t_BxKxGxTxJxM: jax.Array, store: QuantizedArray) -> jax.Array:
  """q . k' [B, K, G, T, L] of a vector-coded key block [B, K, L, H] from
  its queries' `query_table`."""
  u_BxKxLxJ = store.data.astype(jnp.int32)
  # T[b, k, g, t, j, u[b, k, l, j]] for every slot l: one gather.
  idx = u_BxKxLxJ[:, :, None, None, :, :]  # [B, K, 1, 1, L, J]
  looked_BxKxGxTxLxJ = jnp.take_along_axis(
      t_BxKxGxTxJxM[:, :, :, :, None], idx[..., None], axis=-1)[..., 0]
  s_BxKxLxJ = _scale_per_index(store)
  return jnp.einsum("bkgtlj,bklj->bkgtl", looked_BxKxGxTxLxJ, s_BxKxLxJ)


def lookup_scores(q_BxKxGxTxH: jax.Array, store: QuantizedArray) -> jax.Array:
  """q . k' [B, K, G, T, L] of a vector-coded key block [B, K, L, H]."""
  return table_scores(query_table(q_BxKxGxTxH, store.spec), store)


def lookup_values(p_BxKxGxTxL: jax.Array, store: QuantizedArray,
                  bad_BxKxL: jax.Array) -> jax.Array:
  """sum_l p_l v'_l [B, K, G, T, H] of a vector-coded value block
  [B, K, L, H]; rows in `bad_BxKxL` are left out (the caller marks them)."""
  spec = store.spec
  c = spec.vector_dim
  b, kh, g, t, l = p_BxKxGxTxL.shape
  j = store.data.shape[-1]
  table_Mxc = jnp.asarray(vector_codebook.centroids(spec.bits))
  s_BxKxLxJ = jnp.where(bad_BxKxL[..., None], 0.0, _scale_per_index(store))
  w_BxKxGxTxLxJ = (p_BxKxGxTxL[..., None]
                   * s_BxKxLxJ[:, :, None, None, :, :])
  u_BxKxLxJ = store.data.astype(jnp.int32)
  bi, ki, gi, ti, _, ji = jnp.ix_(*(jnp.arange(n)
                                    for n in (b, kh, g, t, l, j)))
  hist_BxKxGxTxJxM = jnp.zeros((b, kh, g, t, j, table_Mxc.shape[0]),
                               jnp.float32).at[
      bi, ki, gi, ti, ji, u_BxKxLxJ[:, :, None, None, :, :]].add(
          w_BxKxGxTxLxJ)
  out = jnp.einsum("bkgtjm,mc->bkgtjc", hist_BxKxGxTxJxM, table_Mxc)
  return out.reshape(b, kh, g, t, j * c)


def lookup_block_attention(q_BxKxGxTxH: jax.Array, k, v, mask_BxTxL,
                           v_bad_BxKxL: jax.Array | None = None,
                           k_table: jax.Array | None = None):
  """`planar_block_attention` where `k` and/or `v` may be a vector-coded
  QuantizedArray block [B, K, L, H], read by lookup (module docstring);
  the other is a tuple of float32 planes as there (`v_bad_BxKxL` then
  marks its non-finite rows, already zeroed; None: found in the planes).
  `k_table`: the queries' `query_table` for vector keys, built once per
  loop (None: built here)."""
  if isinstance(k, QuantizedArray):
    if k_table is None:
      k_table = query_table(q_BxKxGxTxH, k.spec)
    scores = table_scores(k_table, k)
  else:
    scores = plane_scores(q_BxKxGxTxH, k)
  if isinstance(v, QuantizedArray):
    bad = nonfinite_rows(v)
    reader = (lambda p: lookup_values(p, v, bad)), rows_seen(mask_BxTxL, bad)
  else:
    reader = plane_value_reader(v, mask_BxTxL, v_bad_BxKxL)
  return weighted_block_state(scores, mask_BxTxL, *reader)
