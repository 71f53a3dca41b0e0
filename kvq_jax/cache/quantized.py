"""Quantized KV cache for one layer: packed storage + full-precision regions.

Storage is heads-major, [B, K, C, H] (C = allocated slots, slot = token
index), as `QuantizedArray`s (packed codes + per-group scales/zeros), or as a
plain array when only one of K/V is quantized; its row operations are in
`cache/quantized_store.py`, the key and query conventions (RoPE, key affine,
Hadamard) in `cache/quantized_keys.py`. Full-precision regions (see
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
here and in those two modules (`fresh_tokens`, `incoming_tokens`,
`keys_for_scores`, ...).

Positions: the cache assumes token i sits at position i (slot == position),
which is what pre-RoPE keys are rotated with at read time. With
key_rope='pre', other positions are refused (`check_positions`: eagerly
here when the positions are concrete, and by `Runtime` before every jitted
call).
"""

from __future__ import annotations

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import struct

from kvq_jax.cache import hadamard
from kvq_jax.cache.attention import (block_attention, merge_states,
                                     planar_block_attention)
from kvq_jax.cache.code_lookup import lookup_block_attention, query_table
from kvq_jax.cache.folded_attention import folded_block_attention, folds_scales
from kvq_jax.cache.quantized_keys import (attention_output, check_key_affine,
                                          check_positions, incoming_tokens,
                                          keys_for_scores, pre_rope_key_planes,
                                          scaled_queries)
from kvq_jax.cache.quantized_store import (Store, commit_rows, empty_store,
                                           per_block_scales, read_planes,
                                           read_store, read_value_planes,
                                           round_up, slice_store,
                                           storage_rows, token_group)
from kvq_jax.cache.spec import LayerSpec
from kvq_jax.kernels.decode_attention import DEFAULT_BLOCK_K, decode_attention
from kvq_jax.kernels.dispatch import (choose_implementation,
                                      pallas_unsupported_reason,
                                      resolve_interpret)
from kvq_jax.models.rope import Rope
from kvq_jax.quant import QuantSpec, constant_arrays, has_fixed_table

def committed_end(n: jax.Array, spec: LayerSpec,
                  flush: int | None = None) -> jax.Array:
  """Q(n): tokens [S, Q(n)) are in quantized storage after n tokens.

  `flush` None uses the larger of F_k, F_v (the tensor that commits last).
  """
  s, r = spec.sink, spec.residual
  f = spec.flush_block if flush is None else flush
  return s + f * (jnp.maximum(0, n - s - r) // f)


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
    end_b - start_b rows (`commit_rows` per sequence)."""
    return jax.vmap(lambda st, r, a, e: commit_rows(st, r, a, e, qspec))(
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
