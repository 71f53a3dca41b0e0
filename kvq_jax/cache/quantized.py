"""Quantized KV cache for one layer: packed storage + full-precision regions.

Storage is heads-major, [B, K, C, H] (C = allocated slots, slot = token
index), as `QuantizedArray`s (packed codes + per-group scales/zeros), or as a
plain array when only one of K/V is quantized. Full-precision regions (see
`cache/spec.py`), in `spec.window_dtype`: `sink` slots for the first tokens
and, per tensor x in {K, V}, a window holding its tokens [Q_x(n), n) not yet
flushed to storage (Q_x uses x's own flush block F_x, so a token-local V is
committed as it is written even when per-channel K waits for its group).

Each `attend` call with T new tokens (old length n0, new length n1), per
tensor x:
  1. builds E_x, x's full-precision tokens [Q_x(n0), Q_x(n0) + W_x + T): the
     old window followed by the new tokens (keys post-RoPE unless key_rope ==
     'pre', Hadamard-rotated if asked; rounded to window_dtype when x keeps
     a window, so a token waits in the same precision in prefill and decode);
  2. quantizes E_x and commits its tokens [Q_x(n0), Q_x(n1)) into storage (a
     scatter that drops every other row: nothing is written out of range);
  3. keeps [Q_x(n1), n1) as the new window and fills the sink slots.
Then it attends: query token i = n0 + t sees, for every past token j <= i,
x's full-precision copy if j < S or j >= Q_x(i + 1), else the dequantized
one. That is exactly what streaming decode would hold when it processed
token i, so chunked prefill and token-by-token decode agree. With F_lo >= F_hi
the tensor that commits last ("lo", smaller Q), the past splits into
  sinks [0, S)                    both full precision
  storage [S, Q_lo(i + 1))        both dequantized, read block by block
  mixed [Q_lo(i + 1), Q_hi(i + 1)) lo full precision, hi dequantized
  window [Q_hi(i + 1), i]         both full precision.
The storage segment is read block by block (`lax.fori_loop` with online
softmax) and only up to the longest filled length in the batch, so a decode
step's work grows with the tokens held, not with the capacity; it never
materializes a full-precision copy of the cache. The other segments are
merged by log-sum-exp.

With `spec.attention_impl` selecting "pallas", a decode step (T == 1) reads
the storage segment [S, Q_lo(n0 + 1)) with the flash-decoding kernel of
`kvq_jax.kernels` instead of the loop (start_B = S, length_B = Q_lo(n0 + 1));
its (out, lse) is merged with the other segments by log-sum-exp. The kernel
dots the stored keys with the query directly, so it cannot read pre-RoPE
keys, and it needs packed int8/int4/int2 storage for both K and V; where it
cannot run, an explicit "pallas" raises ValueError and a tuple such as
("pallas", "xla") falls back to the loop with a warning (at trace time).
Prefill (T > 1) always uses the loop.

Sliding-window (local) layers use `cache/sliding_quantized.py`, which keeps
the same formats and windows with ring-buffer storage, built on the helpers
here (`fresh_tokens`, `incoming_tokens`, `keys_for_scores`, ...).

Positions: the cache assumes token i sits at position i (slot == position),
which is what pre-RoPE keys are rotated with at read time. With
key_rope='pre', other positions are refused (`check_positions`: eagerly
here when the positions are concrete, and by `Runtime` before every jitted
call).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from kvq_jax.cache import hadamard
from kvq_jax.cache.attention import (block_attention, merge_states,
                                     per_iteration, planar_block_attention)
from kvq_jax.cache.code_lookup import lookup_block_attention, query_table
from kvq_jax.cache.folded_attention import folded_block_attention, folds_scales
from kvq_jax.cache.spec import LayerSpec
from kvq_jax.kernels.decode_attention import DEFAULT_BLOCK_K, decode_attention
from kvq_jax.kernels.dispatch import (choose_implementation,
                                      pallas_unsupported_reason,
                                      resolve_interpret)
from kvq_jax.models.rope import Rope
from kvq_jax.quant import (QuantizedArray, QuantSpec, constant_arrays,
                           has_fixed_table,
                           dequantize, quantize)
from kvq_jax.quant.planes import dequantize_planes, nonfinite_rows, plane_count

Store = QuantizedArray | jax.Array


def round_up(x: int, m: int) -> int:
  return -(-x // m) * m


def committed_end(n: jax.Array, spec: LayerSpec,
                  flush: int | None = None) -> jax.Array:
  """Q(n): tokens [S, Q(n)) are in quantized storage after n tokens.

  `flush` None uses the larger of F_k, F_v (the tensor that commits last).
  """
  s, r = spec.sink, spec.residual
  f = spec.flush_block if flush is None else flush
  return s + f * (jnp.maximum(0, n - s - r) // f)


def check_positions(spec: LayerSpec, positions_BxT, length_B) -> None:
  """ValueError if pre-RoPE keys would be rotated by the wrong positions.

  With key_rope='pre' the cache rotates a stored key by its slot index at
  read time, so token t of sequence b must sit at position length_b + t.
  Only concrete (non-traced) arrays are checked.
  """
  if spec.key_rope != "pre" or isinstance(positions_BxT, jax.core.Tracer) \
      or isinstance(length_B, jax.core.Tracer):
    return
  positions = np.asarray(positions_BxT)
  expected = (np.asarray(length_B)[:, None]
              + np.arange(positions.shape[1])[None, :])
  if not np.array_equal(positions, expected):
    raise ValueError(
        "key_rope='pre' rotates stored keys by their slot index, so the "
        "positions must equal length_b + [0, T) (got positions "
        f"{positions.tolist()[:2]}..., expected {expected.tolist()[:2]}...); "
        "use key_rope='post' for arbitrary positions.")


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


def _commit_rows(store: Store, rows: Store, start: jax.Array, end: jax.Array,
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


def pre_rope_key_planes(spec: LayerSpec, kb: Store, rope: Rope,
                        cos_L: jax.Array, sin_L: jax.Array):
  """A block of stored pre-RoPE keys, each rotated by its offset l in the
  block ((cos, sin) [L, rotary_dim/2] of the offsets): as bit planes, each
  turned by its strided angles (`Rope.rotate`), when the keys need nothing
  else undone and the pairs stay inside a plane; else as one plane."""
  p = plane_count(spec.k)
  if (p > 1 and not spec.hadamard_k and spec.key_affine is None
      and cos_L.shape[-1] % p == 0):
    planes = read_planes(kb, spec.k)
    return tuple(rope.rotate(x, cos_L[:, j::p], sin_L[:, j::p])
                 for j, x in enumerate(planes))
  return (rope.rotate(unrotated_keys(spec, read_store(kb, spec.k)), cos_L,
                      sin_L),)


def incoming_tokens(spec: LayerSpec, k_BxTxKxH: jax.Array,
                    v_BxTxKxH: jax.Array, positions_BxT: jax.Array,
                    rope: Rope) -> tuple[jax.Array, jax.Array]:
  """The T new keys and values in the stored convention, [B, K, T, H] f32.

  Keys are rotated by RoPE unless key_rope == 'pre', shifted and scaled by
  the calibrated key affine if any; keys / values are Hadamard-rotated where
  the spec asks.
  """
  k_new = k_BxTxKxH if spec.key_rope == "pre" else rope(k_BxTxKxH,
                                                        positions_BxT)
  k_new_BxKxTxH = jnp.swapaxes(k_new, 1, 2).astype(jnp.float32)
  v_new_BxKxTxH = jnp.swapaxes(v_BxTxKxH, 1, 2).astype(jnp.float32)
  if spec.key_affine is not None:
    k_new_BxKxTxH = spec.key_affine.normalize(k_new_BxKxTxH)
  if spec.hadamard_k:
    k_new_BxKxTxH = hadamard.rotate(k_new_BxKxTxH, spec.rotation_key)
  if spec.hadamard_v:
    v_new_BxKxTxH = hadamard.rotate(v_new_BxKxTxH, spec.rotation_key)
  return k_new_BxKxTxH, v_new_BxKxTxH


def scaled_queries(spec: LayerSpec, q_BxTxNxH: jax.Array,
                   num_kv_heads: int) -> jax.Array:
  """q [B, K, G, T, H] float32, scaled by 1/sqrt(H), rotated like the keys
  it is dotted with (Hadamard, for post-RoPE rotated keys)."""
  b, t, n, h = q_BxTxNxH.shape
  q = q_BxTxNxH.astype(jnp.float32) * (h ** -0.5)
  if spec.hadamard_k and spec.key_rope == "post":
    q = hadamard.rotate(q, spec.rotation_key)
  return jnp.moveaxis(q.reshape(b, t, num_kv_heads, n // num_kv_heads, h), 1,
                      3)


def attention_output(spec: LayerSpec, state, q_BxTxNxH: jax.Array
                     ) -> jax.Array:
  """out_BxTxNxH in q's dtype from a merged softmax state (m, l, acc)."""
  b, t, n, h = q_BxTxNxH.shape
  _, l, acc = state
  out_BxKxGxTxH = acc / l[..., None]
  if spec.hadamard_v:
    out_BxKxGxTxH = hadamard.unrotate(out_BxKxGxTxH, spec.rotation_key)
  out = jnp.moveaxis(out_BxKxGxTxH, 3, 1).reshape(b, t, n, h)
  return out.astype(q_BxTxNxH.dtype)


