"""Quantized KV cache of a sliding-window (local) layer: quantized rings.

Same formats and full-precision regions as `QuantizedLayerCache`
(`cache/quantized.py`, whose module docstring defines, per tensor x in
{K, V}, the flush block F_x, the committed end Q_x(n) and x's full-precision
window of W_x = R + F_x - 1 slots), for a layer whose query token i sees
only the tokens j with i - W < j <= i (W = `sliding_window`; ring
mechanics in `cache/sliding.py`). Two differences:

* No sinks: the layer's LayerSpec gets sink = 0 (`local_layer_spec`). A
  sink is meant to stay visible to every later query, which a local layer
  forbids once the sink leaves the window; so on a local layer the first
  tokens are quantized like any other (queries i < W see them dequantized
  where a global layer with sinks keeps them in full precision), and no
  sink byte is allocated or charged (`capacity.memory`).
* Quantized storage is a ring per tensor of
      R_x = round_up(max(W - R, 1), g_x)
  slots (g_x: x's per-channel token group, 1 for a token-local tensor): a
  committed token j sits in slot j mod R_x and, for per-channel x, its
  group's scales / zeros in group slot (j // g_x) mod (R_x / g_x) (R_x is a
  multiple of g_x, so a group never straddles the wrap). That is enough:
  after n tokens the committed tokens end at Q_x(n) <= n - R while the next
  query sees tokens > n - W, so at most W - R - 1 committed tokens, within
  ceil((W - R - 1) / g_x) groups, are still visible. It also holds every
  token a sequence of T <= W tokens commits (T - (R + F_x - 1) <= R_x), so
  up to T = W a local layer holds exactly what a global one does.
The memory is R_x stored tokens + W_x full-precision tokens per tensor,
whatever the context.

Each `attend` call with T new tokens (old length n0, new length n1), per
tensor x:
  1. builds E_x, x's full-precision tokens from Q_x(n0) (old window + the
     new tokens), and quantizes it, exactly as the linear cache does
     (`quantized.fresh_tokens`): the transient room of the chunk;
  2. lays out both copies of the band of tokens the chunk can see,
     j in [n0 - W + 1, n1): the dequantized copy from the old ring
     (j < Q_x(n0)) or from E_x's quantized rows (j >= Q_x(n0)), the full-
     precision copy from E_x;
  3. commits E_x's rows [Q_x(n0), Q_x(n1)) into the ring (only the newest
     R_x when more were committed) and keeps [Q_x(n1), n1) as the window.
Query token i = n0 + t then sees, for each visible j, x's full-precision
copy if j >= Q_x(i + 1), else the dequantized one -- what streaming decode
held when it processed token i, so chunked prefill (chunks of any size, T >
W included) and token-by-token decode agree, and the result equals the
linear `QuantizedLayerCache` (sink 0) with its causal mask narrowed to the
band. With F_k != F_v a token may be full precision in one tensor and
dequantized in the other, so the band is attended as up to three segments
(both full precision, mixed, both dequantized) merged by log-sum-exp.

The Pallas decode kernel reads linear storage [start, length) and cannot
follow a ring's wrap-around: an explicit attention_impl='pallas' is a
ValueError (at `create`, and at a decode step's dispatch), a tuple such as
("pallas", "xla") falls back to XLA with a warning at trace time.

Positions: as the linear cache, token i is assumed to sit at position i
(pre-RoPE keys are rotated by their token index; `check_positions`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from kvq_jax.cache import hadamard
from kvq_jax.cache.attention import band_mask, block_attention, merge_states
from kvq_jax.cache.quantized import (committed_end, fresh_tokens,
                                     layer_constants, layer_fixed_tables)
from kvq_jax.cache.quantized_keys import (attention_output, check_key_affine,
                                          check_positions, incoming_tokens,
                                          keys_for_scores, scaled_queries)
from kvq_jax.cache.quantized_store import (Store, empty_store, map_store,
                                           read_store, round_up, token_group)
from kvq_jax.cache.sliding import check_window, ring_update
from kvq_jax.cache.spec import LayerSpec
from kvq_jax.kernels.dispatch import choose_implementation
from kvq_jax.models.rope import Rope
from kvq_jax.quant import QuantSpec

RING_PALLAS_REASON = (
    "a sliding-window layer keeps its quantized tokens in a ring buffer "
    "(slot = token mod ring size); the decode kernel reads linear storage "
    "[start, length) and cannot follow the wrap-around.")


def local_layer_spec(spec: LayerSpec) -> LayerSpec:
  """The LayerSpec a local layer's cache uses: `spec` without sinks."""
  return spec if spec.sink == 0 else dataclasses.replace(spec, sink=0)


def ring_slots(spec: LayerSpec, name: str, sliding_window: int) -> int:
  """R_x of tensor `name` ('k' or 'v'): round_up(max(W - R, 1), g_x)."""
  return round_up(max(sliding_window - spec.residual, 1),
                  token_group(getattr(spec, name)))


