"""Pieces the contiguous and the paged decode kernels share.

Both kernels run the same flash-decoding program per (sequence, KV head,
split): all G query heads of the KV head in one [Gp, H] block, an online
softmax over blocks of cache rows, and the splits merged afterwards by
log-sum-exp. They differ only in where a block's rows come from: a
contiguous split of [B, K, S, ...] storage (`decode_attention.py`) or a page
of the pool named by the block table (`paged_decode_attention.py`). What
they share lives here:

* targets: `target` ("interpret", "cuda" or "tpu"), `platform_reason`,
  `padded_heads`, `compiler_params`, `dot_width_reason` (Triton's tl.dot);
* reading packed codes: `load_plane` turns rows of a packed tensor into one
  float32 code plane (`cache_layout`'s planes: plane j holds elements
  h = parts * i + j), with its scales and zeros from `expand_scale`;
  `scale_planes` splits token-group scales into planes outside a kernel;
* the online softmax: `init_carry`, `attend_block` (one block of rows),
  `store_carry`; and `query_planes` / `merge_splits` around the call.

A ref handed to `load_plane` is indexed as `ref[rows, cols]` (codes, row
scales) or `ref[rows, plane, :]` (token-group scales in planes); any object
with that `__getitem__` serves, which is how the paged kernel reads a page
of a whole-pool ref in one indexer.
"""

from __future__ import annotations

import functools
import math

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
import jax.numpy as jnp

from kvq_jax.kernels.cache_layout import PackedLayout

PLATFORMS = ("cuda", "tpu")
TRITON_MIN_DOT = 16  # tl.dot: every dimension >= 16.
TPU_SUBLANES = 8


def is_pow2(n: int) -> bool:
  return n > 0 and n & (n - 1) == 0


def next_pow2(n: int) -> int:
  return 1 << max(0, (n - 1).bit_length())


def platform_reason(platform: str | None) -> str | None:
  """Why `platform` is not a target, or None."""
  if platform is not None and platform not in PLATFORMS:
    return (f"platform={platform!r}; allowed: None (the default backend), "
            f"{', '.join(PLATFORMS)}.")
  return None


def target(interpret: bool, platform: str | None, caller: str) -> str:
  """"interpret", "cuda" or "tpu": interpret wins; platform None is the
  default backend (a CPU host without `interpret` lowers for CUDA)."""
  if interpret:
    return "interpret"
  if platform is None:
    return "tpu" if jax.default_backend() == "tpu" else "cuda"
  reason = platform_reason(platform)
  if reason:
    raise ValueError(f"{caller}: {reason}")
  return platform


def padded_heads(g: int, tgt: str) -> int:
  """Query heads per block: a power of two; >= 16 for Triton's tl.dot, >= 8
  (the sublanes) on TPU."""
  gp = next_pow2(g)
  if tgt == "cuda":
    gp = max(gp, TRITON_MIN_DOT)
  elif tgt == "tpu":
    gp = max(gp, TPU_SUBLANES)
  return gp


def compiler_params(tgt: str):
  """Triton for GPU (jax defaults Pallas-on-GPU to Mosaic GPU, which needs
  warpgroup-sized copies these kernels do not make); Mosaic on TPU, the
  split axis sequential ("arbitrary")."""
  if tgt == "interpret":
    return None
  if tgt == "tpu":
    return pltpu.CompilerParams(
        dimension_semantics=("parallel", "parallel", "arbitrary"))
  from jax.experimental.pallas import triton as pltriton  # pylint: disable=g-import-not-at-top
  return pltriton.CompilerParams(num_warps=4, num_stages=2)


def parts(layout: PackedLayout | None) -> int:
  return 1 if layout is None else layout.parts


def n_refs(layout: PackedLayout | None) -> int:
  """Arrays per cache tensor: codes, scale (and zero if asymmetric)."""
  if layout is None:
    return 1
  return 2 if layout.symmetric else 3


def dot_width_reason(layouts, head_dim: int) -> str | None:
  """Why Triton cannot dot these layouts' code planes, or None."""
  for layout, name in zip(layouts, ("k", "v")):
    width = head_dim // parts(layout)
    if width < TRITON_MIN_DOT:
      return (f"{name}: head_dim {head_dim} in {parts(layout)} code planes "
              f"gives {width}-wide dots; Triton's tl.dot needs >= "
              f"{TRITON_MIN_DOT} (use head_dim >= "
              f"{TRITON_MIN_DOT * parts(layout)} or the XLA path).")
  return None


