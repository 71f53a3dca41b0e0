"""`quantize` / `dequantize`: the reference arithmetic every kernel matches.

All arithmetic is float32. `b` is `spec.bits`, `half` = 2^(b-1), `scale_dtype`
is `spec.scale_dtype`; `tiny` and `max` are `jnp.finfo(scale_dtype).tiny/.max`.
"Cast up" means: cast the float32 value to scale_dtype (round to nearest),
and if that came out smaller than the float32 value, step to the next
representable value towards +inf (`jnp.nextafter`); "cast down" likewise
towards -inf. Before casting, values are clamped to [-max, max]. Rounding to
integers is `jnp.round` (half to even) unless said otherwise. `r` is
`spec.clip_ratio`.

Group statistics: `m` is the signed value of largest magnitude in the group
(ties: the first in group order, i.e. along the group axis, row-major for
per_tensor), `amax` = |m|, `lo` / `hi` the group's min / max.

rounding="kvq" (the default):

Symmetric integer (all 2^b codes, llama.cpp q4_0's level set):
  mag   = max(cast_up(r * |m| / half), tiny)
  scale = -mag if m > 0 else mag          (signed: r * m maps to q = -half)
  q     = clip(round(x / scale), -half, half - 1);   stored u = q + half
  x'    = (u - half) * scale

Symmetric narrow integer (2^b - 1 codes, qmax = half - 1):
  scale = max(cast_up(r * amax / qmax), tiny)
  q     = clip(round(x / scale), -qmax - 1, qmax);   stored u = q + half
  x'    = (u - half) * scale

Asymmetric integer (levels = 2^b - 1):
  lo, hi = the group's min and max (lo <= 0 <= hi is not enforced:
           KIVI-style real min/max); for r < 1 the range shrinks around its
           centre: lo += s, hi -= s with s = (1 - r) * (hi / 2 - lo / 2),
           i.e. [c - r * w, c + r * w] for c = (lo + hi) / 2, w = (hi - lo) / 2
  zero  = cast_down(lo)
  scale = max(cast_up((hi - zero) / levels), tiny)
  u     = clip(round((x - zero) / scale), 0, levels)
  x'    = u * scale + zero

fp8 (fmax = 448 for e4m3fn, 57344 for e5m2; symmetric only):
  scale = max(cast_up(r * amax / fmax), tiny)
  data  = clip(x / scale, -fmax, fmax).astype(fp8)   (round to nearest even)
  x'    = float32(data) * scale

Lloyd-Max (scheme lloyd_max; d = the elements of one group, c the 2^b
centroids and t the cell boundaries of `kvq_jax.quant.codebook` for (b, d)):
  n     = sqrt(sum(x^2))                  (the group's Euclidean norm)
  y     = x * sqrt(d) / n                 (0 where n == 0)
  u     = #{t_j < y}                      (the nearest centroid's index)
  scale = nearest(sum(x * c[u]) / sum(c[u]^2))   (least-squares scale: the
          error-minimising multiple of the chosen centroids; 0 for an
          all-zero group)
  x'    = c[u] * scale
The codebook is a per-format constant (2^b float32 values for every group
size in use); non-finite values follow the policy below (+-Inf take the
outer codes, NaN the code of 0.0).

Vector (scheme vector; c = 8 / b elements per index, C the 256 x c table
of `kvq_jax.quant.vector_codebook`): y as for Lloyd-Max, clipped to
[-1e4, 1e4] (+-Inf saturate, NaN is 0.0), then each c consecutive elements
y_j of a group take the index of the nearest codeword,
  u_j   = argmin_m |y_j - C[m]|^2       (ties: the lower index)
  scale = nearest(sum(x * C[u]) / sum(C[u]^2))   (least squares, as above)
  x'    = C[u] * scale
stored as one uint8 per c elements (stored bits b per element, like the
other formats; the table is one 4 KB (int2) or 2 KB (int4) constant).

Static (scheme static; no stored scale; L = 2^b levels over the fixed range
[-r, r], mid-rise, for tensors already normalised by calibrated ranges):
  u     = clip(floor((x / r + 1) * L / 2), 0, L - 1)
  x'    = ((u + 1/2) * 2 / L - 1) * r
so |x - x'| <= r / L inside the range; values beyond it saturate at the
outer levels (+-r (1 - 1/L)); NaN takes the code of 0.0 (x' = r / L).
With `spec.levels` (a calibrated codebook c, increasing, t_j = (c_j +
c_{j+1}) / 2): u = #{t_j < x}, x' = c[u] (NaN as 0.0, +-Inf the outer codes).

Outliers (spec.outliers = n > 0; before any of the above): per vector along
the last axis, the n finite values of largest magnitude (ties: the lower
index) are stored exactly in scale_dtype (rounded to nearest) with their
uint8 index, and replaced by 0.0 in the tensor that is then quantized, so
they take no part in its scale, zero or range; dequantization writes them
back over their codes. A vector with fewer than n finite values keeps its
chosen non-finite positions as 0.0.

For unclipped finite data this gives |x - x'| <= |scale| / 2 (plus float32
rounding) for integer formats, with bfloat16/float16 scales and zeros too.
(XLA computes x / scale as x * (1 / scale), the scale being broadcast over
its group: a quotient within an ulp of a rounding boundary may round the
other way than one division would.)
The one exception is symmetric's top code: a value with x / scale >
half - 1/2 (of sign opposite to m, within half a step of |m|) saturates at
q = half - 1, an error of at most |scale|.

rounding="ggml" (llama.cpp's arithmetic, as gguf-py's `quants.py`; clip_ratio
1 and float16 scales; `nearest` casts to float16 rounding to nearest, after
clamping to [-max, max] where ggml would store an infinity):
  symmetric:        d = m / -half
  symmetric_narrow: d = amax / (half - 1)
  asymmetric:       d = (hi - lo) / (2^b - 1)
  id = 1 / d (0 where d == 0)
  symmetric:        u = clip(trunc(x * id + (half + 0.5)), 0, 2^b - 1)
  symmetric_narrow: u = clip(round_half_away_from_zero(x * id), -half,
                             half - 1) + half
  asymmetric:       u = clip(trunc((x - lo) * id + 0.5), 0, 2^b - 1)
  stored scale = nearest(d) (signed, may be 0), zero = nearest(lo);
  x' as for kvq (u * scale is exact in float32: at most 8 + 11 significant
  bits, so a fused multiply-add with zero changes nothing). The products
  x * id and (x - lo) * id are rounded to float32 before the following add
  (no fused multiply-add, which XLA would otherwise emit and which moves
  about one code in 4 million), and d is one float32 division (XLA would
  multiply by the reciprocal of the constant: `_ieee_divide`), so int8
  symmetric_narrow,
  int4 / int5 symmetric and int4 / int5 asymmetric, per_group of 32 along the
  last axis, give gguf's Q8_0, Q4_0 / Q5_0 and Q4_1 / Q5_1 values exactly
  (tested on CPU; non-finite inputs, float32 denormals, which XLA CPU
  flushes to zero, and scales beyond float16's range excepted).

Non-finite policy (both roundings):
  * scale, zero, m, min, max and absmax are computed from the finite values
    of a group only (a group with no finite value behaves like an all-zero
    group).
  * NaN is quantized as if it were 0.0: symmetric, symmetric_narrow and fp8
    give q = 0, which dequantizes to exactly 0; asymmetric gives the code
    0.0 rounds to, clipped to [0, levels]: the grid point nearest 0 within
    [zero, zero + levels*scale] (the group's lo when all finite values are
    positive, its hi when all are negative).
  * +Inf / -Inf saturate to the group's largest / smallest value: the
    extreme codes (symmetric: q = -half or half - 1, whichever times the
    signed scale is larger; symmetric_narrow: qmax and -qmax-1; asymmetric:
    levels and 0; fp8: +fmax and -fmax). In a ggml group with d == 0 every
    code dequantizes to 0 (asymmetric: to zero).
  * Values beyond scale_dtype's range (1e30 with float16 scales) cap the
    scale at `max` and saturate; outputs stay finite (for float32 or bfloat16
    output; float16 output can still overflow on dequantization).
  * Groups are independent: a NaN/Inf in one group never changes another.
  * kvq: inputs below `tiny` (denormals; XLA CPU flushes them to zero) give
    |scale| = tiny and finite outputs; an all-zero group gets scale = +tiny.
    ggml: an all-zero group gets d = +-0 and dequantizes to +-0, as ggml's.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from kvq_jax.quant import codebook, component_codes, packing, vector_codebook
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


def _nearest(v32: jax.Array, dtype) -> jax.Array:
  """Casts float32 `v32` to `dtype`, round to nearest, clamped to +-max."""
  fmax = float(jnp.finfo(dtype).max)
  return jnp.clip(v32, -fmax, fmax).astype(dtype)


def _rounded(v: jax.Array) -> jax.Array:
  """`v` (a product) as a rounded float32 value, never fused into an FMA.

  XLA contracts `a * b + c` into a fused multiply-add (one rounding); a
  clamp between the product and the add prevents that. +-Inf become
  +-float32 max (they still saturate) and NaN stays NaN.
  """
  fmax = float(jnp.finfo(_F32).max)
  return jnp.clip(v, -fmax, fmax)


def signed_absmax(x: jax.Array, axis: int) -> jax.Array:
  """The first value of largest magnitude along `axis` (keepdims): the m of
  the symmetric rule (module docstring)."""
  index = jnp.argmax(jnp.abs(x), axis=axis, keepdims=True)
  return jnp.take_along_axis(x, index, axis=axis)


def _signed_absmax(x_fin: jax.Array, grouping) -> jax.Array:
  """`signed_absmax` per group (per_tensor: over the whole tensor)."""
  if grouping is None:
    return signed_absmax(x_fin.reshape(-1), 0).reshape((1,) * x_fin.ndim)
  return signed_absmax(x_fin, grouping[1])


def _min_max(xg: jax.Array, finite: jax.Array, grouping):
  """The group's min and max over its finite values (0, 0 if none)."""
  lo = _reduce(jnp.min, jnp.where(finite, xg, jnp.inf), grouping)
  hi = _reduce(jnp.max, jnp.where(finite, xg, -jnp.inf), grouping)
  any_finite = lo <= hi
  return jnp.where(any_finite, lo, 0.0), jnp.where(any_finite, hi, 0.0)


