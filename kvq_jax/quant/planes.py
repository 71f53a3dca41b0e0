"""A packed integer array read as bit planes: no interleaving unpack.

`packing` stores element P*i + j of a row (P = 8 / bits codes per byte) in
bits [bits*j, bits*(j+1)) of byte i. Plane j of an array is the strided
view x[..., j::P]: byte i shifted right by bits*j and masked. Reading the
planes separately skips the interleave that `packing.unpack` builds (a
stack and reshape that XLA:CPU materialises before any consumer), and a dot
over the last axis splits exactly into one dot per plane:

  q . x = sum_j q[j::P] . x[j::P]

`cache.attention.planar_block_attention` consumes them; measured in
results/decode_speed_and_kernels.md "Decode speed on this CPU" (`experiments.profile_read`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kvq_jax.quant.quantize import element_scales
from kvq_jax.quant.quantized_array import QuantizedArray
from kvq_jax.quant.spec import QuantSpec


def plane_count(spec: QuantSpec | None) -> int:
  """P, the planes `dequantize_planes` splits `spec`'s storage into; 0 when
  it cannot (full precision, float, codebook or static-level formats,
  outliers, bit widths that do not divide a byte)."""
  if (spec is None or spec.is_float or spec.is_codebook or not spec.has_scale
      or spec.outliers or 8 % spec.bits):
    return 0
  return 8 // spec.bits


def dequantize_planes(qa: QuantizedArray) -> tuple[jax.Array, ...]:
  """P float32 arrays [..., n / P]: plane j equals dequantize(qa)[..., j::P]
  (same codes, scale and zero, the same float32 operations)."""
  spec = qa.spec
  p = plane_count(spec)
  if not p:
    raise ValueError(
        f"dequantize_planes: {spec.format} {spec.scheme} storage "
        f"(bits={spec.bits}, outliers={spec.outliers}) has no bit planes; "
        "allowed: scaled integer formats of 2, 4 or 8 bits without outliers.")
  scale, zero = element_scales(qa)
  mask = (1 << spec.bits) - 1
  planes = []
  for j in range(p):
    codes = ((qa.data >> (spec.bits * j)) & mask) if p > 1 else qa.data
    vals = codes.astype(jnp.float32)
    if not spec.has_zero:
      vals = vals - 2 ** (spec.bits - 1)
    out = vals * scale[..., j::p]
    if zero is not None:
      out = out + zero[..., j::p]
    planes.append(out)
  return tuple(planes)


def nonfinite_rows(qa: QuantizedArray) -> jax.Array:
  """bool [..., L] over the rows (the last logical axis reduced): True
  where a scale or zero that reconstructs part of the row is NaN or Inf.

  Codes are finite integers, so these are the rows `dequantize` makes
  non-finite (short of a finite scale times a code overflowing float32,
  which needs inputs within a factor 8 of float32's largest value).
  """
  spec = qa.spec
  bad = ~jnp.isfinite(qa.scale.astype(jnp.float32))
  if spec.has_zero:
    bad = bad | ~jnp.isfinite(qa.zero.astype(jnp.float32))
  if spec.granularity == "per_tensor":
    return jnp.broadcast_to(jnp.any(bad), qa.shape[:-1])
  axis = len(qa.shape) + spec.group_axis
  if axis == len(qa.shape) - 1:  # Groups along the row.
    return jnp.any(bad, axis=-1)
  # Groups across rows (per-channel): each stored row of statistics covers
  # group_size rows along `axis`.
  bad = jnp.repeat(bad, qa.shape[axis] // bad.shape[axis], axis=axis)
  return jnp.any(bad, axis=-1)


def interleave_planes(planes) -> jax.Array:
  """Inverse of the plane split: [..., m] x P -> [..., m * P], element
  P*i + j from plane j."""
  stacked = jnp.stack(planes, axis=-1)
  return stacked.reshape(stacked.shape[:-2] + (-1,))
