"""Masked grouped-query attention shared by every KV cache.

A cache materialises (or dequantizes) keys/values for all `S` slots it holds
and hands them here together with a boolean visibility mask. The math is the
standard scaled dot-product attention, softmax in float32, with grouped-query
attention done by reshaping the queries to [B, T, K, G, H] so K/V are never
repeated in memory.

Visibility is decided on token indices (token i of a sequence is the i-th one
written): causal attention lets query token i see every j <= i; a
sliding-window (local) layer of window W only i - W < j <= i (`band_mask`,
and `attention_mask(..., window=W)` for a linear slot == token layout).
Caches that split the keys into segments (the quantized caches) reduce each
segment to a partial softmax state with `block_attention` and combine the
states with `merge_states` (log-sum-exp).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from kvq_jax.quant.planes import interleave_planes

# Large negative logit for masked slots: exp() underflows to exactly 0 while
# staying finite, so no inf - inf = NaN can appear. Every query row sees at
# least its own slot, so a row is never fully masked.
MASK_VALUE = -1e30


def attention_mask(length_B: jax.Array, num_queries: int,
                   num_slots: int, window: int | None = None) -> jax.Array:
  """Causal/length mask [B, T, S]: query t of sequence b sees s <= length_b + t.

  `length_B` is the number of tokens stored *before* the chunk of
  `num_queries` new tokens was written at slots [length_b, length_b + T)
  (slot == token index). With `window` W, the query also sees only
  s > length_b + t - W (a sliding-window band over a linear cache).
  """
  slots_S = jnp.arange(num_slots, dtype=jnp.int32)
  last_BxT = (length_B.astype(jnp.int32)[:, None]
              + jnp.arange(num_queries, dtype=jnp.int32)[None, :])
  mask_BxTxS = slots_S[None, None, :] <= last_BxT[:, :, None]
  if window is not None:
    mask_BxTxS = mask_BxTxS & (slots_S[None, None, :]
                              > last_BxT[:, :, None] - window)
  return mask_BxTxS


def band_mask(key_tok_BxL: jax.Array, query_tok_BxT: jax.Array,
              window: int) -> jax.Array:
  """Sliding-window visibility [B, T, L] on token indices.

  Query token i sees key token j iff 0 <= j, i - window < j <= i; a negative
  key token marks an empty slot (a ring buffer not yet filled).
  """
  key_BxTxL = key_tok_BxL[:, None, :]
  query_BxTxL = query_tok_BxT[:, :, None]
  return ((key_BxTxL >= 0) & (key_BxTxL <= query_BxTxL)
          & (key_BxTxL > query_BxTxL - window))


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


def block_attention(q_BxKxGxTxH: jax.Array, k_BxKxLxH: jax.Array,
                    v_BxKxLxH: jax.Array, mask_BxTxL: jax.Array):
  """Partial softmax state (max, sum, weighted values) of one key block.

  Heads-major layout; q is already scaled (and rotated like the keys). A row
  with no visible key gives max = MASK_VALUE, sum 0 and zero values, which
  `merge_states` weighs out.
  """
  return planar_block_attention(q_BxKxGxTxH, (k_BxKxLxH,), (v_BxKxLxH,),
                                mask_BxTxL)


def planar_block_attention(q_BxKxGxTxH: jax.Array, k_planes, v_planes,
                           mask_BxTxL: jax.Array,
                           v_bad_BxKxL: jax.Array | None = None):
  """`block_attention` with keys and values given as bit planes.

  `k_planes` is a tuple of P_k arrays [B, K, L, H / P_k], plane j holding
  head_dim elements j, j + P_k, ... (`quant.planes`; one plane is the plain
  block), `v_planes` likewise with P_v. The scores are the sum of one dot
  per key plane with the matching strided query; each value plane gives
  the strided part of the weighted values. Same state as `block_attention`
  of the interleaved blocks, up to float summation order.

  `v_bad_BxKxL` marks the value rows known to be non-finite (a quantized
  row with a NaN/Inf scale or zero), already zeroed in the planes: a query
  that attends to one gets NaN, as in `block_attention`, without a pass over
  every plane element. None: the rows are found in the planes
  (`split_nonfinite_planes`).
  """
  return weighted_block_state(plane_scores(q_BxKxGxTxH, k_planes), mask_BxTxL,
                              *plane_value_reader(v_planes, mask_BxTxL,
                                                  v_bad_BxKxL))


def plane_value_reader(v_planes, mask_BxTxL: jax.Array,
                       v_bad_BxKxL: jax.Array | None):
  """(values_fn, sees_bad [B, K, T]) of value planes for
  `weighted_block_state`: `v_bad_BxKxL` marks rows already zeroed; None:
  the non-finite rows are found in the planes and zeroed here."""
  if v_bad_BxKxL is None:
    v_planes, sees_bad_BxKxT = split_nonfinite_planes(v_planes, mask_BxTxL)
  else:
    sees_bad_BxKxT = rows_seen(mask_BxTxL, v_bad_BxKxL)
  return (lambda p: plane_values(p, v_planes)), sees_bad_BxKxT


def plane_scores(q_BxKxGxTxH: jax.Array, k_planes) -> jax.Array:
  """Scores [B, K, G, T, L]: one dot per key plane [B, K, L, H / P] with
  the matching strided query, summed."""
  pk = len(k_planes)
  return sum(jnp.einsum("bkgth,bklh->bkgtl", q_BxKxGxTxH[..., j::pk], kp,
                        preferred_element_type=jnp.float32)
             for j, kp in enumerate(k_planes))


def plane_values(p_BxKxGxTxL: jax.Array, v_planes) -> jax.Array:
  """Weighted values [B, K, G, T, H] of value planes, interleaved back."""
  accs = [jnp.einsum("bkgtl,bklh->bkgth", p_BxKxGxTxL, vp,
                     preferred_element_type=jnp.float32) for vp in v_planes]
  return accs[0] if len(accs) == 1 else interleave_planes(accs)


def rows_seen(mask_BxTxL: jax.Array, rows_BxKxL: jax.Array) -> jax.Array:
  """bool [B, K, T]: query t sees a marked row."""
  return jnp.any(mask_BxTxL[:, None] & rows_BxKxL[:, :, None], axis=-1)


def weighted_block_state(scores_BxKxGxTxL: jax.Array, mask_BxTxL: jax.Array,
                         values_fn, sees_bad_BxKxT: jax.Array):
  """(max, sum, weighted values) of one block from its raw scores:
  `values_fn(p [B, K, G, T, L])` gives the weighted values [B, K, G, T, H];
  queries in `sees_bad_BxKxT` get NaN values."""
  mask = mask_BxTxL[:, None, None]
  scores = jnp.where(mask, scores_BxKxGxTxL, MASK_VALUE)
  m = jnp.max(scores, axis=-1)
  p = jnp.where(mask, jnp.exp(scores - m[..., None]), 0.0)
  acc = values_fn(p)
  acc = jnp.where(sees_bad_BxKxT[:, :, None, :, None], jnp.nan, acc)
  return m, jnp.sum(p, axis=-1), acc


def split_nonfinite_planes(v_planes, mask_BxTxL: jax.Array):
  """`split_nonfinite` of heads-major value planes [B, K, L, H / P]: the
  planes with NaN/Inf rows zeroed, and bool [B, K, T] (a query sees a row
  that is non-finite in any plane)."""
  finite = [jnp.isfinite(vp) for vp in v_planes]
  bad_BxKxL = ~functools.reduce(jnp.logical_and,
                                [jnp.all(f, axis=-1) for f in finite])
  sees_bad_BxKxT = jnp.einsum(
      "btl,bkl->bkt", mask_BxTxL.astype(jnp.float32),
      bad_BxKxL.astype(jnp.float32)) > 0
  return (tuple(jnp.where(f, vp, 0) for f, vp in zip(finite, v_planes)),
          sees_bad_BxKxT)


def causal_blockwise_attention(q_BxTxNxH: jax.Array, k_BxSxKxH: jax.Array,
                               v_BxSxKxH: jax.Array, length_B: jax.Array,
                               block: int) -> jax.Array:
  """`gqa_attention` under `attention_mask(length_B, T, S)`, read block by
  block.

  The S slots (slot == token index) are read `block` at a time with an
  online softmax (`block_attention` / `merge_states`), and only up to the
  longest filled length in the batch, max(length_B) + T, so the work grows
  with the tokens held, not with the capacity, and no [T, S] score matrix is
  built. Same math as the one-shot softmax (equal up to float rounding).
  """
  b, t, n, h = q_BxTxNxH.shape
  s, num_kv = k_BxSxKxH.shape[1], k_BxSxKxH.shape[2]
  if n % num_kv:
    raise ValueError(
        f"causal_blockwise_attention: q has N={n} heads, not a multiple of "
        f"the K={num_kv} key/value heads.")
  block = min(block, s)
  compute_dtype = q_BxTxNxH.dtype
  q_BxKxGxTxH = jnp.moveaxis(
      (q_BxTxNxH * jnp.asarray(h ** -0.5, compute_dtype)).reshape(
          b, t, num_kv, n // num_kv, h), 1, 3)
  last_BxT = (length_B.astype(jnp.int32)[:, None]
              + jnp.arange(t, dtype=jnp.int32)[None, :])

  def body(index, state):
    # The last block may overlap the one before it (S not a multiple of
    # `block`): slots before index * block were already read.
    start = jnp.minimum(index * block, s - block)
    kb, vb = (jnp.swapaxes(read_block(x, start, block, index, compute_dtype),
                           1, 2) for x in (k_BxSxKxH, v_BxSxKxH))
    tok_L = start + jnp.arange(block, dtype=jnp.int32)
    mask_BxTxL = ((tok_L[None, None, :] <= last_BxT[:, :, None])
                  & (tok_L >= index * block)[None, None, :])
    return merge_states(state, block_attention(q_BxKxGxTxH, kb, vb,
                                               mask_BxTxL))

  shape = (b, num_kv, n // num_kv, t)
  state = (jnp.full(shape, MASK_VALUE, jnp.float32),
           jnp.zeros(shape, jnp.float32), jnp.zeros(shape + (h,), jnp.float32))
  filled = jnp.minimum((jnp.max(last_BxT) + block) // block, -(-s // block))
  _, l, acc = jax.lax.fori_loop(0, filled, body, state)
  out_BxKxGxTxH = acc / l[..., None]
  return jnp.moveaxis(out_BxKxGxTxH, 3, 1).reshape(b, t, n, h).astype(
      compute_dtype)


def per_iteration(tree, index: jax.Array):
  """`tree` tied to the loop index `index` (a no-op at run time).

  XLA hoists loop-invariant work out of a loop: a convert (bfloat16 storage,
  bfloat16 scales) or an unpack applied to the whole buffer a loop body
  slices becomes one pass over the whole buffer per step, before the first
  block is read, whatever the number of blocks the loop runs. Read through
  the optimization barrier, nothing the body computes from `tree` is
  loop-invariant, so the work stays fused with each block's slice.
  """
  tree, _ = jax.lax.optimization_barrier((tree, index))
  return tree


def read_block(x_BxSxKxH: jax.Array, start: jax.Array, block: int,
               index: jax.Array, dtype) -> jax.Array:
  """Slots [start, start + block) of x as `dtype`, [B, block, K, H]: one
  block of a loop that reads a cache block by block, `index` its loop index.

  A bfloat16 slice must be converted one block at a time, inside the loop:
  XLA:CPU has no bf16 arithmetic, its float normalization rewrites the bf16
  dynamic-slice as convert(whole buffer) then a float32 slice, and the
  loop-invariant convert would be hoisted out of the loop (`per_iteration`).
  A buffer already in `dtype` has no convert and is read as it is.
  """
  if x_BxSxKxH.dtype != jnp.dtype(dtype):
    x_BxSxKxH = per_iteration(x_BxSxKxH, index)
  return jax.lax.dynamic_slice_in_dim(x_BxSxKxH, start, block, 1).astype(
      dtype)


def merge_states(a, b):
  """Log-sum-exp merge of two partial softmax states (`block_attention`)."""
  m_a, l_a, acc_a = a
  m_b, l_b, acc_b = b
  m = jnp.maximum(m_a, m_b)
  wa, wb = jnp.exp(m_a - m), jnp.exp(m_b - m)
  return m, l_a * wa + l_b * wb, acc_a * wa[..., None] + acc_b * wb[..., None]
