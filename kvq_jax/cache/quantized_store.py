"""Storage rows of a quantized layer cache (`cache/quantized.py`).

Storage is heads-major, [B, K, C, ...] (C = allocated slots, slot = token
index): a `QuantizedArray` (packed codes + per-group scales/zeros) or a
plain array when a tensor is left unquantized (`Store`). Here: building it
empty, writing token rows into it (`commit_rows`), slicing row ranges out
of it (`slice_store`) and reading them back as float32 (`read_store`) or
as bit planes (`read_planes`). A leaf holds one row per token (codes,
outliers) or one row per token group (a per-channel format's scales and
zeros: `token_group`); `map_store` applies a row operation to each leaf
with the right row count.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from kvq_jax.cache.attention import per_iteration
from kvq_jax.quant import QuantizedArray, QuantSpec, dequantize, quantize
from kvq_jax.quant.planes import dequantize_planes, nonfinite_rows, plane_count

Store = QuantizedArray | jax.Array


def round_up(x: int, m: int) -> int:
  return -(-x // m) * m


def token_group(spec: QuantSpec | None) -> int:
  if spec is not None and spec.granularity == "per_channel":
    return spec.group_size
  return 1


def map_store(token_fn, group_fn, *stores: QuantizedArray) -> QuantizedArray:
  """The first store with each leaf replaced by `token_fn` (data, outliers:
  one row per token) or `group_fn` (scale, zero: one row per token group)
  applied to that leaf of every store in turn; absent leaves stay None."""
  def leaf(fn, name):
    values = [getattr(st, name) for st in stores]
    return None if values[0] is None else fn(*values)

  return dataclasses.replace(
      stores[0], data=leaf(token_fn, "data"), scale=leaf(group_fn, "scale"),
      zero=leaf(group_fn, "zero"),
      outlier_value=leaf(token_fn, "outlier_value"),
      outlier_index=leaf(token_fn, "outlier_index"))


def empty_store(spec: QuantSpec | None, shape, dtype) -> Store:
  """All-zero storage (codes, scales and zeros 0), built without quantizing.

  Quantizing a zeros constant inside `jit` would make XLA constant-fold the
  whole reduction at compile time; zero leaves of the right shapes are equal.
  """
  if spec is None:
    return jnp.zeros(shape, dtype)
  abstract = jax.eval_shape(lambda: quantize(jnp.zeros(shape, dtype), spec))
  return jax.tree_util.tree_map(lambda a: jnp.zeros(a.shape, a.dtype),
                                abstract)


def _put_rows(dst: jax.Array, src: jax.Array, start: jax.Array,
              end: jax.Array) -> jax.Array:
  """dst[:, start:end] = src[:, :end - start] (one sequence, [K, C, ...]).

  A scatter, except for one row into a bfloat16 leaf (scales, unquantized
  tensors: a token-local decode step) on XLA:CPU: its float normalization
  would convert the whole leaf to float32 and back around the scatter every
  step (a pass over every slot, however few are filled), so the row is
  selected into the leaf's uint16 view instead, as
  `cache.dense.write_slots` does: bit-exact, and fused in place. Several
  rows (prefill, a per-channel window's commit) still scatter: selecting
  them would gather over every slot.
  """
  src = src.astype(dst.dtype)
  if dst.dtype == jnp.bfloat16 and src.shape[1] == 1:
    return jax.lax.platform_dependent(dst, src, start, end, cpu=_select_rows,
                                      default=_scatter_rows)
  return _scatter_rows(dst, src, start, end)


def _scatter_rows(dst, src, start, end):
  capacity, rows = dst.shape[1], src.shape[1]
  row_L = jnp.arange(rows)
  index_L = jnp.where(row_L < end - start, start + row_L, capacity)
  return dst.at[:, index_L].set(src, mode="drop")  # out of range: dropped.


def _select_rows(dst, src, start, end):
  """`_put_rows` of one row: a select on the uint16 views."""
  capacity = dst.shape[1]
  offset_C = jnp.arange(capacity) - start
  inside_C = (offset_C >= 0) & (offset_C < end - start)
  bits = lambda x: jax.lax.bitcast_convert_type(x, jnp.uint16)
  picked = jnp.broadcast_to(bits(src), dst.shape)
  inside = inside_C.reshape((1, capacity) + (1,) * (dst.ndim - 2))
  return jax.lax.bitcast_convert_type(jnp.where(inside, picked, bits(dst)),
                                      jnp.bfloat16)


def per_block_scales(stores, index: jax.Array):
  """`stores` with their scales and zeros tied to the loop index
  (`cache.attention.per_iteration`), so a storage loop converts them block
  by block instead of converting the whole allocation's before the loop (a
  pass over every slot per step, whatever the filled length). The codes
  are left alone: XLA does not hoist their unpacking, and a barrier on them
  stops the block's slice from fusing into its dequantization (slower
  steps in a scratch timing; not kept)."""
  def tie(store):
    if not isinstance(store, QuantizedArray):
      return store
    scale, zero = per_iteration((store.scale, store.zero), index)
    return dataclasses.replace(store, scale=scale, zero=zero)
  return tuple(tie(store) for store in stores)


def commit_rows(store: Store, rows: Store, start: jax.Array, end: jax.Array,
                 spec: QuantSpec | None) -> Store:
  """Tokens [start, end) of storage <- rows [0, end - start) ([K, C, ...]
  per sequence; start and end are multiples of the token group, so a
  per-channel group's scale and zero commit only when it is whole)."""
  if spec is None:
    return _put_rows(store, rows, start, end)
  g = token_group(spec)
  return map_store(lambda d, r: _put_rows(d, r, start, end),
                   lambda d, r: _put_rows(d, r, start // g, end // g),
                   store, rows)


def slice_store(store: Store, start: jax.Array, size: int,
                 spec: QuantSpec | None, fill: bool = False) -> Store:
  """Slots [start, start + size) of [B, K, C, ...] storage (start % g == 0).

  `fill` reads slots past the allocation as zeros (a gather); otherwise the
  slice must lie inside it (a dynamic slice, which would clamp the start).
  `start` is a scalar, or [B] with `fill`.
  """
  def take(x, begin, length):
    if not fill:
      return jax.lax.dynamic_slice_in_dim(x, begin, length, axis=2)
    index = jnp.reshape(begin, (-1, 1)) + jnp.arange(length)
    index = jnp.broadcast_to(index, (x.shape[0], length))
    return jax.vmap(lambda xb, ib: jnp.take(xb, ib, axis=1, mode="fill",
                                            fill_value=0))(x, index)

  if spec is None:
    return take(store, start, size)
  g = token_group(spec)
  return map_store(lambda x: take(x, start, size),
                   lambda x: take(x, start // g, size // g), store)


def read_store(store: Store, spec: QuantSpec | None) -> jax.Array:
  return (store if spec is None else dequantize(store, jnp.float32)).astype(
      jnp.float32)


def read_planes(store: Store, spec: QuantSpec | None) -> tuple[jax.Array, ...]:
  """A block as float32 bit planes where its format packs several codes in
  a byte (`quant.planes`), else as one dequantized plane."""
  if plane_count(spec) > 1:
    return dequantize_planes(store)
  return (read_store(store, spec),)


def read_value_planes(store: Store, spec: QuantSpec | None):
  """(planes, bad rows or None): `read_planes` of a value block, and for bit
  planes the rows with a non-finite scale or zero, zeroed in the planes
  (`planar_block_attention`'s v_bad). Keys are not zeroed: a query that
  sees a non-finite key gets a NaN score."""
  planes = read_planes(store, spec)
  if len(planes) == 1:
    return planes, None
  bad = nonfinite_rows(store)
  return tuple(jnp.where(bad[..., None], 0.0, x) for x in planes), bad


def storage_rows(e_KxLxH: jax.Array, qspec: QuantSpec | None,
                 dtype) -> Store:
  """Rows of E as storage receives them: quantized, or cast to `dtype` for
  an unquantized tensor."""
  e = e_KxLxH.astype(dtype)
  return e if qspec is None else quantize(e, qspec)