def keys_for_scores(spec: LayerSpec, k_BxKxLxH: jax.Array,
                    tokens_BxL: jax.Array, rope: Rope) -> jax.Array:
  """Stored-convention keys -> keys to dot with the (rotated) query.

  Pre-RoPE keys are rotated by their token index (== position, see
  `check_positions`), after undoing their Hadamard rotation.
  """
  if spec.key_rope == "pre":
    k_BxLxKxH = rope(jnp.swapaxes(unrotated_keys(spec, k_BxKxLxH), 1, 2),
                     tokens_BxL)
    return jnp.swapaxes(k_BxLxKxH, 1, 2).astype(jnp.float32)
  return k_BxKxLxH


def unrotated_keys(spec: LayerSpec, k_BxKxLxH: jax.Array) -> jax.Array:
  """Stored pre-RoPE keys with their Hadamard rotation and key affine
  undone: the keys RoPE is applied to."""
  if spec.hadamard_k:
    k_BxKxLxH = hadamard.unrotate(k_BxKxLxH, spec.rotation_key)
  if spec.key_affine is not None:
    k_BxKxLxH = spec.key_affine.denormalize(k_BxKxLxH)
  return k_BxKxLxH


def check_key_affine(spec: LayerSpec, num_kv_heads: int,
                     head_dim: int) -> None:
  """ValueError if the layer's key affine was calibrated for other shapes."""
  affine = spec.key_affine
  if affine is not None and affine.shape != (num_kv_heads, head_dim):
    raise ValueError(
        f"key affine of shape {affine.shape} for a cache of {num_kv_heads} kv "
        f"heads x head_dim {head_dim}: calibrated for another model; "
        "allowed: key stats calibrated on this model.")


