"""Differentiable fake quantization with a clip ratio (straight-through).

Mirrors `kvq_jax.quant.quantize` followed by `dequantize` in float32 for a
spec in the cache's heads-major layout [B, K, T, H] (per_token / per_group
group along head_dim, axis -1; per_channel along tokens, axis -2; see
`kvq_jax.cache.spec`), except that scales and zeros stay float32 (the cache
rounds them up to `spec.scale_dtype`, a relative change below 2^-8 for
bfloat16). The schemes follow the library: symmetric uses all 2^b codes with
a signed scale from the group's signed max times the clip ratio,
symmetric_narrow 2^b - 1 codes from the absmax, asymmetric shrinks [min, max]
around its centre. Rounding is the straight-through estimator
x + stop_gradient(round(x) - x), so the gradient with respect to the clip
ratio is LSQ's: inside the range it is round(x/s) - x/s, at saturation the
clamp level.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kvq_jax.quant import QuantSpec
from kvq_jax.quant.quantize import signed_absmax


def ste_round(x: jax.Array) -> jax.Array:
  return x + jax.lax.stop_gradient(jnp.round(x) - x)


def _grouped(x: jax.Array, spec: QuantSpec):
  """x reshaped so axis `red` holds one group's elements; and the reducer."""
  if spec.granularity == "per_tensor":
    return x.reshape(1, -1), 1
  axis = x.ndim + spec.group_axis
  length = x.shape[axis]
  g = spec.group_size if spec.group_size is not None else length
  if length % g:
    raise ValueError(
        f"fake_quant: group_size={g} does not divide the length {length} of "
        f"axis {spec.group_axis} (shape={x.shape}).")
  return x.reshape(x.shape[:axis] + (length // g, g) + x.shape[axis + 1:]), (
      axis + 1)


def fake_quant(x: jax.Array, spec: QuantSpec, clip: jax.Array) -> jax.Array:
  """dequantize(quantize(x)) with clip ratio `clip` (a traced scalar, or an
  array broadcastable against x's grouped view), differentiable in `clip`.

  `spec.clip_ratio` is ignored: `clip` replaces it. `spec.rounding` is
  ignored too: codes always use kvq's rounding (round half to even from the
  float32 scale); ggml's differs only at ties and by its float16 scales.
  """
  if spec.is_codebook or not spec.has_scale or spec.outliers:
    raise ValueError(
        f"fake_quant: scheme={spec.scheme!r}, outliers={spec.outliers}: no "
        "per-group clip ratio to calibrate (a codebook or a calibrated range "
        "fixes the levels; outliers are not emulated); allowed: symmetric, "
        "symmetric_narrow, asymmetric, fp8 without outliers.")
  shape = x.shape
  xg, red = _grouped(x.astype(jnp.float32), spec)
  tiny = jnp.finfo(jnp.float32).tiny
  if spec.is_float:
    amax = jnp.max(jnp.abs(xg), axis=red, keepdims=True) * clip
    fmax = float(jnp.finfo(spec.fp8_dtype).max)
    scale = jnp.maximum(amax / fmax, tiny)
    y = jnp.clip(xg / scale, -fmax, fmax)
    out = (y + jax.lax.stop_gradient(
        y.astype(spec.fp8_dtype).astype(jnp.float32) - y)) * scale
  elif spec.scheme == "symmetric":
    half = 2 ** (spec.bits - 1)
    m = signed_absmax(xg, red) * clip
    mag = jnp.maximum(jnp.abs(m) / half, tiny)
    scale = jnp.where(m > 0, -mag, mag)
    out = jnp.clip(ste_round(xg / scale), -half, half - 1) * scale
  elif spec.scheme == "symmetric_narrow":
    qmax = 2 ** (spec.bits - 1) - 1
    amax = jnp.max(jnp.abs(xg), axis=red, keepdims=True) * clip
    scale = jnp.maximum(amax / qmax, tiny)
    out = jnp.clip(ste_round(xg / scale), -qmax - 1, qmax) * scale
  else:
    levels = 2 ** spec.bits - 1
    lo = jnp.min(xg, axis=red, keepdims=True)
    hi = jnp.max(xg, axis=red, keepdims=True)
    shrink = (1.0 - clip) * (hi * 0.5 - lo * 0.5)  # Around the centre.
    lo, hi = lo + shrink, hi - shrink
    scale = jnp.maximum((hi - lo) / levels, tiny)
    u = jnp.clip(ste_round((xg - lo) / scale), 0, levels)
    out = u * scale + lo
  return out.reshape(shape)