def _group_len(grouped_shape: tuple[int, ...], grouping) -> int:
  return grouped_shape[grouping[1]]


def _quantize_lloyd_max(xg, finite, x_nan0, grouping, spec: QuantSpec):
  """(scale, None, codes) for scheme='lloyd_max' (module docstring)."""
  d = _group_len(xg.shape, grouping)
  c = jnp.asarray(codebook.centroids(spec.bits, d))
  t = jnp.asarray(codebook.thresholds(spec.bits, d))
  x_fin = jnp.where(finite, xg, 0.0)
  norm = jnp.sqrt(_reduce(jnp.sum, x_fin * x_fin, grouping))
  y = x_nan0 * (jnp.float32(d) ** 0.5 / jnp.where(norm > 0, norm, 1.0))
  u = jnp.searchsorted(t, y, side="left").astype(jnp.uint8)
  cu = c[u]
  num = _reduce(jnp.sum, jnp.where(finite, x_fin * cu, 0.0), grouping)
  den = _reduce(jnp.sum, jnp.where(finite, cu * cu, 0.0), grouping)
  scale = jnp.where(den > 0, num / jnp.where(den > 0, den, 1.0), 0.0)
  return _nearest(scale, spec.scale_jnp_dtype), None, u


def _quantize_vector(xg, finite, x_nan0, grouping, spec: QuantSpec):
  """(scale, None, indices [..., groups, g / c]) for scheme='vector'."""
  d = _group_len(xg.shape, grouping)
  c = spec.vector_dim
  table = jnp.asarray(vector_codebook.centroids(spec.bits))  # [256, c]
  x_fin = jnp.where(finite, xg, 0.0)
  norm = jnp.sqrt(_reduce(jnp.sum, x_fin * x_fin, grouping))
  y = x_nan0 * (jnp.float32(d) ** 0.5 / jnp.where(norm > 0, norm, 1.0))
  y = jnp.clip(y, -1e4, 1e4).reshape(xg.shape[:-1] + (d // c, c))
  dist = (jnp.sum(y * y, -1, keepdims=True) - 2.0 * (y @ table.T)
          + jnp.sum(table * table, -1))
  u = jnp.argmin(dist, axis=-1).astype(jnp.uint8)
  cu = table[u].reshape(xg.shape)
  num = _reduce(jnp.sum, jnp.where(finite, x_fin * cu, 0.0), grouping)
  den = _reduce(jnp.sum, cu * cu, grouping)
  scale = jnp.where(den > 0, num / jnp.where(den > 0, den, 1.0), 0.0)
  return _nearest(scale, spec.scale_jnp_dtype), None, u


def _quantize_static(x_nan0, spec: QuantSpec):
  """(None, None, codes) for scheme='static' (module docstring)."""
  if spec.component_bits:
    return None, None, component_codes.component_codes(
        x_nan0, spec.component_bits, dict(spec.width_levels),
        spec.clip_ratio)
  if spec.levels:
    c = np.asarray(spec.levels, np.float32)
    t = jnp.asarray((c[1:] + c[:-1]) / 2)
    return None, None, jnp.searchsorted(t, x_nan0, side="left").astype(
        jnp.uint8)
  levels = 2 ** spec.bits
  r = jnp.float32(spec.clip_ratio)
  u = jnp.floor((_rounded(x_nan0 / r) + 1.0) * (levels / 2))
  return None, None, jnp.clip(u, 0, levels - 1).astype(jnp.uint8)


def _static_values(codes_u8: jax.Array, spec: QuantSpec) -> jax.Array:
  if spec.levels:
    return jnp.asarray(spec.levels, _F32)[codes_u8]
  step = jnp.float32(2.0 / 2 ** spec.bits)
  return ((codes_u8.astype(_F32) + 0.5) * step - 1.0) * jnp.float32(
      spec.clip_ratio)


def split_outliers(x: jax.Array, spec: QuantSpec):
  """(x with its outliers replaced by 0, values, uint8 indices) (module
  docstring)."""
  x32 = x.astype(_F32)
  finite = jnp.isfinite(x32)
  _, index = jax.lax.top_k(jnp.where(finite, jnp.abs(x32), -1.0),
                           spec.outliers)
  picked = jnp.take_along_axis(x32, index, axis=-1)
  values = _nearest(jnp.where(jnp.isfinite(picked), picked, 0.0),
                    spec.scale_jnp_dtype)
  hit = jnp.any(jnp.arange(x.shape[-1]) == index[..., None], axis=-2)
  return (jnp.where(hit, jnp.zeros((), x.dtype), x), values,
          index.astype(jnp.uint8))


def _quantize_kvq(xg, finite, x_nan0, grouping, spec: QuantSpec):
  """(scale, zero or None, codes) for rounding='kvq' (module docstring)."""
  if spec.is_vector:
    return _quantize_vector(xg, finite, x_nan0, grouping, spec)
  if spec.is_codebook:
    return _quantize_lloyd_max(xg, finite, x_nan0, grouping, spec)
  if spec.scheme == "static":
    return _quantize_static(x_nan0, spec)
  sdt = spec.scale_jnp_dtype
  half = 2 ** (spec.bits - 1)
  x_fin = jnp.where(finite, xg, 0.0)
  if spec.is_float:
    amax = _reduce(jnp.max, jnp.abs(x_fin), grouping) * spec.clip_ratio
    fmax = float(jnp.finfo(spec.fp8_dtype).max)
    scale = _floor_tiny(_cast(amax / fmax, sdt, jnp.inf))
    y = x_nan0 / scale.astype(_F32)
    return scale, None, jnp.clip(y, -fmax, fmax).astype(spec.fp8_dtype)
  if spec.scheme == "symmetric":
    m = _signed_absmax(x_fin, grouping) * spec.clip_ratio
    mag = _floor_tiny(_cast(jnp.abs(m) / half, sdt, jnp.inf))
    scale = jnp.where(m > 0, -mag, mag)
    q = jnp.clip(jnp.round(x_nan0 / scale.astype(_F32)), -half, half - 1)
    return scale, None, (q + half).astype(jnp.uint8)
  if spec.scheme == "symmetric_narrow":
    qmax = half - 1
    amax = _reduce(jnp.max, jnp.abs(x_fin), grouping) * spec.clip_ratio
    scale = _floor_tiny(_cast(amax / qmax, sdt, jnp.inf))
    q = jnp.clip(jnp.round(x_nan0 / scale.astype(_F32)), -qmax - 1, qmax)
    return scale, None, (q + half).astype(jnp.uint8)
  levels = 2 ** spec.bits - 1
  lo, hi = _min_max(xg, finite, grouping)
  if spec.clip_ratio != 1.0:  # Shrink around the centre; exact at r = 1.
    cut = jnp.float32(1.0) - jnp.float32(spec.clip_ratio)
    shrink = cut * (hi * 0.5 - lo * 0.5)
    lo, hi = lo + shrink, hi - shrink
  zero = _cast(lo, sdt, -jnp.inf)
  zero32 = zero.astype(_F32)
  scale = _floor_tiny(_cast((hi - zero32) / levels, sdt, jnp.inf))
  u = jnp.clip(jnp.round((x_nan0 - zero32) / scale.astype(_F32)), 0, levels)
  return scale, zero, u.astype(jnp.uint8)


def _ieee_divide(x: jax.Array, divisor: int) -> jax.Array:
  """x / divisor as one correctly rounded float32 division (numpy's, ggml's).

  XLA's algebraic simplifier turns a division by a broadcast scalar into a
  multiply by its reciprocal, two roundings: (hi - lo) * (1 / 31) differs
  from (hi - lo) / 31 for about a third of float32 inputs, and moved a
  Q5_1 code of a real SmolLM2 value block (tests/quant/test_ggml_exact.py).
  A divisor behind an optimization barrier is opaque to it.
  """
  den = jax.lax.optimization_barrier(jnp.full(x.shape, divisor, _F32))
  return x / den


def _quantize_ggml(xg, finite, x_nan0, grouping, spec: QuantSpec):
  """(scale, zero or None, codes) for rounding='ggml' (module docstring)."""
  sdt = spec.scale_jnp_dtype
  half = 2 ** (spec.bits - 1)
  levels = 2 ** spec.bits - 1
  x_fin = jnp.where(finite, xg, 0.0)
  lo = None
  if spec.scheme == "symmetric":
    d = _ieee_divide(_signed_absmax(x_fin, grouping), -half)
  elif spec.scheme == "symmetric_narrow":
    d = _ieee_divide(_reduce(jnp.max, jnp.abs(x_fin), grouping), half - 1)
  else:
    lo, hi = _min_max(xg, finite, grouping)
    d = _ieee_divide(hi - lo, levels)
  inv = jnp.where(d == 0, 0.0, 1.0 / jnp.where(d == 0, 1.0, d))
  y = x_nan0 * inv if lo is None else (x_nan0 - lo) * inv
  y = _rounded(jnp.where(jnp.isnan(y), 0.0, y))  # NaN: Inf * 0 (d == 0).
  if spec.scheme == "symmetric":
    u = jnp.clip(jnp.trunc(y + jnp.float32(half + 0.5)), 0, levels)
  elif spec.scheme == "symmetric_narrow":
    q = jax.lax.round(y, jax.lax.RoundingMethod.AWAY_FROM_ZERO)
    u = jnp.clip(q, -half, half - 1) + half
  else:
    u = jnp.clip(jnp.trunc(y + jnp.float32(0.5)), 0, levels)
  zero = None if lo is None else _nearest(lo, sdt)
  return _nearest(d, sdt), zero, u.astype(jnp.uint8)


@partial(jax.jit, static_argnums=1)
def quantize(x: jax.Array, spec: QuantSpec) -> QuantizedArray:
  """Quantizes floating-point `x` (any leading dims) according to `spec`."""
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise ValueError(
        f"quantize: x.dtype={x.dtype} is not supported; allowed: a floating "
        "dtype (float32, bfloat16, float16, ...).")
  shape = tuple(x.shape)
  spec.validate_shape(shape)
  outlier_value = outlier_index = None
  if spec.outliers:
    x, outlier_value, outlier_index = split_outliers(x, spec)
  grouping = _grouping(shape, spec)
  xg = x.astype(_F32)
  if grouping is not None:
    xg = xg.reshape(grouping[0])
  finite = jnp.isfinite(xg)
  x_nan0 = jnp.where(jnp.isnan(xg), 0.0, xg)
  fn = _quantize_ggml if spec.rounding == "ggml" else _quantize_kvq
  scale, zero, codes = fn(xg, finite, x_nan0, grouping, spec)
  if spec.is_vector:  # One uint8 index per vector_dim elements: the data.
    data = codes.reshape(shape[:-1] + (shape[-1] // spec.vector_dim,))
  elif spec.component_bits:
    codes = codes.reshape(shape)
    data = component_codes.pack_widths(codes, spec.component_bits)
  else:
    codes = codes.reshape(shape)
    data = codes if spec.is_float else packing.pack(codes, spec.bits)
  return QuantizedArray(
      data=data, scale=None if scale is None else _stored(scale, grouping),
      zero=None if zero is None else _stored(zero, grouping), spec=spec,
      last_dim=shape[-1], dtype=jnp.dtype(x.dtype).name,
      outlier_value=outlier_value, outlier_index=outlier_index)


@partial(jax.jit, static_argnames="dtype")
def dequantize(qa: QuantizedArray, dtype=None) -> jax.Array:
  """Reconstructs the tensor; `dtype` defaults to the original dtype."""
  spec = qa.spec
  out_dtype = jnp.dtype(qa.dtype if dtype is None else dtype)
  shape = qa.shape
  grouping = _grouping(shape, spec)
  if spec.is_float:
    vals = qa.data.astype(_F32)
  elif spec.component_bits:
    out = component_codes.component_values(
        component_codes.unpack_widths(qa.data, spec.component_bits),
        spec.component_bits, dict(spec.width_levels), spec.clip_ratio)
    return _with_outliers(out, qa).astype(out_dtype)
  elif not spec.has_scale:
    out = _static_values(packing.unpack(qa.data, spec.bits), spec)
    return _with_outliers(out, qa).astype(out_dtype)
  elif spec.is_vector:
    vals = jnp.asarray(vector_codebook.centroids(spec.bits))[qa.data]
  elif spec.is_codebook:
    d = _group_len(grouping[0], grouping)
    vals = jnp.asarray(codebook.centroids(spec.bits, d))[
        packing.unpack(qa.data, spec.bits)]
  else:
    vals = packing.unpack(qa.data, spec.bits).astype(_F32)
    if not spec.has_zero:
      vals = vals - 2 ** (spec.bits - 1)
  if grouping is not None:
    vals = vals.reshape(grouping[0])
  out = vals * _for_groups(qa.scale, grouping)
  if spec.has_zero:
    out = out + _for_groups(qa.zero, grouping)
  return _with_outliers(out.reshape(shape), qa).astype(out_dtype)


def element_scales(qa: QuantizedArray) -> tuple[jax.Array, jax.Array | None]:
  """(scale, zero or None) of every element of `qa`'s logical shape, float32.

  The per-group statistics broadcast to the elements they scale (a view for
  code that reconstructs part of the tensor itself, `quant.planes`):
  dequantize(qa) == codes * scale (+ zero) elementwise, for scaled integer
  formats without outliers.
  """
  spec = qa.spec
  shape = qa.shape
  grouping = _grouping(shape, spec)

  def expand(stored):
    full = jnp.broadcast_to(_for_groups(stored, grouping),
                            shape if grouping is None else grouping[0])
    return full.reshape(shape)

  return expand(qa.scale), (expand(qa.zero) if spec.has_zero else None)


def _with_outliers(out: jax.Array, qa: QuantizedArray) -> jax.Array:
  """`out` with the stored outliers written back (no-op without them)."""
  if qa.outlier_value is None:
    return out
  return jnp.put_along_axis(out, qa.outlier_index.astype(jnp.int32),
                            qa.outlier_value.astype(out.dtype), axis=-1,
                            inplace=False)