def _write_ring(ring: Store, rows: Store, start: jax.Array, end: jax.Array,
                qspec: QuantSpec | None) -> Store:
  """One sequence: `ring` [K, R, ...] with tokens [start, end) written from
  `rows` [K, L, ...] (rows[:, i] holds token start + i); per-channel scales
  and zeros move by whole groups (start, end are multiples of the group)."""
  if qspec is None:
    return ring_update(ring, rows, start, end, axis=1)
  g = token_group(qspec)
  return map_store(
      lambda dst, src: ring_update(dst, src, start, end, axis=1),
      lambda dst, src: ring_update(dst, src, start // g, end // g, axis=1),
      ring, rows)


def _band_views(ring: Store, rows: Store, e_KxLxH: jax.Array,
                start: jax.Array, tok_L: jax.Array, qspec: QuantSpec | None
                ) -> tuple[jax.Array, jax.Array]:
  """One sequence: (dequantized, full-precision) copies [K, L, H] float32 of
  the band tokens `tok_L` (step 2 of the module docstring; `start` =
  Q_x(n0), the first token of E and of its rows). Entries a query never
  selects (tokens < 0, or a copy that does not exist) hold arbitrary
  values."""
  slots = ring.shape[-2]
  size_e = e_KxLxH.shape[1]
  dq_all = jnp.concatenate([read_store(ring, qspec), read_store(rows, qspec)],
                           axis=1)
  from_e_L = jnp.clip(tok_L - start, 0, size_e - 1)
  index_L = jnp.where(tok_L < start, jnp.mod(tok_L, slots), slots + from_e_L)
  return dq_all[:, index_L], e_KxLxH[:, from_e_L]


@struct.dataclass
class SlidingQuantizedLayerCache:
  """See the module docstring. Shapes: rings [B, K, R_k, H] / [B, K, R_v, H]
  (QuantizedArray, or a plain array for an unquantized tensor), windows
  [B, K, W_k, H] / [B, K, W_v, H] in spec.window_dtype."""

  k_ring: Store
  v_ring: Store
  window_k: jax.Array
  window_v: jax.Array
  length_B: jax.Array  # int32 [B]: tokens written (not capped).
  capacity: int = struct.field(pytree_node=False)
  sliding_window: int = struct.field(pytree_node=False)
  spec: LayerSpec = struct.field(pytree_node=False)

  @classmethod
  def create(cls, spec: LayerSpec, batch_size: int, capacity: int,
             num_kv_heads: int, head_dim: int, dtype=jnp.float32, *,
             sliding_window: int) -> SlidingQuantizedLayerCache:
    """Arguments as `QuantizedLayerCache.create`; `spec`'s sinks are
    dropped (`local_layer_spec`) and the rings sized from
    `sliding_window`, not from `capacity`."""
    if not isinstance(capacity, int) or capacity < 1:
      raise ValueError(
          f"SlidingQuantizedLayerCache.capacity={capacity!r}: must be a "
          "positive integer.")
    check_window(sliding_window, "SlidingQuantizedLayerCache")
    if spec.attention_choices == ("pallas",):
      raise ValueError(
          "SlidingQuantizedLayerCache: attention_impl='pallas' is "
          f"unsupported on a sliding-window layer: {RING_PALLAS_REASON} Use "
          "'xla' or a fallback tuple ('pallas', 'xla').")
    if spec.looks_up("k") or spec.looks_up("v"):
      raise ValueError(
          "SlidingQuantizedLayerCache: code_read='lookup' is unsupported on "
          "a sliding-window layer: its ring of at most W tokens is "
          "dequantized whole each step. Use code_read='dequantize'.")
    if spec.hadamard_k or spec.hadamard_v:
      hadamard.hadamard_matrix_np(head_dim)  # validates power of two.
    check_key_affine(spec, num_kv_heads, head_dim)
    spec = local_layer_spec(spec)
    b, k, h = batch_size, num_kv_heads, head_dim
    ring = lambda name: empty_store(
        getattr(spec, name), (b, k, ring_slots(spec, name, sliding_window), h),
        dtype)
    full = lambda n: jnp.zeros((b, k, n, h), spec.window_dtype)
    return cls(k_ring=ring("k"), v_ring=ring("v"),
               window_k=full(spec.window_of("k")),
               window_v=full(spec.window_of("v")),
               length_B=jnp.zeros((b,), jnp.int32), capacity=capacity,
               sliding_window=sliding_window, spec=spec)

  @property
  def dtype(self) -> jnp.dtype:
    """The compute dtype the cache was created with (see `create`)."""
    return jnp.dtype(self.k_ring.dtype)

  def ring_slots(self, name: str) -> int:
    """R_x: stored tokens the ring of tensor `name` ('k' / 'v') holds."""
    return (self.k_ring if name == "k" else self.v_ring).shape[-2]

  def storage_leaves(self) -> list[jax.Array]:
    """The rings' leaves (packed data, scales, zeros): bounded by W."""
    return jax.tree_util.tree_leaves((self.k_ring, self.v_ring))

  def fixed_leaves(self) -> list[jax.Array]:
    """The full-precision windows."""
    return [self.window_k, self.window_v]

  def constant_leaves(self) -> list[jax.Array]:
    """Per-layer constants (calibrated codebooks, key affine), as the
    linear cache's."""
    return layer_constants(self.spec, self.window_k.shape[-1])

  def fixed_tables(self) -> list[jax.Array]:
    """Format-fixed codebooks, as the linear cache's."""
    return layer_fixed_tables(self.spec, self.window_k.shape[-1])

  def _decode_impl(self) -> str:
    """'xla' (trace time): a ring cannot feed the Pallas kernel, so an
    explicit 'pallas' raises and a tuple falls back with a warning."""
    return choose_implementation(
        self.spec.attention_impl,
        lambda choice: None if choice == "xla" else RING_PALLAS_REASON,
        caller="SlidingQuantizedLayerCache.attend")

  def attend(self, q_BxTxNxH: jax.Array, k_BxTxKxH: jax.Array,
             v_BxTxKxH: jax.Array, positions_BxT: jax.Array,
             rope: Rope) -> tuple[jax.Array, SlidingQuantizedLayerCache]:
    spec = self.spec
    check_positions(spec, positions_BxT, self.length_B)
    t = q_BxTxNxH.shape[1]
    if t == 1:  # The decode step is where the kernel would be used.
      self._decode_impl()
    w = self.sliding_window
    k_new, v_new = incoming_tokens(spec, k_BxTxKxH, v_BxTxKxH, positions_BxT,
                                   rope)
    n0_B = self.length_B
    query_tok_BxT = n0_B[:, None] + jnp.arange(t)[None, :]
    band_tok_BxL = n0_B[:, None] + jnp.arange(w - 1 + t)[None, :] - (w - 1)

    def one_tensor(ring, win, n0, new, tok_L, qspec, flush):
      """One sequence, one tensor: steps 1-3 of the module docstring."""
      e, rows, start, end, new_win = fresh_tokens(win, n0, new, spec, qspec,
                                                  flush, self.dtype)
      dq_band, fp_band = _band_views(ring, rows, e, start, tok_L, qspec)
      return _write_ring(ring, rows, start, end, qspec), new_win, dq_band, \
          fp_band

    out = {}
    for name, ring, win, new in (("k", self.k_ring, self.window_k, k_new),
                                 ("v", self.v_ring, self.window_v, v_new)):
      fn = lambda *a, q=getattr(spec, name), f=spec.flush(name): one_tensor(
          *a, q, f)
      out[name] = jax.vmap(fn)(ring, win, n0_B, new.astype(self.dtype),
                               band_tok_BxL)
    new_cache = self.replace(k_ring=out["k"][0], v_ring=out["v"][0],
                             window_k=out["k"][1], window_v=out["v"][1],
                             length_B=n0_B + t)

    visible_BxTxL = band_mask(band_tok_BxL, query_tok_BxT, w)
    # full[x]: query i sees x's full-precision copy of j (j >= Q_x(i + 1)).
    full = {name: band_tok_BxL[:, None, :] >= committed_end(
        query_tok_BxT + 1, spec, spec.flush(name))[:, :, None]
            for name in ("k", "v")}
    keys = {"dq": keys_for_scores(spec, out["k"][2], band_tok_BxL, rope),
            "fp": keys_for_scores(spec, out["k"][3], band_tok_BxL, rope)}
    values = {"dq": out["v"][2], "fp": out["v"][3]}
    # Q_x grows slower for the larger F_x: that tensor may be full precision
    # where the other is already dequantized, never the reverse.
    segments = [("fp", "fp"), ("dq", "dq")]
    if spec.flush_k > spec.flush_v:
      segments.append(("fp", "dq"))
    elif spec.flush_v > spec.flush_k:
      segments.append(("dq", "fp"))
    pick = lambda name, copy: full[name] if copy == "fp" else ~full[name]
    q_BxKxGxTxH = scaled_queries(spec, q_BxTxNxH, k_BxTxKxH.shape[2])
    state = None
    for k_copy, v_copy in segments:
      mask_BxTxL = visible_BxTxL & pick("k", k_copy) & pick("v", v_copy)
      part = block_attention(q_BxKxGxTxH, keys[k_copy], values[v_copy],
                             mask_BxTxL)
      state = part if state is None else merge_states(state, part)
    return attention_output(spec, state, q_BxTxNxH), new_cache