def layer_constants(spec: LayerSpec, head_dim: int) -> list:
  """The per-layer constant arrays of a quantized layer (see
  `QuantizedLayerCache.constant_leaves`): calibrated, this layer's own."""
  out = [a for q in (spec.k, spec.v) if not has_fixed_table(q)
         for a in constant_arrays(q, head_dim)]
  if spec.key_affine is not None:
    out += spec.key_affine.arrays()
  return out


def layer_fixed_tables(spec: LayerSpec, head_dim: int) -> list:
  """The format-fixed codebooks a quantized layer reads (see
  `QuantizedLayerCache.fixed_tables`): one copy per model."""
  return [a for q in (spec.k, spec.v) if has_fixed_table(q)
          for a in constant_arrays(q, head_dim)]


def storage_rows(e_KxLxH: jax.Array, qspec: QuantSpec | None,
                 dtype) -> Store:
  """Rows of E as storage receives them: quantized, or cast to `dtype` for
  an unquantized tensor."""
  e = e_KxLxH.astype(dtype)
  return e if qspec is None else quantize(e, qspec)


def fresh_tokens(win_KxWxH: jax.Array, n0: jax.Array, new_KxTxH: jax.Array,
                 spec: LayerSpec, qspec: QuantSpec | None, flush: int,
                 dtype, with_rows: bool = True
                 ) -> tuple[jax.Array, Store, jax.Array, jax.Array,
                            jax.Array]:
  """Step 1 of the module docstring, and step 2's quantization, for one
  sequence and one tensor (vmap over the batch).

  Args:
    win_KxWxH: the tensor's full-precision window (tokens [Q(n0), n0)).
    n0: tokens written before this call.
    new_KxTxH: the T new tokens, stored convention, in `dtype`.
    spec, qspec, flush: the layer spec, the tensor's QuantSpec and its F.
    dtype: the compute dtype quantization starts from.

  Returns:
    (E [K, L, H] float32 holding tokens [Q(n0), Q(n0) + L), zero past n1;
     rows: E quantized (or cast to `dtype` for an unquantized tensor), the
     rows storage receives, None unless `with_rows`; Q(n0); Q(n1); the new
     window [K, W, H] holding tokens [Q(n1), n1), in spec.window_dtype).
  """
  w = win_KxWxH.shape[1]
  t = new_KxTxH.shape[1]
  n1 = n0 + t
  g_all = math.lcm(token_group(spec.k), token_group(spec.v))
  qs = committed_end(n0, spec, flush)
  q1 = committed_end(n1, spec, flush)
  size_e = round_up(w + t, g_all)
  tok_L = qs + jnp.arange(size_e)
  from_new = jnp.clip(tok_L - n0, 0, t - 1)
  new = new_KxTxH
  if w:  # Tokens that may wait in the window are rounded as stored.
    new = new.astype(spec.window_dtype)
  new = new.astype(jnp.float32)
  win_pad = jnp.pad(win_KxWxH.astype(jnp.float32),
                    ((0, 0), (0, size_e - w), (0, 0)))
  e = jnp.where((tok_L < n0)[None, :, None], win_pad, new[:, from_new])
  e = jnp.where((tok_L < n1)[None, :, None], e, 0)
  rows = storage_rows(e, qspec, dtype) if with_rows else None
  e_pad = jnp.pad(e, ((0, 0), (0, w), (0, 0)))
  new_win = jax.lax.dynamic_slice_in_dim(e_pad, q1 - qs, w, axis=1)
  return e, rows, qs, q1, new_win.astype(spec.window_dtype)