def scale_planes(x_NxKxRxH: jax.Array, num_parts: int) -> jax.Array:
  """Token-group scales [N, K, R, H] -> [N, K, R, parts, H / parts], plane
  j holding channels parts*i + j."""
  n, k, r, h = x_NxKxRxH.shape
  return jnp.swapaxes(x_NxKxRxH.reshape(n, k, r, h // num_parts, num_parts),
                      -1, -2)


def query_planes(q_BxKxGxH: jax.Array, gp: int, k_parts: int) -> jax.Array:
  """q scaled by 1/sqrt(H), padded to gp heads, split into the key's code
  planes: [B, K, parts, Gp, H / parts], plane j = q[..., parts * i + j]."""
  b, k, g, h = q_BxKxGxH.shape
  q = q_BxKxGxH.astype(jnp.float32) * (1.0 / math.sqrt(h))
  q = jnp.pad(q, ((0, 0), (0, 0), (0, gp - g), (0, 0)))
  return jnp.moveaxis(q.reshape(b, k, gp, h // k_parts, k_parts), -1, 2)


# ----------------------------------------------------------------------------
# In the kernel.
# ----------------------------------------------------------------------------


def expand_scale(ref, layout: PackedLayout, plane: int, *, start,
                 block_k: int, split_start, plane_width: int):
  """Scale (or zero) of plane `plane` for rows [start, start + block_k).

  `split_start` is the token of the ref's row 0 (token-group scale rows are
  counted from its group). Returns a float32 array broadcastable to
  [block_k, plane_width].
  """
  if layout.scale_axis == -1:
    if layout.n_groups == 1:
      return ref[pl.ds(start, block_k), :].astype(jnp.float32)  # [bk, 1]
    # Plane column i is element parts*i+plane, in group i // (g / parts).
    cols_per_group = plane_width // layout.n_groups
    col_group = jax.lax.broadcasted_iota(
        jnp.int32, (1, plane_width), 1) // cols_per_group
    out = jnp.zeros((block_k, plane_width), jnp.float32)
    for r in range(layout.n_groups):
      col = ref[pl.ds(start, block_k), pl.ds(r, 1)].astype(jnp.float32)
      out = jnp.where(col_group == r, col, out)
    return out
  # Token-group scales in planes [rows, parts, H / parts]: plane j's column
  # i is channel parts*i + j.
  gt = layout.token_group
  rows_per_block = max(1, block_k // gt)
  first_row = (split_start + start) // gt - split_start // gt
  row_of = lambda r: ref[pl.ds(first_row + r, 1), plane, :].astype(
      jnp.float32).reshape(1, plane_width)
  if rows_per_block == 1:
    return row_of(0)  # [1, width]
  row_group = jax.lax.broadcasted_iota(jnp.int32, (block_k, 1), 0) // gt
  out = jnp.zeros((block_k, plane_width), jnp.float32)
  for r in range(rows_per_block):
    out = jnp.where(row_group == r, row_of(r), out)
  return out


def load_plane(refs, layout: PackedLayout | None, plane: int, *, start,
               block_k: int, split_start, plane_width: int):
  """Dequantized plane `plane` of rows [start, start + block_k): [bk, width]."""
  raw = refs[0][pl.ds(start, block_k), :]
  if layout is None:  # Dense cache.
    return raw.astype(jnp.float32)
  codes = raw.astype(jnp.int32)
  if layout.parts > 1:
    codes = (codes >> (layout.bits * plane)) & ((1 << layout.bits) - 1)
  codes = codes.astype(jnp.float32)
  expand = functools.partial(expand_scale, layout=layout, plane=plane,
                             start=start, block_k=block_k,
                             split_start=split_start, plane_width=plane_width)
  scale = expand(refs[1])
  if layout.symmetric:
    return (codes - float(layout.offset)) * scale
  return codes * scale + expand(refs[2])


def init_carry(gp: int, head_dim: int, v_parts: int):
  """(output planes, m, l) of an empty online softmax."""
  return (tuple(jnp.zeros((gp, head_dim // v_parts), jnp.float32)
                for _ in range(v_parts)),
          jnp.full((gp, 1), -jnp.inf, jnp.float32),
          jnp.zeros((gp, 1), jnp.float32))


def attend_block(qs, k_refs, v_refs, carry, *, k_layout, v_layout, start,
                 block_k: int, split_start, first_token, begin, end,
                 head_dim: int):
  """One block of the online softmax: rows [start, start + block_k) of the
  refs, holding tokens first_token + [0, block_k); tokens outside
  [begin, end) are masked. The caller visits only blocks holding at least
  one token of that range, so the running max stays finite.

  qs: the query's key planes, each [Gp, H / k_parts] float32 (pre-scaled).
  """
  o_planes, m_prev, l_prev = carry
  k_parts, v_parts = parts(k_layout), parts(v_layout)
  load = functools.partial(load_plane, start=start, block_k=block_k,
                           split_start=split_start)
  scores = None
  for j in range(k_parts):
    k_j = load(k_refs, k_layout, j, plane_width=head_dim // k_parts)
    s_j = jax.lax.dot_general(qs[j], k_j, (((1,), (1,)), ((), ())),
                              preferred_element_type=jnp.float32)
    scores = s_j if scores is None else scores + s_j  # [Gp, bk]
  pos = first_token + jax.lax.broadcasted_iota(jnp.int32, (1, block_k), 1)
  valid = (pos >= begin) & (pos < end)
  scores = jnp.where(valid, scores, -jnp.inf)
  m_next = jnp.maximum(m_prev, jnp.max(scores, axis=1, keepdims=True))
  correction = jnp.exp(m_prev - m_next)
  p = jnp.where(valid, jnp.exp(scores - m_next), 0.0)
  l_next = correction * l_prev + jnp.sum(p, axis=1, keepdims=True)
  new_planes = []
  for j in range(v_parts):
    v_j = load(v_refs, v_layout, j, plane_width=head_dim // v_parts)
    new_planes.append(correction * o_planes[j] + jnp.dot(
        p, v_j, preferred_element_type=jnp.float32))
  return tuple(new_planes), m_next, l_next


def split_outputs(batch: int, num_kv: int, splits: int, v_parts: int,
                  gp: int, head_dim: int, spec):
  """(out_shape, out_specs) of a split decode kernel: per (batch row, kv
  head, split) the unnormalised output planes, the running max and the
  running sum that `merge_splits` combines. `spec(block_shape, index_map)`
  builds a BlockSpec for the caller's grid (b, h, s)."""
  v_width = head_dim // v_parts
  stats = (batch, num_kv, splits, gp, 1)
  out_shape = [
      jax.ShapeDtypeStruct((batch, num_kv, splits, v_parts, gp, v_width),
                           jnp.float32),
      jax.ShapeDtypeStruct(stats, jnp.float32),
      jax.ShapeDtypeStruct(stats, jnp.float32),
  ]
  stat_spec = spec((None, None, None, gp, 1), lambda b, h, s: (b, h, s, 0, 0))
  out_specs = [
      spec((None, None, None, v_parts, gp, v_width),
           lambda b, h, s: (b, h, s, 0, 0, 0)),
      stat_spec, stat_spec,
  ]
  return out_shape, out_specs


def query_spec(k_parts: int, gp: int, head_dim: int, spec):
  """The BlockSpec of `query_planes`' output: one (batch row, kv head)."""
  return spec((None, None, k_parts, gp, head_dim // k_parts),
              lambda b, h, s: (b, h, 0, 0, 0))


def store_carry(o_ref, m_ref, l_ref, carry) -> None:
  o_planes, m_i, l_i = carry
  for j, plane in enumerate(o_planes):
    o_ref[j, :, :] = plane
  m_ref[...] = m_i
  l_ref[...] = l_i


# ----------------------------------------------------------------------------
# After the kernel.
# ----------------------------------------------------------------------------


def merge_splits(o, m, l, g: int, head_dim: int, return_lse: bool):
  """The splits' states merged by log-sum-exp (m = -inf for empty splits).

  o [B, K, ns, v_parts, Gp, W], m and l [B, K, ns, Gp, 1] -> out
  [B, K, G, H] (zeros where nothing was visible), and lse [B, K, G].
  """
  batch, num_kv = o.shape[:2]
  gp = o.shape[4]
  m_max = jnp.max(m, axis=2, keepdims=True)
  m_safe = jnp.where(jnp.isfinite(m_max), m_max, 0.0)
  correction = jnp.exp(m - m_safe)  # [B, K, ns, Gp, 1]; 0 for empty splits.
  l_sum = jnp.sum(l * correction, axis=2)  # [B, K, Gp, 1]
  o_sum = jnp.sum(o * correction[:, :, :, None], axis=2)  # [B, K, P, Gp, W]
  denom = jnp.where(l_sum > 0, l_sum, 1.0)
  out_planes = jnp.where(l_sum[:, :, None] > 0, o_sum / denom[:, :, None], 0.0)
  out = jnp.moveaxis(out_planes, 2, -1).reshape(batch, num_kv, gp, head_dim)
  out = out[:, :, :g]
  if not return_lse:
    return out
  lse = jnp.where(l_sum > 0, m_safe[:, :, 0] + jnp.log(denom), -jnp.inf)
  return out, lse[:, :, :g, 0]
