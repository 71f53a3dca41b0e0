"""`SelectiveLayerCache`: one layer's cache whose format choice is data.

A sensitivity sweep quantizes one layer (or all but one) at a time. With the
real caches every such mix is a different pytree structure and therefore a
new compilation. Here every layer keeps float32 K/V, and the *choice* of
format is an int32 leaf per tensor:

  k_choice / v_choice = 0  -> full precision (exactly `DenseLayerCache`),
  k_choice / v_choice = i  -> `spec.k_formats[i - 1]` / `spec.v_formats[i - 1]`,

applied as quantize -> dequantize round trips (`cache.round_trip`, via
`lax.switch`, so only the chosen branch runs). The candidate formats are
static; the choices vary per call without recompiling.

The cache holds one window: `attend` is called once, on an empty cache, with
the window's T tokens at positions 0..T-1 (`research.selective_forward`),
and reproduces what `QuantizedLayerCache` computes for that chunk, for every
format it stores, per_channel groups and full-precision regions included.
Per tensor x of a layer that quantizes K or V (a choice > 0), it builds two
views of the T tokens:
  * quantized: the tokens as the cache's storage reads them back (rounded
    to the window dtype first when x keeps a window, as a token waits there
    before it is committed; per_channel formats quantize each complete group
    of F tokens once, groups aligned after the sinks);
  * full precision: cast to the window dtype (sinks and window tokens);
and query token i reads token j from the full-precision view iff j < S (a
sink) or j >= Q_x(i + 1) (still in x's window; `Q_x(n) = S + F_x *
floor(max(0, n - S - R) / F_x)`, `cache/spec.py`), else from the quantized
view: exactly the visibility rule of the real cache, so the probe of a
per_channel (KIVI) format, a residual window or a flush block is as exact as
that of a token-local one (`tests/research/test_selective_cache.py` checks
each against the real cache). F_x is the base spec's explicit flush_block,
else the format's token group (1 for token-local formats), as
`CacheSpec.layer` resolves it for a layer override with that format.
Attention is four log-sum-exp-merged segments (K and V each quantized or
full precision), like the real cache's storage / mixed / window / sink
segments.

Storage is float32 whatever the cache dtype: the full-precision choice rounds
to the cache dtype and back, a quantized choice rounds to it before
quantizing, as the real caches do, and dequantized values are kept in float32
as `QuantizedLayerCache` reads them. After `attend`, `k_BxSxKxH` /
`v_BxSxKxH` hold the tokens as the window's last query read them.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
from flax import struct

from kvq_jax.cache import init_layer_caches
from kvq_jax.cache import round_trip
from kvq_jax.cache.attention import (band_mask, block_attention, gqa_attention,
                                     merge_states)
from kvq_jax.cache.key_affine import KeyAffine
from kvq_jax.cache.spec import KEY_ROPE, CacheSpec, to_cache_layout
from kvq_jax.models.config import ModelConfig
from kvq_jax.models.rope import Rope
from kvq_jax.quant import QuantSpec

FULL_PRECISION = 0  # The choice index of the full-precision branch.
EMULATED = ("per_token", "per_group", "per_channel")


def _check_format(spec: QuantSpec | None, flush_block: int | None,
                  where: str) -> None:
  if spec is None:
    return
  if spec.granularity not in EMULATED:
    raise ValueError(
        f"{where}.granularity={spec.granularity!r}: allowed: "
        f"{', '.join(EMULATED)}.")
  axis = -2 if spec.granularity == "per_channel" else -1
  if spec.axis not in (axis, None if axis == -1 else axis):
    raise ValueError(
        f"{where}.axis={spec.axis}: the cache layout [B, K, T, H] groups "
        f"{spec.granularity} along axis {axis}; allowed: {axis}"
        f"{' or None' if axis == -1 else ''} (`cache.spec.to_cache_layout`).")
  if spec.granularity == "per_channel" and flush_block is not None and (
      flush_block % spec.group_size):
    raise ValueError(
        f"{where}: per_channel group_size={spec.group_size} does not divide "
        f"the spec's flush_block={flush_block}; allowed: formats whose token "
        "groups divide it.")


@dataclasses.dataclass(frozen=True)
class SelectiveSpec:
  """Static part of a `SelectiveLayerCache` (hashable pytree aux data).

  Attributes:
    k_formats, v_formats: candidate specs (cache layout: axis -1 or None
      for token-local, -2 for per_channel); choice i >= 1 selects entry
      i - 1. A None entry is full precision.
    key_rope: 'post' or 'pre' (fake-quantize keys before RoPE).
    hadamard_k, hadamard_v: rotate head_dim around the round trip.
    rotation_key: the randomised rotation's (seed, layer); None: plain H.
    key_affine: calibrated pre-RoPE key shift/scale (key_rope 'pre'),
      applied to quantized keys only (a real layer has none without them).
    dtype: the full-precision cache dtype (a jnp dtype name).
    sliding_window: the layer's sliding window (Gemma 3 local layers), or
      None: a band mask over the linear storage (not a ring: this cache is
      a quality probe, not a memory measurement).
    sink, window_dtype: the first `sink` tokens kept in `window_dtype`
      while the layer quantizes (module docstring); a sliding-window layer
      keeps none, as the ring cache.
    residual, flush_block: the full-precision window of the newest tokens
      (`cache/spec.py`): R, and F for every tensor (None: each format's
      token group, 1 for token-local formats).
  """

  k_formats: tuple[QuantSpec | None, ...]
  v_formats: tuple[QuantSpec | None, ...]
  key_rope: str = "post"
  hadamard_k: bool = False
  hadamard_v: bool = False
  rotation_key: tuple[int, int] | None = None
  key_affine: KeyAffine | None = None
  dtype: str = "float32"
  sliding_window: int | None = None
  sink: int = 0
  window_dtype: str = "bfloat16"
  residual: int = 0
  flush_block: int | None = None

  def __post_init__(self):
    for name in ("residual", "sink"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 0:
        raise ValueError(f"SelectiveSpec.{name}={value!r}: allowed: an "
                         "integer >= 0.")
    if self.flush_block is not None and (
        not isinstance(self.flush_block, int) or self.flush_block < 1):
      raise ValueError(f"SelectiveSpec.flush_block={self.flush_block!r}: "
                       "allowed: None or a positive integer.")
    for name in ("k_formats", "v_formats"):
      formats = tuple(getattr(self, name))
      object.__setattr__(self, name, formats)
      for i, spec in enumerate(formats):
        _check_format(spec, self.flush_block, f"SelectiveSpec.{name}[{i}]")
    if self.key_rope not in KEY_ROPE:
      raise ValueError(
          f"SelectiveSpec.key_rope={self.key_rope!r}: allowed: "
          f"{', '.join(KEY_ROPE)}.")
    object.__setattr__(self, "dtype", jnp.dtype(self.dtype).name)
    if self.sliding_window is not None:
      object.__setattr__(self, "sink", 0)

  @property
  def num_k_choices(self) -> int:
    return len(self.k_formats) + 1

  @property
  def num_v_choices(self) -> int:
    return len(self.v_formats) + 1

  def flush(self, spec: QuantSpec | None) -> int:
    """F of a tensor stored in `spec` (`CacheSpec._flush`'s rule)."""
    if self.flush_block is not None:
      return self.flush_block
    return spec.group_size if (
        spec is not None and spec.granularity == "per_channel") else 1

  def keeps_window(self, spec: QuantSpec | None) -> bool:
    """Whether a tensor in `spec` holds full-precision window slots."""
    return self.residual + self.flush(spec) - 1 > 0


@struct.dataclass
class SelectiveLayerCache:
  """K/V [B, S=capacity, K, H] in float32 plus the format choice."""

  k_BxSxKxH: jax.Array
  v_BxSxKxH: jax.Array
  length_B: jax.Array  # int32 [B]
  k_choice: jax.Array  # int32 []: 0 = full precision, i = k_formats[i - 1].
  v_choice: jax.Array  # int32 []
  capacity: int = struct.field(pytree_node=False)
  spec: SelectiveSpec = struct.field(pytree_node=False)
  written: bool = struct.field(pytree_node=False, default=False)

  @classmethod
  def create(cls, spec: SelectiveSpec, batch_size: int, capacity: int,
             num_kv_heads: int, head_dim: int, k_choice=FULL_PRECISION,
             v_choice=FULL_PRECISION) -> SelectiveLayerCache:
    for name, value in (("batch_size", batch_size), ("capacity", capacity),
                        ("num_kv_heads", num_kv_heads),
                        ("head_dim", head_dim)):
      if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(
            f"SelectiveLayerCache.{name}={value!r}: must be a positive "
            "integer.")
    for name, value, count in (("k_choice", k_choice, spec.num_k_choices),
                               ("v_choice", v_choice, spec.num_v_choices)):
      if isinstance(value, int) and not 0 <= value < count:
        raise ValueError(
            f"SelectiveLayerCache.{name}={value}: allowed: 0 (full "
            f"precision) .. {count - 1} (the candidate formats).")
    shape = (batch_size, capacity, num_kv_heads, head_dim)
    return cls(k_BxSxKxH=jnp.zeros(shape, jnp.float32),
               v_BxSxKxH=jnp.zeros(shape, jnp.float32),
               length_B=jnp.zeros((batch_size,), jnp.int32),
               k_choice=jnp.asarray(k_choice, jnp.int32),
               v_choice=jnp.asarray(v_choice, jnp.int32),
               capacity=capacity, spec=spec)

  def _key_views(self, fmt: QuantSpec | None, rope: Rope):
    """Branch of the K switch: (quantized view, full-precision view, F)."""
    s = self.spec
    pre_round = s.window_dtype if s.keeps_window(fmt) else None
    trip = lambda k, p, **kw: round_trip.keys(
        k, p, rope, fmt, s.dtype, s.key_rope, s.hadamard_k, s.rotation_key,
        s.key_affine if fmt is not None else None, **kw)
    return lambda k, p: (
        trip(k, p, pre_round=pre_round, token_start=s.sink),
        trip(k, p, window_dtype=s.window_dtype), jnp.int32(s.flush(fmt)))

  def _value_views(self, fmt: QuantSpec | None):
    s = self.spec
    pre_round = s.window_dtype if s.keeps_window(fmt) else None
    trip = lambda v, **kw: round_trip.values(
        v, fmt, s.dtype, s.hadamard_v, s.rotation_key, **kw)
    return lambda v: (trip(v, pre_round=pre_round, token_start=s.sink),
                      trip(v, window_dtype=s.window_dtype),
                      jnp.int32(s.flush(fmt)))

  def _reads_full(self, flush, quantizing, tok_T):
    """[T, T]: query i reads token j from the full-precision view."""
    s = self.spec
    end_T = s.sink + flush * (jnp.maximum(0, tok_T + 1 - s.sink - s.residual)
                              // flush)
    return quantizing & ((tok_T[None, :] < s.sink)
                         | (tok_T[None, :] >= end_T[:, None]))

  def attend(self, q_BxTxNxH: jax.Array, k_BxTxKxH: jax.Array,
             v_BxTxKxH: jax.Array, positions_BxT: jax.Array,
             rope: Rope) -> tuple[jax.Array, SelectiveLayerCache]:
    """Attends the window's T tokens over themselves as the real cache of
    the chosen formats would (module docstring)."""
    if self.written:
      raise ValueError(
          "SelectiveLayerCache holds one window: attend is called once, on "
          "an empty cache (research.selective_forward builds a fresh one per "
          "window); streaming decode needs the real caches.")
    s = self.spec
    b, t, n, h = q_BxTxNxH.shape
    if t > self.capacity:
      raise ValueError(f"SelectiveLayerCache: {t} tokens exceed its capacity "
                       f"{self.capacity}.")
    k_q, k_full, flush_k = jax.lax.switch(
        self.k_choice, [self._key_views(f, rope) for f in (None,)
                        + s.k_formats], k_BxTxKxH, positions_BxT)
    v_q, v_full, flush_v = jax.lax.switch(
        self.v_choice, [self._value_views(f) for f in (None,)
                        + s.v_formats], v_BxTxKxH)
    quantizing = (self.k_choice != FULL_PRECISION) | (
        self.v_choice != FULL_PRECISION)
    k_dense = round_trip.keys(k_BxTxKxH, positions_BxT, rope, None, s.dtype,
                              s.key_rope, False)
    v_dense = round_trip.values(v_BxTxKxH, None, s.dtype, False)
    k_q = jnp.where(quantizing, k_q, k_dense)
    v_q = jnp.where(quantizing, v_q, v_dense)
    tok_T = jnp.arange(t, dtype=jnp.int32)
    full_k = self._reads_full(flush_k, quantizing, tok_T)
    full_v = self._reads_full(flush_v, quantizing, tok_T)
    visible_BxTxT = jnp.broadcast_to(tok_T[None, :] <= tok_T[:, None],
                                     (b, t, t))
    if s.sliding_window is not None:
      tok_BxT = jnp.broadcast_to(tok_T, (b, t))
      visible_BxTxT = band_mask(tok_BxT, tok_BxT, s.sliding_window)

    def quantized_attention(_):
      q_BxKxGxTxH = jnp.moveaxis(
          (q_BxTxNxH.astype(jnp.float32) * (h ** -0.5)).reshape(
              b, t, k_q.shape[2], n // k_q.shape[2], h), 1, 3)
      heads_major = lambda x: jnp.swapaxes(x, 1, 2)
      state = None
      for k_is_full, keys in ((False, k_q), (True, k_full)):
        for v_is_full, values in ((False, v_q), (True, v_full)):
          mask = visible_BxTxT & ((full_k == k_is_full)
                                  & (full_v == v_is_full))[None]
          part = block_attention(q_BxKxGxTxH, heads_major(keys),
                                 heads_major(values), mask)
          state = part if state is None else merge_states(state, part)
      _, l, acc = state
      out_BxKxGxTxH = acc / l[..., None]
      return jnp.moveaxis(out_BxKxGxTxH, 3, 1).reshape(b, t, n, h).astype(
          q_BxTxNxH.dtype)

    def dense_attention(_):
      return gqa_attention(q_BxTxNxH, k_dense, v_dense, visible_BxTxT)

    out_BxTxNxH = jax.lax.cond(quantizing, quantized_attention,
                               dense_attention, None)
    last = lambda full, quant, fp: jnp.where(full[-1][None, :, None, None],
                                             fp, quant)
    keep = lambda buf, x: jax.lax.dynamic_update_slice_in_dim(buf, x, 0, 1)
    return out_BxTxNxH, self.replace(
        k_BxSxKxH=keep(self.k_BxSxKxH, last(full_k, k_q, k_full)),
        v_BxSxKxH=keep(self.v_BxSxKxH, last(full_v, v_q, v_full)),
        length_B=self.length_B + t, written=True)


def layer_specs(config: ModelConfig, spec: CacheSpec,
                extra_k: Sequence[QuantSpec | None] = (),
                extra_v: Sequence[QuantSpec | None] = (),
                dtype="float32") -> list[SelectiveSpec]:
  """Per-layer `SelectiveSpec`s: choice 1 is `spec`'s own format there.

  Choices 2, 3, ... are `extra_k` / `extra_v` (the same for every layer;
  user layout, as in a `CacheSpec`). A key choice is stored as the layer
  would store it as an override (`CacheSpec.key_format`: its calibrated
  codebook, or its per-component widths), so a probe measures the format
  an allocation built from it will run. Raises ValueError for a format the
  probe cannot emulate (per_tensor).
  """
  extra_v = tuple(to_cache_layout(f, "extra_v") for f in extra_v)
  out = []
  for i in range(config.num_layers):
    layer = spec.layer(i)
    layer_k = tuple(to_cache_layout(spec.key_format(f, i), "extra_k")
                    for f in extra_k)
    out.append(SelectiveSpec(
        k_formats=(layer.k,) + layer_k,
        v_formats=(layer.v,) + extra_v,
        key_rope=layer.key_rope, hadamard_k=layer.hadamard_k,
        hadamard_v=layer.hadamard_v, rotation_key=layer.rotation_key,
        key_affine=layer.key_affine,
        dtype=dtype,
        sliding_window=config.layer_window(i), sink=layer.sink,
        window_dtype=layer.window_dtype, residual=layer.residual,
        flush_block=spec.flush_block))
  return out


def init_selective_cache(config: ModelConfig, specs: Sequence[SelectiveSpec],
                         batch_size: int, capacity: int, k_choice_L,
                         v_choice_L) -> list[SelectiveLayerCache]:
  """One `SelectiveLayerCache` per layer; choices are int32 [L] (traced ok)."""
  if len(specs) != config.num_layers:
    raise ValueError(
        f"init_selective_cache: {len(specs)} SelectiveSpecs for a model with "
        f"num_layers={config.num_layers}; allowed: exactly one per layer.")
  k_choice_L = jnp.asarray(k_choice_L, jnp.int32)
  v_choice_L = jnp.asarray(v_choice_L, jnp.int32)
  for name, arr in (("k_choice_L", k_choice_L), ("v_choice_L", v_choice_L)):
    if arr.shape != (config.num_layers,):
      raise ValueError(
          f"init_selective_cache: {name} has shape {arr.shape}; allowed: "
          f"({config.num_layers},), one choice per layer.")
  return init_layer_caches(config, lambda i: SelectiveLayerCache.create(
      specs[i], batch_size, capacity, config.num_kv_heads, config.head_dim,
      k_choice_L[i], v_choice_L[i]))
