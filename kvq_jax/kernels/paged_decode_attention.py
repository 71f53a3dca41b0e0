"""Paged flash-decoding Pallas kernel over a quantized page pool.

The contiguous kernel (`decode_attention.py`) reads storage [B, K, S, ...];
a paged cache (`kvq_jax.cache.paged`) keeps the same packed leaves in a pool
[N, K, R, ...] of N pages of P tokens (R = P rows for codes and row scales,
P / g for a per-channel format's token-group scales and zeros), and a block
table [B, M] names the pool page holding tokens [j P, (j+1) P) of sequence
b (entries past its pages are 0, the null page). Sequence b sees the tokens
[start_b, end_b), as `decode_attention` sees its slots.

The program is the contiguous kernel's, block for block (`flash_parts`): the
grid is (B, K, M / pages_per_block); each program owns one KV head of one
sequence and a split of `pages_per_block` consecutive logical pages, keeps
all G query heads in one [G, H] block, runs an online softmax over its pages
(one page per block, codes unpacked into code planes and dequantized with
their scales inside the kernel) and writes its (out, m, l); the splits are
merged by log-sum-exp afterwards. Only where a page's rows come from
differs, by target:

* "tpu" (Mosaic), as jax's `pallas/ops/tpu/paged_attention` does it: the
  block table (flattened to [B * M]), starts and ends arrive by scalar
  prefetch (SMEM), and each pool leaf is passed `pages_per_block` times,
  input r's index_map picking pool page table[b, s * ppb + r] (clamped to
  the sequence's last page, so no page past its end is copied), so the
  pipeline DMAs the split's pages into VMEM while the previous split runs.
  Pages holding no visible token are skipped (`lax.cond`). Token-group
  scales are split into code planes outside the kernel, [N, K, R, parts,
  H / parts] (a pass over the pool's per-channel scales per call; Mosaic
  has no lane-strided load), so every block's last two dims are whole.
* "cuda" (Triton, which has no scalar prefetch) and the interpreter: each
  pool leaf is one whole-pool block per KV head ([N, R, ...], a pointer on
  GPU) beside the sequence's table row, and the kernel loops over the
  split's filled pages only, reading page table[b, j] in one indexer
  (`_PageRef`: Triton lowers no composed `.at` views); token-group scale
  planes are strided loads of the stored [R, H] rows, not a copy.
  `interpret=True, platform="tpu"` runs the scalar-prefetch program in the
  interpreter, so both programs are checked on a CPU host.

16-bit float scales and zeros may be held as their uint16 bits (the paged
store's pools are); they are bitcast back in the wrapper from
`spec.scale_dtype` (a reinterpretation, no pass over the pool).
`paged_decode_attention_supported` says why a pool, a shape or a platform
cannot be served (the formats are `cache_layout.describe_packed`'s:
int8/int4/int2 codes with per-token, per-group or per-channel scales).
`paged_decode_attention_reference` gathers the pages and attends in jnp.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
import jax.numpy as jnp

from kvq_jax.kernels import flash_parts as fp
from kvq_jax.kernels.cache_layout import PackedLayout, describe_packed
from kvq_jax.kernels.reference import decode_attention_reference

__all__ = ["paged_decode_attention", "paged_decode_attention_reference",
           "paged_decode_attention_supported"]

DEFAULT_PAGES_PER_BLOCK = 8
_CALLER = "paged_decode_attention"
_HALF = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def _float_leaf(x, dtype):
  """A leaf held as uint16 bits back as the 16-bit float `dtype`."""
  if x is not None and x.dtype == jnp.uint16 and jnp.dtype(dtype) in _HALF:
    return jax.lax.bitcast_convert_type(x, jnp.dtype(dtype))
  return x


def _float_pool(pool):
  """`pool` with its scale, zero and outlier values as floats."""
  dtype = pool.spec.scale_dtype
  return dataclasses.replace(
      pool, scale=_float_leaf(pool.scale, dtype),
      zero=_float_leaf(pool.zero, dtype),
      outlier_value=_float_leaf(pool.outlier_value, dtype))


def _resolve_pages_per_block(pages_per_block, table_width: int) -> int | str:
  """Pages per split actually used, or why they do not tile the table."""
  if pages_per_block is None:
    ppb = min(DEFAULT_PAGES_PER_BLOCK, table_width)
    while table_width % ppb:
      ppb -= 1
    return ppb
  if isinstance(pages_per_block, bool) or not isinstance(
      pages_per_block, int) or pages_per_block < 1 \
      or table_width % pages_per_block:
    return (f"pages_per_block={pages_per_block!r}: must be a positive "
            f"divisor of the block table's {table_width} pages per sequence.")
  return pages_per_block


def _scale_reason(pool, name: str) -> str | None:
  dtype = pool.spec.scale_dtype
  for leaf, what in ((pool.scale, "scale"), (pool.zero, "zero")):
    if leaf is None:
      continue
    if leaf.dtype == jnp.uint16 and jnp.dtype(dtype) not in _HALF:
      return (f"{name}.{what} holds uint16 but spec.scale_dtype={dtype!r}; "
              "uint16 pool leaves are the bits of a bfloat16 / float16 "
              "scale_dtype.")
    if leaf.dtype != jnp.uint16 and not jnp.issubdtype(leaf.dtype,
                                                         jnp.floating):
      return f"{name}.{what}.dtype={leaf.dtype}; expected a float scale."
  return None


def paged_decode_attention_supported(q_BxKxGxH, k_pool, v_pool,
                                     block_table_BxM, end_B, *,
                                     start_B=None, page_size: int,
                                     pages_per_block: int | None = None,
                                     platform: str | None = None,
                                     interpret: bool = False) -> str | None:
  """Why `paged_decode_attention` cannot run on these inputs (on
  `platform`, see the module docstring), or None if it can."""
  reason = fp.platform_reason(platform)
  if reason:
    return reason
  if not hasattr(k_pool, "data") or not hasattr(v_pool, "data"):
    return ("k_pool and v_pool must be kvq_jax.quant.QuantizedArray page "
            "pools [N, K, P, H*bits/8]; a plain full-precision pool is read "
            "by the XLA path.")
  if k_pool.data.ndim != 4:
    return (f"k_pool.data has shape {tuple(k_pool.data.shape)}; expected the "
            "page pool [N, K, P, H*bits/8].")
  num_pages, num_kv, p = k_pool.data.shape[:3]
  if p != page_size:
    return (f"the pool's pages hold {p} tokens (k_pool.data.shape[2]), "
            f"page_size={page_size}; they must match.")
  if q_BxKxGxH.ndim != 4 or q_BxKxGxH.shape[1] != num_kv:
    return (f"q has shape {tuple(q_BxKxGxH.shape)}; expected [B, K={num_kv}, "
            "G, H] (one query token per sequence, query heads grouped by KV "
            "head).")
  batch, _, _, head_dim = q_BxKxGxH.shape
  table = block_table_BxM
  if table.ndim != 2 or table.shape[0] != batch \
      or not jnp.issubdtype(table.dtype, jnp.integer):
    return (f"block_table has shape {tuple(table.shape)} and dtype "
            f"{table.dtype}; expected integer [B={batch}, M].")
  for arr, what in ((end_B, "end_B"), (start_B, "start_B")):
    if arr is not None and tuple(jnp.shape(arr)) != (batch,):
      return (f"{what} has shape {tuple(jnp.shape(arr))}; expected "
              f"[B={batch}].")
  layouts = [describe_packed(x, head_dim, n, p)
             for x, n in ((k_pool, "k_pool"), (v_pool, "v_pool"))]
  for layout in layouts:
    if isinstance(layout, str):
      return layout
  if tuple(v_pool.data.shape[:3]) != (num_pages, num_kv, p):
    return (f"v_pool.data has shape {tuple(v_pool.data.shape)}; K and V "
            f"pools must share [N, K, P] = {(num_pages, num_kv, p)}.")
  for pool, name in ((k_pool, "k_pool"), (v_pool, "v_pool")):
    reason = _scale_reason(pool, name)
    if reason:
      return reason
  ppb = _resolve_pages_per_block(pages_per_block, table.shape[1])
  if isinstance(ppb, str):
    return ppb
  if fp.target(interpret, platform, _CALLER) == "cuda":
    if not fp.is_pow2(p):
      return (f"page_size={p}: Triton loads a page's rows as one block, "
              "whose size must be a power of two.")
    return fp.dot_width_reason(layouts, head_dim)
  return None


# ----------------------------------------------------------------------------
# Kernel.
# ----------------------------------------------------------------------------


class _PageRef:
  """A whole-pool ref [N, R, ...] read as page `page`'s rows [R, ...].

  `ref[idx]` becomes `pool[(page,) + idx]`, one indexer (Triton lowers no
  composed views). With `planes` (token-group scales), `ref[rows, j, :]`
  reads plane j of the stored [R, H] rows, channels j, j + planes, ...: a
  strided load, [len(rows), H / planes].
  """

  def __init__(self, ref, page, planes: int = 0):
    self.ref, self.page, self.planes = ref, page, planes

  def __getitem__(self, idx):
    if self.planes:
      rows, plane, _ = idx
      width = self.ref.shape[-1] // self.planes
      return self.ref[self.page, rows,
                      pl.ds(plane, width, stride=self.planes)]
    return self.ref[(self.page,) + tuple(idx)]


def _page_refs(refs, layout: PackedLayout, page):
  planes = layout.parts if layout.scale_axis == -2 else 0
  return [_PageRef(refs[0], page)] + [_PageRef(r, page, planes)
                                       for r in refs[1:]]


def _paged_kernel(start_ref, end_ref, table_ref, q_ref, *refs, k_layout,
                  v_layout, page_size: int, pages_per_block: int,
                  head_dim: int, prefetch: bool):
  nk, nv = fp.n_refs(k_layout), fp.n_refs(v_layout)
  per_page = nk + nv
  n_in = per_page * (pages_per_block if prefetch else 1)
  o_ref, m_ref, l_ref = refs[n_in:]
  gp = q_ref.shape[1]
  split = pl.program_id(2)
  split_len = pages_per_block * page_size
  split_start = split * split_len
  if prefetch:  # [B] in SMEM (TPU)
    b = pl.program_id(0)
    begin, end = start_ref[b], end_ref[b]
  else:  # this sequence's own [] blocks
    begin, end = start_ref[()], end_ref[()]
  qs = [q_ref[j, :, :].astype(jnp.float32)
        for j in range(fp.parts(k_layout))]
  attend = functools.partial(
      fp.attend_block, qs, k_layout=k_layout, v_layout=v_layout, start=0,
      block_k=page_size, split_start=0, begin=begin, end=end,
      head_dim=head_dim)
  carry = fp.init_carry(gp, head_dim, fp.parts(v_layout))

  if prefetch:  # Input r holds logical page split * ppb + r.
    for r in range(pages_per_block):
      page_refs = refs[r * per_page:(r + 1) * per_page]
      token = split_start + r * page_size
      # The page holds a visible token: [token, token + P) meets [begin, end).
      visit = jnp.maximum(token, begin) < jnp.minimum(token + page_size, end)
      carry = jax.lax.cond(
          visit,
          lambda c, pr=page_refs, t=token: attend(pr[:nk], pr[nk:], c,
                                                  first_token=t),
          lambda c: c, carry)
  else:  # Whole-pool refs: this split's filled pages, through the table.
    lo = jnp.clip(begin - split_start, 0, split_len)
    hi = jnp.clip(end - split_start, 0, split_len)
    first = lo // page_size
    last = jnp.where(hi > lo, (hi + page_size - 1) // page_size, first)

    def body(i, carry):
      page = table_ref[split * pages_per_block + i]
      return attend(_page_refs(refs[:nk], k_layout, page),
                    _page_refs(refs[nk:per_page], v_layout, page), carry,
                    first_token=split_start + i * page_size)

    carry = jax.lax.fori_loop(first, last, body, carry)
  fp.store_carry(o_ref, m_ref, l_ref, carry)


def _pool_arrays(pool, layout: PackedLayout, planes: bool) -> list:
  """Codes, scale (, zero) of a pool; token-group scales split into code
  planes if `planes`."""
  pool = _float_pool(pool)
  scales = [pool.scale] + ([] if layout.symmetric else [pool.zero])
  if planes and layout.scale_axis == -2:
    scales = [fp.scale_planes(a, layout.parts) for a in scales]
  return [pool.data] + scales


def _run(q_BxKxGxH, k_pool, v_pool, table_BxM, start_B, end_B, k_layout,
         v_layout, *, page_size: int, pages_per_block: int, interpret: bool,
         platform: str | None, return_lse: bool):
  batch, num_kv, g, head_dim = q_BxKxGxH.shape
  width = table_BxM.shape[1]
  ppb = pages_per_block
  splits = width // ppb
  k_parts, v_parts = fp.parts(k_layout), fp.parts(v_layout)
  tgt = fp.target(interpret, platform, _CALLER)
  prefetch = tgt == "tpu" or platform == "tpu"
  gp = fp.padded_heads(g, "tpu" if prefetch else tgt)
  q_planes = fp.query_planes(q_BxKxGxH, gp, k_parts)
  arrays = (_pool_arrays(k_pool, k_layout, prefetch)
            + _pool_arrays(v_pool, v_layout, prefetch))

  def spec(block_shape, index_map):
    if prefetch:  # Index maps also receive the scalar-prefetch refs.
      return pl.BlockSpec(block_shape, lambda b, h, s, *_: index_map(b, h, s))
    return pl.BlockSpec(block_shape, index_map)

  if prefetch:
    def page_spec(a, r):
      zeros = (0,) * (a.ndim - 2)

      def index_map(b, h, s, start_ref, end_ref, table_ref):
        del start_ref
        last = jnp.maximum((end_ref[b] - 1) // page_size, 0)
        j = jnp.minimum(s * ppb + r, last)
        return (table_ref[b * width + j], h) + zeros
      return pl.BlockSpec((None, None) + a.shape[2:], index_map)
    pool_specs = [page_spec(a, r) for r in range(ppb) for a in arrays]
    pool_args = arrays * ppb
  else:
    pool_specs = [pl.BlockSpec(
        (a.shape[0], None) + a.shape[2:],
        lambda b, h, s, n=a.ndim - 2: (0, h) + (0,) * n) for a in arrays]
    pool_args = arrays

  out_shape, out_specs = fp.split_outputs(
      batch, num_kv, splits, v_parts, gp, head_dim, spec)
  in_specs = [fp.query_spec(k_parts, gp, head_dim, spec)]
  in_specs += pool_specs
  grid = (batch, num_kv, splits)
  table = table_BxM.astype(jnp.int32)
  if prefetch:  # starts, ends and the flattened table by scalar prefetch
    grid_kw = dict(grid_spec=pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=3, grid=grid, in_specs=in_specs,
        out_specs=out_specs))
    table = table.reshape(-1)
  else:
    row = pl.BlockSpec((None,), lambda b, h, s: (b,))
    table_spec = pl.BlockSpec((None, width), lambda b, h, s: (b, 0))
    grid_kw = dict(grid=grid, in_specs=[row, row, table_spec] + in_specs,
                   out_specs=out_specs)
  kernel = functools.partial(
      _paged_kernel, k_layout=k_layout, v_layout=v_layout,
      page_size=page_size, pages_per_block=ppb, head_dim=head_dim,
      prefetch=prefetch)
  o, m, l = pl.pallas_call(
      kernel,
      out_shape=out_shape,
      interpret=interpret,
      compiler_params=fp.compiler_params(tgt),
      name="kvq_paged_decode_attention",
      **grid_kw,
  )(start_B.astype(jnp.int32), end_B.astype(jnp.int32), table, q_planes,
    *pool_args)
  return fp.merge_splits(o, m, l, g, head_dim, return_lse)


@functools.partial(jax.jit, static_argnames=("page_size", "pages_per_block",
                                             "interpret", "platform",
                                             "return_lse"))
def paged_decode_attention(q_BxKxGxH: jax.Array, k_pool, v_pool,
                           block_table_BxM: jax.Array, end_B: jax.Array, *,
                           start_B: jax.Array | None = None, page_size: int,
                           pages_per_block: int | None = None,
                           interpret: bool = False,
                           platform: str | None = None,
                           return_lse: bool = False):
  """Attention of one query token per sequence over a paged packed cache.

  Args:
    q_BxKxGxH: queries (post-RoPE, rotated like the stored keys), G query
      heads per KV head.
    k_pool: keys, a QuantizedArray page pool [N, K, P, ...] (16-bit scales
      may be held as uint16 bits).
    v_pool: values, same [N, K, P]; its format may differ from k_pool's.
    block_table_BxM: int [B, M]; entry j names the pool page holding
      sequence b's tokens [j P, (j + 1) P).
    end_B: int [B]; tokens >= end_b are masked.
    start_B: int [B] or None (zeros); tokens < start_b are masked.
    page_size: P, tokens per page (the pool's).
    pages_per_block: logical pages per split (grid axis), merged by
      log-sum-exp; None picks the largest divisor of M <= 8.
    interpret: run the Pallas interpreter (required on CPU).
    platform: None (the default backend), "cuda" or "tpu" (module
      docstring); with `interpret`, "tpu" interprets the TPU program.
    return_lse: also return the natural-log log-sum-exp [B, K, G] of the
      scaled scores (-inf where nothing is visible).

  Returns:
    out [B, K, G, H] float32 (zeros where start_b >= end_b), and lse if
    asked.

  Raises:
    ValueError: see `paged_decode_attention_supported`.
  """
  reason = paged_decode_attention_supported(
      q_BxKxGxH, k_pool, v_pool, block_table_BxM, end_B, start_B=start_B,
      page_size=page_size, pages_per_block=pages_per_block,
      platform=platform, interpret=interpret)
  if reason:
    raise ValueError(f"{_CALLER}: {reason}")
  head_dim = q_BxKxGxH.shape[-1]
  k_layout = describe_packed(k_pool, head_dim, "k_pool", page_size)
  v_layout = describe_packed(v_pool, head_dim, "v_pool", page_size)
  ppb = _resolve_pages_per_block(pages_per_block, block_table_BxM.shape[1])
  start_B = jnp.zeros_like(end_B) if start_B is None else start_B
  return _run(q_BxKxGxH, k_pool, v_pool, block_table_BxM, start_B, end_B,
              k_layout, v_layout, page_size=page_size, pages_per_block=ppb,
              interpret=interpret, platform=platform, return_lse=return_lse)


# ----------------------------------------------------------------------------
# Reference.
# ----------------------------------------------------------------------------


def gather_pages(pool, block_table_BxM: jax.Array):
  """A page pool [N, K, R, ...] read through the block table as the
  contiguous [B, K, M * R, ...] cache it stands for (16-bit scales held as
  bits back as floats); a plain pool likewise."""
  def take(x):
    if x is None:
      return None
    g = jnp.moveaxis(x[block_table_BxM], 1, 2)  # [B, K, M, R, ...]
    return g.reshape(g.shape[:2] + (-1,) + g.shape[4:])

  if not hasattr(pool, "data"):
    return take(pool)
  pool = _float_pool(pool)
  return dataclasses.replace(
      pool, data=take(pool.data), scale=take(pool.scale),
      zero=take(pool.zero), outlier_value=take(pool.outlier_value),
      outlier_index=take(pool.outlier_index))


@functools.partial(jax.jit, static_argnames=("page_size", "return_lse"))
def paged_decode_attention_reference(q_BxKxGxH: jax.Array, k_pool, v_pool,
                                     block_table_BxM: jax.Array,
                                     end_B: jax.Array, *,
                                     start_B: jax.Array | None = None,
                                     page_size: int,
                                     return_lse: bool = False):
  """`paged_decode_attention` in jnp: gather every table page into a
  contiguous cache, dequantize it, attend (`decode_attention_reference`)."""
  data = k_pool.data if hasattr(k_pool, "data") else k_pool
  if data.shape[2] != page_size:
    raise ValueError(
        f"paged_decode_attention_reference: the pool's pages hold "
        f"{data.shape[2]} tokens, page_size={page_size}.")
  return decode_attention_reference(
      q_BxKxGxH, gather_pages(k_pool, block_table_BxM),
      gather_pages(v_pool, block_table_BxM), end_B, return_lse=return_lse,
      start_B=start_B)
