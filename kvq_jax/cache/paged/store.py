"""Paged storage: a pool of fixed-size pages and the block table into it.

A contiguous cache stores a tensor as leaves [B, K, C, ...] (slot ==
token). A paged pool stores the same leaves as [N, K, R, ...]: N pages,
each holding P tokens, R = P rows for a leaf with one row per token (codes,
outliers, a plain store) and R = P / g for a leaf with one row per g-token
group (a per-channel format's scales and zeros). A block table [B, M] names
the pool page holding each sequence's logical page j, tokens [j P, (j+1) P).
Entries past a sequence's pages point at page 0, the null page: the
allocator (`kvq_jax.serving.pages`) never hands it out, reads of it are
masked, and writes meant for nobody (an idle slot) land there.

16-bit float leaves (bfloat16 / float16 scales, a bfloat16 plain store) are
held as their uint16 bits. XLA:CPU has no 16-bit float arithmetic: its float
normalization would turn every scatter into a pool leaf into a float32
conversion of the whole pool and back, a pass over every page per step
(`cache.dense._select_slots` tells the same story for a contiguous
buffer). An integer scatter is done in place. Bits are bitcast back on the
rows read or written, never on the pool, so the round trip is bit-exact.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from kvq_jax.quant import QuantizedArray, QuantSpec

Store = QuantizedArray | jax.Array

_HALF = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def to_bits(x: jax.Array) -> jax.Array:
  """A 16-bit float leaf as its uint16 bits; any other leaf as it is."""
  if x.dtype in _HALF:
    return jax.lax.bitcast_convert_type(x, jnp.uint16)
  return x


def from_bits(x: jax.Array, dtype) -> jax.Array:
  """The inverse of `to_bits` for a leaf stored from `dtype`."""
  if x.dtype == jnp.uint16 and jnp.dtype(dtype) in _HALF:
    return jax.lax.bitcast_convert_type(x, jnp.dtype(dtype))
  return x


def _map(qspec: QuantSpec | None, fn, *stores: Store) -> Store:
  """The first store with each leaf replaced by `fn(per, dtype, *leaves)`,
  the leaves being that leaf of every store in turn.

  `per` is the tokens per row (a per-channel spec's group for scales and
  zeros, else 1); `dtype` the float dtype a 16-bit leaf was stored from:
  `qspec.scale_dtype` for scales, zeros and outlier values, None for codes,
  outlier indices and a plain store (whose dtype the caller knows).
  """
  if qspec is None:
    return fn(1, None, *stores)
  g = qspec.group_size if qspec.granularity == "per_channel" else 1
  sd = qspec.scale_dtype

  def leaf(name, per, dtype):
    xs = [getattr(st, name) for st in stores]
    return None if xs[0] is None else fn(per, dtype, *xs)

  return dataclasses.replace(
      stores[0], data=leaf("data", 1, None), scale=leaf("scale", g, sd),
      zero=leaf("zero", g, sd), outlier_value=leaf("outlier_value", 1, sd),
      outlier_index=leaf("outlier_index", 1, None))


def pool_store(store: Store, qspec: QuantSpec | None) -> Store:
  """An empty store shaped [N, K, P, ...] with 16-bit leaves as bits."""
  return _map(qspec, lambda per, dtype, x: to_bits(x), store)


def _rows_per_page(page_size: int, per: int) -> int:
  if page_size % per:
    raise ValueError(
        f"page size {page_size} is not a multiple of the token group {per}.")
  return page_size // per


def gather_block(pool: Store, table_BxM: jax.Array, start: jax.Array,
                 size: int, page_size: int, qspec: QuantSpec | None,
                 plain_dtype) -> Store:
  """Tokens [start, start + size) of every sequence as [B, K, size, ...].

  `start` (a scalar) and `size` are multiples of P, or the block lies inside
  one page (P a multiple of `size`, `start` a multiple of `size`). Whole
  pages are gathered: ceil(size / P) per sequence.
  """
  p = page_size
  num = max(1, size // p)
  pages_BxJ = jax.lax.dynamic_slice_in_dim(table_BxM, start // p, num, axis=1)

  def take(per, dtype, x):
    rows = _rows_per_page(p, per)
    g_BxJ = x[pages_BxJ]  # [B, J, K, R, ...]
    g = jnp.moveaxis(g_BxJ, 1, 2)
    g = g.reshape(g.shape[:2] + (num * rows,) + g.shape[4:])
    if size < p:
      g = jax.lax.dynamic_slice_in_dim(g, (start % p) // per, size // per,
                                       axis=2)
    return from_bits(g, plain_dtype if dtype is None else dtype)

  return _map(qspec, take, pool)


def _row_index(table_BxM, start_B, num_rows: int, per: int, page_size: int):
  """(page [B, L], row in page [B, L], inside [B, L]) of the rows of tokens
  [start_b, start_b + num_rows * per)."""
  rows = _rows_per_page(page_size, per)
  m = table_BxM.shape[1]
  row_BxL = (start_B[:, None] // per
             + jnp.arange(num_rows, dtype=jnp.int32)[None, :])
  logical_BxL = row_BxL // rows
  inside_BxL = logical_BxL < m
  page_BxL = jnp.take_along_axis(table_BxM, jnp.clip(logical_BxL, 0, m - 1),
                                 axis=1)
  return page_BxL, row_BxL % rows, inside_BxL


def gather_rows(pool: Store, table_BxM: jax.Array, start_B: jax.Array,
                size: int, page_size: int, qspec: QuantSpec | None,
                plain_dtype) -> Store:
  """Tokens [start_b, start_b + size) of sequence b, [B, K, size, ...];
  zeros past the block table (`slice_store(..., fill=True)`'s contract;
  start_b a multiple of the token group)."""
  def take(per, dtype, x):
    page_BxL, row_BxL, inside_BxL = _row_index(
        table_BxM, start_B, size // per, per, page_size)
    g = x[page_BxL, :, row_BxL]  # [B, L, K, ...]
    inside = inside_BxL.reshape(inside_BxL.shape + (1,) * (g.ndim - 2))
    g = jnp.moveaxis(jnp.where(inside, g, jnp.zeros((), g.dtype)), 1, 2)
    return from_bits(g, plain_dtype if dtype is None else dtype)

  return _map(qspec, take, pool)


def scatter_rows(pool: Store, table_BxM: jax.Array, rows_B: Store,
                 start_B: jax.Array, end_B: jax.Array, page_size: int,
                 qspec: QuantSpec | None) -> Store:
  """Tokens [start_b, end_b) of sequence b <- rows_B[b]'s first
  end_b - start_b rows ([B, K, L, ...]; start and end multiples of the
  token group). Rows past end_b are dropped: nothing is written out of
  range."""
  def put(per, _, x, src):
    num_rows = src.shape[2]
    page_BxL, row_BxL, inside_BxL = _row_index(
        table_BxM, start_B, num_rows, per, page_size)
    row_abs = start_B[:, None] // per + jnp.arange(num_rows)[None, :]
    keep = inside_BxL & (row_abs < (end_B // per)[:, None])
    page_BxL = jnp.where(keep, page_BxL, x.shape[0])  # dropped.
    return x.at[page_BxL, :, row_BxL].set(
        to_bits(jnp.moveaxis(src, 2, 1).astype(_source_dtype(src, x))),
        mode="drop")

  return _map(qspec, put, pool, rows_B)


def _source_dtype(src: jax.Array, pool_leaf: jax.Array):
  """The dtype a row is stored in: the pool leaf's, or for a 16-bit leaf
  held as bits, the row's own 16-bit float dtype."""
  if pool_leaf.dtype == jnp.uint16 and src.dtype in _HALF:
    return src.dtype
  return pool_leaf.dtype