@struct.dataclass
class QuantizedLayerCache:
  """See the module docstring. Shapes: storage [B, K, C, H], windows
  [B, K, W_k, H] and [B, K, W_v, H], sinks [B, K, S, H] (W_x =
  spec.window_of(x), S = spec.sink); windows and sinks in spec.window_dtype.
  """

  k_store: Store
  v_store: Store
  window_k: jax.Array
  window_v: jax.Array
  sink_k: jax.Array
  sink_v: jax.Array
  length_B: jax.Array
  capacity: int = struct.field(pytree_node=False)
  spec: LayerSpec = struct.field(pytree_node=False)

  @classmethod
  def create(cls, spec: LayerSpec, batch_size: int, capacity: int,
             num_kv_heads: int, head_dim: int,
             dtype=jnp.float32) -> QuantizedLayerCache:
    """`dtype`: the compute dtype quantization starts from (and the storage
    of a tensor left unquantized); full-precision regions use
    `spec.window_dtype`."""
    if not isinstance(capacity, int) or capacity < 1:
      raise ValueError(
          f"QuantizedLayerCache.capacity={capacity!r}: must be a positive "
          "integer.")
    if spec.hadamard_k or spec.hadamard_v:
      hadamard.hadamard_matrix_np(head_dim)  # validates power of two.
    check_key_affine(spec, num_kv_heads, head_dim)
    allocated = round_up(capacity, spec.block_size)
    b, k, h = batch_size, num_kv_heads, head_dim
    full = lambda n: jnp.zeros((b, k, n, h), spec.window_dtype)
    return cls(
        k_store=empty_store(spec.k, (b, k, allocated, h), dtype),
        v_store=empty_store(spec.v, (b, k, allocated, h), dtype),
        window_k=full(spec.window_of("k")), window_v=full(spec.window_of("v")),
        sink_k=full(spec.sink), sink_v=full(spec.sink),
        length_B=jnp.zeros((b,), jnp.int32), capacity=capacity, spec=spec)

  @property
  def allocated_slots(self) -> int:
    return self.k_store.shape[2]

  @property
  def dtype(self) -> jnp.dtype:
    """The compute dtype the cache was created with (see `create`)."""
    return jnp.dtype(self.k_store.dtype)

  def storage_leaves(self) -> list[jax.Array]:
    """Leaves whose size grows with capacity (packed data, scales, zeros)."""
    return jax.tree_util.tree_leaves((self.k_store, self.v_store))

  def fixed_leaves(self) -> list[jax.Array]:
    """Full-precision regions whose size does not depend on capacity."""
    return [self.window_k, self.window_v, self.sink_k, self.sink_v]

  def constant_leaves(self) -> list[jax.Array]:
    """Per-layer constants a format stores (calibrated levels and widths,
    the key affine's shift and scale); charged by `capacity.memory`. The
    randomised rotation's signs are regenerated from the seed and cost
    nothing."""
    return layer_constants(self.spec, self.window_k.shape[-1])

  def fixed_tables(self) -> list[jax.Array]:
    """Codebooks fixed by the format (Lloyd-Max, vector): the same in
    every layer, charged once per model by `capacity.memory`."""
    return layer_fixed_tables(self.spec, self.window_k.shape[-1])

  # -- writing -------------------------------------------------------------

  def _update(self, k_new_BxKxTxH, v_new_BxKxTxH):
    """Steps 1-3 of the module docstring for K and V.

    Returns (new cache, {name: (E [B, K, L_x, H] float32, Q_x(n0) [B])}).
    """
    spec = self.spec
    t = k_new_BxKxTxH.shape[2]
    s = spec.sink
    wdtype = jnp.dtype(spec.window_dtype)

    def one_tensor(win, sink, n0, new, qspec, flush):
      """One sequence, one tensor; win/sink/new are [K, *, H]; returns
      (storage rows or None, window, sinks, E, Q(n0), Q(n1))."""
      e, rows, qs, q1, new_win = fresh_tokens(win, n0, new, spec, qspec,
                                              flush, self.dtype,
                                              with_rows=t > 1)
      j_S = jnp.arange(s)
      fresh = new[:, jnp.clip(j_S - n0, 0, t - 1)]
      take = ((j_S >= n0) & (j_S < n0 + t))[None, :, None]
      new_sink = jnp.where(take, fresh.astype(wdtype), sink)
      return rows, new_win, new_sink, e, qs, q1

    def commit_block(store, e_B, qs_B, q1_B, qspec, flush):
      """A decode step commits at most one flush block, E's first F rows
      (tokens [Q(n0), Q(n0) + F)): only they are quantized, and with F > 1
      (a per-channel group, a flush block) only in the steps that close
      one (`lax.cond` over the batch), so a group is quantized once."""
      def commit(store):
        rows = jax.vmap(lambda e: storage_rows(e[:, :flush], qspec,
                                               self.dtype))(e_B)
        return self._commit(store, rows, qs_B, q1_B, qspec)
      if flush == 1:
        return commit(store)
      return jax.lax.cond(jnp.any(q1_B > qs_B), commit, lambda x: x, store)

    out = {}
    for name, store, win, sink, new in (
        ("k", self.k_store, self.window_k, self.sink_k, k_new_BxKxTxH),
        ("v", self.v_store, self.window_v, self.sink_v, v_new_BxKxTxH)):
      qspec, flush = getattr(spec, name), spec.flush(name)
      fn = lambda *a, q=qspec, f=flush: one_tensor(*a, q, f)
      out[name] = list(jax.vmap(fn)(win, sink, self.length_B, new))
      if t == 1:
        out[name][0] = commit_block(store, out[name][3], out[name][4],
                                    out[name][5], qspec, flush)
      else:
        out[name][0] = self._commit(store, out[name][0], out[name][4],
                                    out[name][5], qspec)
    new_cache = self.replace(
        k_store=out["k"][0], v_store=out["v"][0], window_k=out["k"][1],
        window_v=out["v"][1], sink_k=out["k"][2], sink_v=out["v"][2],
        length_B=self.length_B + t)
    return new_cache, {name: (o[3], o[4]) for name, o in out.items()}

  # -- storage access (a paged cache overrides these) -----------------------

  def _commit(self, store: Store, rows_B: Store, start_B: jax.Array,
              end_B: jax.Array, qspec: QuantSpec | None) -> Store:
    """Tokens [start_b, end_b) of sequence b's storage <- rows_B[b]'s first
    end_b - start_b rows (`_commit_rows` per sequence)."""
    return jax.vmap(lambda st, r, a, e: _commit_rows(st, r, a, e, qspec))(
        store, rows_B, start_B, end_B)

  def _storage_block(self, store: Store, start: jax.Array, size: int,
                     qspec: QuantSpec | None) -> Store:
    """Slots [start, start + size) of every sequence (inside the
    allocation; start a multiple of the block size)."""
    return slice_store(store, start, size, qspec)

  def _storage_rows(self, store: Store, start_B: jax.Array, size: int,
                    qspec: QuantSpec | None) -> Store:
    """Slots [start_b, start_b + size) of sequence b, zeros past the
    allocation."""
    return slice_store(store, start_B, size, qspec, fill=True)

  # -- reading -------------------------------------------------------------

  def _keys_for_scores(self, k_BxKxLxH, tokens_BxL, rope: Rope):
    """Stored-convention keys -> keys to dot with the (rotated) query."""
    return keys_for_scores(self.spec, k_BxKxLxH, tokens_BxL, rope)

  def _visible(self, key_tok_BxL: jax.Array,
               query_tok_BxT: jax.Array) -> jax.Array:
    """[B, T, L]: query token i may see key token j (causal: j <= i).

    Every segment's mask goes through here, so a variant with another
    visibility rule (the banded reference of the sliding-window tests)
    overrides this alone.
    """
    return key_tok_BxL[:, None, :] <= query_tok_BxT[:, :, None]

  def attend(self, q_BxTxNxH: jax.Array, k_BxTxKxH: jax.Array,
             v_BxTxKxH: jax.Array, positions_BxT: jax.Array,
             rope: Rope) -> tuple[jax.Array, QuantizedLayerCache]:
    spec = self.spec
    check_positions(spec, positions_BxT, self.length_B)
    b, t, _, _ = q_BxTxNxH.shape
    k_new, v_new = incoming_tokens(spec, k_BxTxKxH, v_BxTxKxH, positions_BxT,
                                   rope)
    n0_B = self.length_B
    new_cache, fresh = self._update(k_new.astype(self.dtype),
                                    v_new.astype(self.dtype))

    q_BxKxGxTxH = scaled_queries(spec, q_BxTxNxH, k_BxTxKxH.shape[2])
    query_tok_BxT = n0_B[:, None] + jnp.arange(t)[None, :]
    lo, hi = ("k", "v") if spec.flush_k >= spec.flush_v else ("v", "k")
    lo_end_BxT = committed_end(query_tok_BxT + 1, spec, spec.flush(lo))
    hi_end_BxT = committed_end(query_tok_BxT + 1, spec, spec.flush(hi))
    causal = lambda tok_BxL: self._visible(tok_BxL, query_tok_BxT)

    # E range of the tensor that commits last: [Q_lo(n0), ...).
    e_lo, qs_lo_B = fresh[lo]
    e_hi, qs_hi_B = fresh[hi]
    size_e = e_lo.shape[2]
    tok_BxL = qs_lo_B[:, None] + jnp.arange(size_e)[None, :]
    index_BxL = jnp.clip(tok_BxL - qs_hi_B[:, None], 0, e_hi.shape[2] - 1)
    e_hi = jnp.take_along_axis(e_hi, index_BxL[:, None, :, None], axis=2)
    fp = {lo: e_lo, hi: e_hi}
    fp_keys = self._keys_for_scores(fp["k"], tok_BxL, rope)
    window_mask = causal(tok_BxL) & (tok_BxL[:, None, :]
                                     >= hi_end_BxT[:, :, None])
    state = block_attention(q_BxKxGxTxH, fp_keys, fp["v"], window_mask)
    s = spec.sink
    if s:  # Sinks: both full precision.
      sink_tok_BxS = jnp.broadcast_to(jnp.arange(s), (b, s))
      state = merge_states(state, block_attention(
          q_BxKxGxTxH,
          self._keys_for_scores(new_cache.sink_k.astype(jnp.float32),
                                sink_tok_BxS, rope),
          new_cache.sink_v.astype(jnp.float32), causal(sink_tok_BxS)))
    if spec.flush_k != spec.flush_v:  # The mixed segment.
      hi_store = new_cache.k_store if hi == "k" else new_cache.v_store
      dq_hi = read_store(self._storage_rows(hi_store, qs_lo_B, size_e,
                                            getattr(spec, hi)),
                         getattr(spec, hi))
      # Full-precision keys (lo = k) are the window's, already rotated.
      mixed_keys = (fp_keys if lo == "k" else
                    self._keys_for_scores(dq_hi, tok_BxL, rope))
      mixed_values = dq_hi if lo == "k" else e_lo
      mixed_mask = (causal(tok_BxL)
                    & (tok_BxL[:, None, :] >= lo_end_BxT[:, :, None])
                    & (tok_BxL[:, None, :] < hi_end_BxT[:, :, None]))
      state = merge_states(state, block_attention(
          q_BxKxGxTxH, mixed_keys, mixed_values, mixed_mask))

    # Quantized storage [S, Q_lo(i + 1)), block by block up to the longest.
    blk = spec.block_size
    num_blocks = self.allocated_slots // blk
    # Post-RoPE per-token storage: scales folded out of the dots.
    fold = (spec.key_rope == "post" and folds_scales(spec.k)
            and folds_scales(spec.v))

    # Pre-RoPE keys: the query is rotated back by the block's start and the
    # keys forward by their offset in it, from one table (no cos/sin of
    # every token per step; `Rope.rotate`).
    offsets_cos, offsets_sin = rope.cos_sin(jnp.arange(blk))
    look_k, look_v = spec.looks_up("k"), spec.looks_up("v")
    # Vector keys read by lookup (post-RoPE only): the queries' centroid
    # table is the same for every block.
    k_table = query_table(q_BxKxGxTxH, spec.k) if look_k else None

    def body(index, carry):
      start = index * blk
      k_store, v_store = per_block_scales(
          (new_cache.k_store, new_cache.v_store), index)
      kb = self._storage_block(k_store, start, blk, spec.k)
      vb = self._storage_block(v_store, start, blk, spec.v)
      blk_tok_BxL = jnp.broadcast_to(start + jnp.arange(blk), (b, blk))
      mask = ((blk_tok_BxL[:, None, :] >= s)
              & (blk_tok_BxL[:, None, :] < lo_end_BxT[:, :, None])
              & causal(blk_tok_BxL))  # Implied by Q_lo(i + 1) <= i + 1.
      if fold:
        return merge_states(carry, folded_block_attention(
            q_BxKxGxTxH, kb, vb, mask))
      q = q_BxKxGxTxH
      if spec.key_rope == "pre":
        q = rope.rotate(q, *rope.cos_sin(-start))
        k_planes = pre_rope_key_planes(spec, kb, rope, offsets_cos,
                                       offsets_sin)
      elif look_k:
        k_planes = kb  # Read by lookup (cache/code_lookup.py).
      else:
        k_planes = read_planes(kb, spec.k)
      if look_v:
        v_planes, v_bad = vb, None
      else:
        v_planes, v_bad = read_value_planes(vb, spec.v)
      if look_k or look_v:
        return merge_states(carry, lookup_block_attention(
            q, k_planes, v_planes, mask, v_bad, k_table))
      return merge_states(carry, planar_block_attention(
          q, k_planes, v_planes, mask, v_bad))

    if t == 1 and self._decode_impl(q_BxTxNxH, lo_end_BxT[:, 0]) == "pallas":
      state = merge_states(state, self._storage_state_pallas(
          new_cache, q_BxTxNxH, lo_end_BxT[:, 0]))
    else:
      filled_blocks = jnp.minimum(
          (jnp.max(lo_end_BxT) + blk - 1) // blk, num_blocks)
      state = jax.lax.fori_loop(0, filled_blocks, body, state)
    return attention_output(spec, state, q_BxTxNxH), new_cache

  # -- decode kernel -------------------------------------------------------

  def _kernel_block_k(self) -> int:
    """Largest power of two <= DEFAULT_BLOCK_K dividing the allocation."""
    slots = self.allocated_slots
    return min(DEFAULT_BLOCK_K, slots & -slots)

  def _kernel_inputs(self, q_BxTxNxH: jax.Array, end_B: jax.Array):
    """(q [B, K, G, H], start_B) of the decode kernel for one query token.

    q is not pre-scaled (the kernel scales by 1/sqrt(H)) but is rotated like
    the stored keys.
    """
    b, _, n, h = q_BxTxNxH.shape
    kh = self.k_store.shape[1]
    q = q_BxTxNxH[:, 0].astype(jnp.float32)
    if self.spec.hadamard_k:  # key_rope == 'post' here (pre is unsupported).
      q = hadamard.rotate(q, self.spec.rotation_key)
    start_B = jnp.full_like(end_B, self.spec.sink)
    return q.reshape(b, kh, n // kh, h), start_B

  def _kernel_reason(self, q_BxKxGxH: jax.Array, start_B: jax.Array,
                     end_B: jax.Array, interpret: bool) -> str | None:
    """Why the decode kernel cannot read this storage's [start_b, end_b)
    here (shapes, backend), or None; a paged cache overrides this and
    `_kernel_attention`."""
    return pallas_unsupported_reason(
        q_BxKxGxH, self.k_store, self.v_store, end_B, start_B=start_B,
        interpret=interpret, block_k=self._kernel_block_k())

  def _kernel_attention(self, cache: QuantizedLayerCache,
                        q_BxKxGxH: jax.Array, start_B: jax.Array,
                        end_B: jax.Array, interpret: bool):
    """(out [B, K, G, H], lse [B, K, G]) of the kernel over `cache`'s
    storage slots [start_b, end_b)."""
    return decode_attention(
        q_BxKxGxH, cache.k_store, cache.v_store, end_B, start_B=start_B,
        block_k=self._kernel_block_k(), interpret=interpret, return_lse=True)

  def _decode_impl(self, q_BxTxNxH: jax.Array, end_B: jax.Array) -> str:
    """'pallas' or 'xla' for this decode step (trace time)."""
    spec = self.spec
    interpret = resolve_interpret(spec.interpret)

    def reason(choice: str) -> str | None:
      if choice == "xla":
        return None
      why = spec.pallas_static_reason()
      if why:
        return why
      q, start_B = self._kernel_inputs(q_BxTxNxH, end_B)
      return self._kernel_reason(q, start_B, end_B, interpret)

    return choose_implementation(spec.attention_impl, reason,
                                 caller=f"{type(self).__name__}.attend")

  def _storage_state_pallas(self, cache: QuantizedLayerCache,
                            q_BxTxNxH: jax.Array, end_B: jax.Array):
    """Softmax state (m, l, acc) [B, K, G, 1(, H)] of slots [S, end_b)."""
    q, start_B = self._kernel_inputs(q_BxTxNxH, end_B)
    out_BxKxGxH, lse_BxKxG = self._kernel_attention(
        cache, q, start_B, end_B, resolve_interpret(self.spec.interpret))
    # softmax-normalized: m = lse, l = 1 (lse = -inf, out = 0 when empty).
    m = lse_BxKxG[..., None]
    return m, jnp.ones_like(m), out_BxKxGxH[..., None, :]

