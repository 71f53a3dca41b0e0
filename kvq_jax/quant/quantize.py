"""`quantize` / `dequantize`: the reference arithmetic every kernel matches.

All arithmetic is float32. `scale_dtype` below is `spec.scale_dtype`; `tiny`
and `max` are `jnp.finfo(scale_dtype).tiny/.max`. "Cast up" means: cast the
float32 value to scale_dtype (round to nearest), and if that came out smaller
than the float32 value, step to the next representable value towards +inf
(`jnp.nextafter`); "cast down" likewise towards -inf. Before casting, values
are clamped to [-max, max]. Rounding to integers is `jnp.round` (half to even).

Symmetric integer (bits b, qmax = 2^(b-1) - 1, offset = 2^(b-1)):
  amax  = clip_ratio * max|x| over the group
  scale = max(cast_up(amax / qmax), tiny)
  q     = clip(round(x / scale), -qmax - 1, qmax);   stored u = q + offset
  x'    = (u - offset) * scale

Asymmetric integer (levels = 2^b - 1):
  lo, hi = clip_ratio * min(x), clip_ratio * max(x) over the group
           (lo <= 0 <= hi is not enforced: KIVI-style real min/max)
  zero  = cast_down(lo)
  scale = max(cast_up((hi - zero) / levels), tiny)
  u     = clip(round((x - zero) / scale), 0, levels)
  x'    = u * scale + zero

fp8 (fmax = 448 for e4m3fn, 57344 for e5m2):
  scale = max(cast_up(amax / fmax), tiny)
  data  = clip(x / scale, -fmax, fmax).astype(fp8)   (round to nearest even)
  x'    = float32(data) * scale

For unclipped finite data this gives |x - x'| <= scale / 2 (plus float32
rounding) for integer formats, with bfloat16/float16 scales and zeros too.

Non-finite policy:
  * scale, zero, min, max and absmax are computed from the finite values of a
    group only (a group with no finite value behaves like an all-zero group).
  * NaN is quantized as if it were 0.0: symmetric and fp8 give code 0, which
    dequantizes to exactly 0; asymmetric gives u = clip(round(-zero / scale),
    0, levels), the grid point nearest 0 within [zero, zero + levels*scale]
    (the group's lo when all finite values are positive, its hi when all are
    negative).
  * +Inf / -Inf saturate to the group's largest / smallest code (qmax and
    -qmax-1; levels and 0; +fmax and -fmax).
  * Values beyond scale_dtype's range (1e30 with float16 scales) cap the
    scale at `max` and saturate; outputs stay finite (for float32 or bfloat16
    output; float16 output can still overflow on dequantization).
  * Groups are independent: a NaN/Inf in one group never changes another.
  * Inputs below `tiny` (denormals; XLA CPU flushes them to zero) give
    scale = tiny and finite outputs.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from kvq_jax.quant import packing
from kvq_jax.quant.quantized_array import QuantizedArray
from kvq_jax.quant.spec import QuantSpec

_F32 = jnp.float32


def _cast(v32: jax.Array, dtype, direction: float) -> jax.Array:
  """Casts float32 `v32` to `dtype`, rounding towards `direction` (+-inf)."""
  fmax = float(jnp.finfo(dtype).max)
  v32 = jnp.clip(v32, -fmax, fmax)
  v = v32.astype(dtype)
  if jnp.dtype(dtype) == jnp.dtype(_F32):
    return v
  wrong = v.astype(_F32) < v32 if direction > 0 else v.astype(_F32) > v32
  return jnp.where(wrong, jnp.nextafter(v, jnp.asarray(direction, dtype)), v)


def _floor_tiny(v: jax.Array) -> jax.Array:
  return jnp.maximum(v, jnp.asarray(jnp.finfo(v.dtype).tiny, v.dtype))


def _grouping(shape: tuple[int, ...], spec: QuantSpec):
  """(grouped shape, index of the within-group axis), or None (per_tensor).

  The group axis of length L is split into (L // g, g); statistics reduce the
  second of the two.
  """
  if spec.granularity == "per_tensor":
    return None
  axis = len(shape) + spec.group_axis
  length = shape[axis]
  g = spec.group_size if spec.group_size is not None else length
  grouped = shape[:axis] + (length // g, g) + shape[axis + 1:]
  return grouped, axis + 1


def _reduce(fn, xg: jax.Array, grouping) -> jax.Array:
  if grouping is None:
    return fn(xg, keepdims=True)
  return fn(xg, axis=grouping[1], keepdims=True)


def _stored(stat: jax.Array, grouping) -> jax.Array:
  """Drops the within-group axis of a keepdims statistic."""
  return stat if grouping is None else jnp.squeeze(stat, grouping[1])


def _for_groups(stored: jax.Array, grouping) -> jax.Array:
  """Inverse of `_stored`: stored scale -> broadcastable to the grouped view."""
  if grouping is None:
    return stored.astype(_F32)
  return jnp.expand_dims(stored, grouping[1]).astype(_F32)


@partial(jax.jit, static_argnums=1)
def quantize(x: jax.Array, spec: QuantSpec) -> QuantizedArray:
  """Quantizes floating-point `x` (any leading dims) according to `spec`."""
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise ValueError(
        f"quantize: x.dtype={x.dtype} is not supported; allowed: a floating "
        "dtype (float32, bfloat16, float16, ...).")
  shape = tuple(x.shape)
  spec.validate_shape(shape)
  grouping = _grouping(shape, spec)
  xg = x.astype(_F32)
  if grouping is not None:
    xg = xg.reshape(grouping[0])
  finite = jnp.isfinite(xg)
  x_nan0 = jnp.where(jnp.isnan(xg), 0.0, xg)
  sdt = spec.scale_jnp_dtype
  zero = None

  if spec.scheme == "symmetric":
    amax = _reduce(jnp.max, jnp.where(finite, jnp.abs(xg), 0.0), grouping)
    amax = amax * spec.clip_ratio
    top = float(jnp.finfo(spec.fp8_dtype).max) if spec.is_float else (
        2 ** (spec.bits - 1) - 1)
    scale = _floor_tiny(_cast(amax / top, sdt, jnp.inf))
    y = x_nan0 / scale.astype(_F32)
    if spec.is_float:
      codes = jnp.clip(y, -top, top).astype(spec.fp8_dtype)
    else:
      q = jnp.clip(jnp.round(y), -top - 1, top)
      codes = (q + 2 ** (spec.bits - 1)).astype(jnp.uint8)
  else:
    levels = 2 ** spec.bits - 1
    lo = _reduce(jnp.min, jnp.where(finite, xg, jnp.inf), grouping)
    hi = _reduce(jnp.max, jnp.where(finite, xg, -jnp.inf), grouping)
    any_finite = lo <= hi
    lo = jnp.where(any_finite, lo, 0.0) * spec.clip_ratio
    hi = jnp.where(any_finite, hi, 0.0) * spec.clip_ratio
    zero = _cast(lo, sdt, -jnp.inf)
    zero32 = zero.astype(_F32)
    scale = _floor_tiny(_cast((hi - zero32) / levels, sdt, jnp.inf))
    u = jnp.clip(jnp.round((x_nan0 - zero32) / scale.astype(_F32)), 0, levels)
    codes = u.astype(jnp.uint8)
    zero = _stored(zero, grouping)

  codes = codes.reshape(shape)
  data = codes if spec.is_float else packing.pack(codes, spec.bits)
  return QuantizedArray(
      data=data, scale=_stored(scale, grouping), zero=zero, spec=spec,
      last_dim=shape[-1], dtype=jnp.dtype(x.dtype).name)


@partial(jax.jit, static_argnames="dtype")
def dequantize(qa: QuantizedArray, dtype=None) -> jax.Array:
  """Reconstructs the tensor; `dtype` defaults to the original dtype."""
  spec = qa.spec
  out_dtype = jnp.dtype(qa.dtype if dtype is None else dtype)
  shape = qa.shape
  grouping = _grouping(shape, spec)
  if spec.is_float:
    vals = qa.data.astype(_F32)
  else:
    vals = packing.unpack(qa.data, spec.bits).astype(_F32)
    if spec.scheme == "symmetric":
      vals = vals - 2 ** (spec.bits - 1)
  if grouping is not None:
    vals = vals.reshape(grouping[0])
  out = vals * _for_groups(qa.scale, grouping)
  if spec.scheme == "asymmetric":
    out = out + _for_groups(qa.zero, grouping)
  return out.reshape(shape).astype(out_dtype)
