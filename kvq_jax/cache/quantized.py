"""Quantized KV cache for one layer: packed storage + full-precision regions.

Storage is heads-major, [B, K, C, H] (C = allocated slots, slot = token
index), as `QuantizedArray`s (packed codes + per-group scales/zeros), or as a
plain array when only one of K/V is quantized. Full-precision regions (see
`cache/spec.py`): `sink` slots for the first tokens and a `window` holding the
tokens [Q(n), n) not yet flushed to storage.

Each `attend` call with T new tokens (old length n0, new length n1):
  1. builds E, the full-precision tokens [Q(n0), Q(n0) + W + T): the old window
     followed by the new tokens (keys post-RoPE unless key_rope == 'pre',
     Hadamard-rotated if asked);
  2. quantizes E and commits its tokens [Q(n0), Q(n1)) into storage (a
     scatter that drops every other row: nothing is written out of range);
  3. keeps [Q(n1), n1) as the new window and fills the sink slots;
  4. attends: query token i = n0 + t sees, for every past token j <= i,
     the full-precision copy if j < S or j >= Q(i + 1), else the dequantized
     one. That is exactly what streaming decode would hold when it processed
     token i, so chunked prefill and token-by-token decode agree.
The storage segment is read block by block (`lax.scan`, online softmax), so a
decode step dequantizes `block_size` slots at a time and never materializes a
full-precision copy of the cache; the full-precision segments are merged by
log-sum-exp.

With `spec.attention_impl` selecting "pallas", a decode step (T == 1) reads
the storage segment [S, Q(n0 + 1)) with the flash-decoding kernel of
`kvq_jax.kernels` instead of the scan (start_B = S, length_B = Q(n0 + 1)); its
(out, lse) is merged with the full-precision state by log-sum-exp. The kernel
dots the stored keys with the query directly, so it cannot read pre-RoPE keys,
and it needs packed int8/int4/int2 storage for both K and V; where it cannot
run, an explicit "pallas" raises ValueError and a tuple such as
("pallas", "xla") falls back to the scan with a warning (at trace time).
Prefill (T > 1) always uses the scan.

Positions: the cache assumes token i sits at position i (slot == position),
which is what pre-RoPE keys are rotated with at read time.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import struct

from kvq_jax.cache import hadamard
from kvq_jax.cache.attention import MASK_VALUE, split_nonfinite
from kvq_jax.cache.spec import LayerSpec
from kvq_jax.kernels.decode_attention import DEFAULT_BLOCK_K, decode_attention
from kvq_jax.kernels.dispatch import (choose_implementation,
                                      pallas_unsupported_reason,
                                      resolve_interpret)
from kvq_jax.models.rope import Rope
from kvq_jax.quant import QuantizedArray, QuantSpec, dequantize, quantize

Store = QuantizedArray | jax.Array


def _round_up(x: int, m: int) -> int:
  return -(-x // m) * m


def committed_end(n: jax.Array, spec: LayerSpec) -> jax.Array:
  """Q(n): tokens [S, Q(n)) are in quantized storage after n tokens."""
  s, r, f = spec.sink, spec.residual, spec.flush_block
  return s + f * (jnp.maximum(0, n - s - r) // f)


def _group(spec: QuantSpec | None) -> int:
  if spec is not None and spec.granularity == "per_channel":
    return spec.group_size
  return 1


def _empty_store(spec: QuantSpec | None, shape, dtype) -> Store:
  """All-zero storage (codes, scales and zeros 0), built without quantizing.

  Quantizing a zeros constant inside `jit` would make XLA constant-fold the
  whole reduction at compile time; zero leaves of the right shapes are equal.
  """
  if spec is None:
    return jnp.zeros(shape, dtype)
  abstract = jax.eval_shape(lambda: quantize(jnp.zeros(shape, dtype), spec))
  return jax.tree_util.tree_map(lambda a: jnp.zeros(a.shape, a.dtype),
                                abstract)


def _scatter_tokens(store: Store, rows: Store, slots_L: jax.Array,
                    spec: QuantSpec | None, keep_L: jax.Array) -> Store:
  """store[:, slots] = rows[:, :] for kept rows; [K, C, ...] per sequence."""
  capacity = store.shape[-2]
  index_L = jnp.where(keep_L, slots_L, capacity)  # out of range -> dropped.

  def put(dst, src, index):
    return dst.at[:, index].set(src.astype(dst.dtype), mode="drop")

  if spec is None:
    return put(store, rows, index_L)
  data = put(store.data, rows.data, index_L)
  if spec.granularity == "per_channel":
    g = spec.group_size
    group_index = slots_L[::g] // g
    group_keep = keep_L[g - 1::g]  # a group commits only when whole.
    scale_index = jnp.where(group_keep, group_index, capacity // g)
  else:
    scale_index = index_L
  scale = put(store.scale, rows.scale, scale_index)
  zero = None if rows.zero is None else put(store.zero, rows.zero, scale_index)
  return QuantizedArray(data=data, scale=scale, zero=zero, spec=store.spec,
                        last_dim=store.last_dim, dtype=store.dtype)


def _slice_store(store: Store, start: jax.Array, size: int,
                 spec: QuantSpec | None) -> Store:
  """Slots [start, start + size) of [B, K, C, ...] storage (start % g == 0)."""
  def take(x, begin, length):
    return jax.lax.dynamic_slice_in_dim(x, begin, length, axis=2)

  if spec is None:
    return take(store, start, size)
  g = _group(spec)
  scale_start, scale_size = (start // g, size // g) if g > 1 else (start, size)
  return QuantizedArray(
      data=take(store.data, start, size),
      scale=take(store.scale, scale_start, scale_size),
      zero=None if store.zero is None else take(store.zero, scale_start,
                                                scale_size),
      spec=store.spec, last_dim=store.last_dim, dtype=store.dtype)


def _read(store: Store, spec: QuantSpec | None) -> jax.Array:
  return (store if spec is None else dequantize(store, jnp.float32)).astype(
      jnp.float32)


@struct.dataclass
class QuantizedLayerCache:
  """See the module docstring. Shapes: storage [B, K, C, H], window
  [B, K, W, H], sink [B, K, S, H] (W = spec.window, S = spec.sink)."""

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
    if not isinstance(capacity, int) or capacity < 1:
      raise ValueError(
          f"QuantizedLayerCache.capacity={capacity!r}: must be a positive "
          "integer.")
    if spec.hadamard_k or spec.hadamard_v:
      hadamard.hadamard_matrix_np(head_dim)  # validates power of two.
    allocated = _round_up(capacity, spec.block_size)
    b, k, h = batch_size, num_kv_heads, head_dim
    full = lambda n: jnp.zeros((b, k, n, h), dtype)
    return cls(
        k_store=_empty_store(spec.k, (b, k, allocated, h), dtype),
        v_store=_empty_store(spec.v, (b, k, allocated, h), dtype),
        window_k=full(spec.window), window_v=full(spec.window),
        sink_k=full(spec.sink), sink_v=full(spec.sink),
        length_B=jnp.zeros((b,), jnp.int32), capacity=capacity, spec=spec)

  @property
  def allocated_slots(self) -> int:
    return self.k_store.shape[2]

  def storage_leaves(self) -> list[jax.Array]:
    """Leaves whose size grows with capacity (packed data, scales, zeros)."""
    return jax.tree_util.tree_leaves((self.k_store, self.v_store))

  def fixed_leaves(self) -> list[jax.Array]:
    """Full-precision regions whose size does not depend on capacity."""
    return [self.window_k, self.window_v, self.sink_k, self.sink_v]

  # -- writing -------------------------------------------------------------

  def _update(self, k_new_BxKxTxH, v_new_BxKxTxH):
    """Steps 1-3 of the module docstring; returns (new cache, E_k, E_v, Qs)."""
    spec = self.spec
    t = k_new_BxKxTxH.shape[2]
    w, s = spec.window, spec.sink
    g = math.lcm(_group(spec.k), _group(spec.v))
    size_e = _round_up(w + t, g)  # E tokens [Qs, Qs + size_e).

    def one(k_store, v_store, win_k, win_v, sink_k, sink_v, n0, k_new, v_new):
      n1 = n0 + t
      qs, q1 = committed_end(n0, spec), committed_end(n1, spec)
      tok_L = qs + jnp.arange(size_e)
      from_new = jnp.clip(tok_L - n0, 0, t - 1)

      def extend(win, new):
        win_pad = jnp.pad(win, ((0, 0), (0, size_e - w), (0, 0)))
        e = jnp.where((tok_L < n0)[None, :, None], win_pad,
                      new[:, from_new].astype(win.dtype))
        return jnp.where((tok_L < n1)[None, :, None], e, 0)

      e_k, e_v = extend(win_k, k_new), extend(win_v, v_new)
      keep_L = tok_L < q1
      stores = []
      for store, e, qspec in ((k_store, e_k, spec.k), (v_store, e_v, spec.v)):
        rows = e if qspec is None else quantize(e, qspec)
        stores.append(_scatter_tokens(store, rows, tok_L, qspec, keep_L))

      def new_window(e):
        e_pad = jnp.pad(e, ((0, 0), (0, w), (0, 0)))
        return jax.lax.dynamic_slice_in_dim(e_pad, q1 - qs, w, axis=1)

      def new_sink(sink, new):
        j_S = jnp.arange(s)
        fresh = new[:, jnp.clip(j_S - n0, 0, t - 1)].astype(sink.dtype)
        take = ((j_S >= n0) & (j_S < n1))[None, :, None]
        return jnp.where(take, fresh, sink)

      return (stores[0], stores[1], new_window(e_k), new_window(e_v),
              new_sink(sink_k, k_new), new_sink(sink_v, v_new), e_k, e_v, qs)

    (k_store, v_store, win_k, win_v, sink_k, sink_v, e_k, e_v,
     qs_B) = jax.vmap(one)(self.k_store, self.v_store, self.window_k,
                           self.window_v, self.sink_k, self.sink_v,
                           self.length_B, k_new_BxKxTxH, v_new_BxKxTxH)
    new_cache = self.replace(
        k_store=k_store, v_store=v_store, window_k=win_k, window_v=win_v,
        sink_k=sink_k, sink_v=sink_v, length_B=self.length_B + t)
    return new_cache, e_k, e_v, qs_B

  # -- reading -------------------------------------------------------------

  def _keys_for_scores(self, k_BxKxLxH, tokens_BxL, rope: Rope):
    """Stored-convention keys -> keys to dot with the (rotated) query."""
    if self.spec.key_rope == "pre":
      if self.spec.hadamard_k:
        k_BxKxLxH = hadamard.rotate(k_BxKxLxH)
      k_BxLxKxH = rope(jnp.swapaxes(k_BxKxLxH, 1, 2), tokens_BxL)
      return jnp.swapaxes(k_BxLxKxH, 1, 2).astype(jnp.float32)
    return k_BxKxLxH

  def attend(self, q_BxTxNxH: jax.Array, k_BxTxKxH: jax.Array,
             v_BxTxKxH: jax.Array, positions_BxT: jax.Array,
             rope: Rope) -> tuple[jax.Array, QuantizedLayerCache]:
    spec = self.spec
    b, t, n, h = q_BxTxNxH.shape
    kh = k_BxTxKxH.shape[2]
    dtype = self.window_k.dtype
    k_new = k_BxTxKxH if spec.key_rope == "pre" else rope(k_BxTxKxH,
                                                          positions_BxT)
    k_new = jnp.swapaxes(k_new, 1, 2).astype(jnp.float32)
    v_new = jnp.swapaxes(v_BxTxKxH, 1, 2).astype(jnp.float32)
    if spec.hadamard_k:
      k_new = hadamard.rotate(k_new)
    if spec.hadamard_v:
      v_new = hadamard.rotate(v_new)
    n0_B = self.length_B
    new_cache, e_k, e_v, qs_B = self._update(k_new.astype(dtype),
                                             v_new.astype(dtype))

    q = q_BxTxNxH.astype(jnp.float32) * (h ** -0.5)
    if spec.hadamard_k and spec.key_rope == "post":
      q = hadamard.rotate(q)
    q_BxKxGxTxH = jnp.moveaxis(q.reshape(b, t, kh, n // kh, h), 1, 3)
    query_tok_BxT = n0_B[:, None] + jnp.arange(t)[None, :]
    q_end_BxT = committed_end(query_tok_BxT + 1, spec)

    # Full-precision segment: sinks then E.
    s = spec.sink
    fp_tok_BxL = jnp.concatenate(
        [jnp.broadcast_to(jnp.arange(s), (b, s)),
         qs_B[:, None] + jnp.arange(e_k.shape[2])[None, :]], axis=1)
    fp_k = jnp.concatenate([new_cache.sink_k, e_k], axis=2).astype(jnp.float32)
    fp_v = jnp.concatenate([new_cache.sink_v, e_v], axis=2).astype(jnp.float32)
    fp_k = self._keys_for_scores(fp_k, fp_tok_BxL, rope)
    is_sink_L = jnp.arange(fp_tok_BxL.shape[1]) < s
    fp_mask = ((fp_tok_BxL[:, None, :] <= query_tok_BxT[:, :, None])
               & (is_sink_L[None, None, :]
                  | (fp_tok_BxL[:, None, :] >= q_end_BxT[:, :, None])))
    state = _block_attention(q_BxKxGxTxH, fp_k, fp_v, fp_mask)

    # Quantized storage, block by block.
    blk = spec.block_size
    num_blocks = self.allocated_slots // blk

    def body(carry, index):
      start = index * blk
      kb = _read(_slice_store(new_cache.k_store, start, blk, spec.k), spec.k)
      vb = _read(_slice_store(new_cache.v_store, start, blk, spec.v), spec.v)
      tok_BxL = jnp.broadcast_to(start + jnp.arange(blk), (b, blk))
      kb = self._keys_for_scores(kb, tok_BxL, rope)
      mask = ((tok_BxL[:, None, :] >= s)
              & (tok_BxL[:, None, :] < q_end_BxT[:, :, None]))
      return _merge(carry, _block_attention(q_BxKxGxTxH, kb, vb, mask)), None

    if t == 1 and self._decode_impl(q_BxTxNxH, q_end_BxT[:, 0]) == "pallas":
      state = _merge(state, self._storage_state_pallas(
          new_cache, q_BxTxNxH, q_end_BxT[:, 0]))
    else:
      state, _ = jax.lax.scan(body, state, jnp.arange(num_blocks))
    m, l, acc = state
    out_BxKxGxTxH = acc / l[..., None]
    if spec.hadamard_v:
      out_BxKxGxTxH = hadamard.rotate(out_BxKxGxTxH)
    out = jnp.moveaxis(out_BxKxGxTxH, 3, 1).reshape(b, t, n, h)
    return out.astype(q_BxTxNxH.dtype), new_cache

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
      q = hadamard.rotate(q)
    start_B = jnp.full_like(end_B, self.spec.sink)
    return q.reshape(b, kh, n // kh, h), start_B

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
      return pallas_unsupported_reason(
          q, self.k_store, self.v_store, end_B, start_B=start_B,
          interpret=interpret, block_k=self._kernel_block_k())

    return choose_implementation(spec.attention_impl, reason,
                                 caller="QuantizedLayerCache.attend")

  def _storage_state_pallas(self, cache: QuantizedLayerCache,
                            q_BxTxNxH: jax.Array, end_B: jax.Array):
    """Softmax state (m, l, acc) [B, K, G, 1(, H)] of slots [S, end_b)."""
    q, start_B = self._kernel_inputs(q_BxTxNxH, end_B)
    out_BxKxGxH, lse_BxKxG = decode_attention(
        q, cache.k_store, cache.v_store, end_B, start_B=start_B,
        block_k=self._kernel_block_k(),
        interpret=resolve_interpret(self.spec.interpret), return_lse=True)
    # softmax-normalized: m = lse, l = 1 (lse = -inf, out = 0 when empty).
    m = lse_BxKxG[..., None]
    return m, jnp.ones_like(m), out_BxKxGxH[..., None, :]


def _block_attention(q_BxKxGxTxH, k_BxKxLxH, v_BxKxLxH, mask_BxTxL):
  """Partial softmax state (max, sum, weighted values) of one key block."""
  scores = jnp.einsum("bkgth,bklh->bkgtl", q_BxKxGxTxH, k_BxKxLxH,
                      preferred_element_type=jnp.float32)
  mask = mask_BxTxL[:, None, None]
  scores = jnp.where(mask, scores, MASK_VALUE)
  m = jnp.max(scores, axis=-1)
  p = jnp.where(mask, jnp.exp(scores - m[..., None]), 0.0)
  v_BxKxLxH, sees_bad_BxKxT = split_nonfinite(v_BxKxLxH, 2, 1, mask_BxTxL)
  acc = jnp.einsum("bkgtl,bklh->bkgth", p, v_BxKxLxH,
                   preferred_element_type=jnp.float32)
  acc = jnp.where(sees_bad_BxKxT[:, :, None, :, None], jnp.nan, acc)
  return m, jnp.sum(p, axis=-1), acc


def _merge(a, b):
  """Log-sum-exp merge of two partial softmax states."""
  m_a, l_a, acc_a = a
  m_b, l_b, acc_b = b
  m = jnp.maximum(m_a, m_b)
  wa, wb = jnp.exp(m_a - m), jnp.exp(m_b - m)
  return m, l_a * wa + l_b * wb, acc_a * wa[..., None] + acc_b * wb[..., None]
