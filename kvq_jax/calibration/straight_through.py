"""Differentiable stand-ins for the cache's rounding (the KL fit's forward).

Each function returns exactly what the cache stores and reads back, and
defines the gradient the fit follows:

* `straight_through(x, fn, bound)`: any round trip `fn`; identity gradient
  inside the range (LSQ's straight-through estimator), zero for a clipped
  value.
* `static_codebook_round_trip(z, levels_C, spec, dtype)`: static keys
  rounded to a codebook that is itself being learned: the reconstruction
  c[u] is differentiable in the levels c (the gather), the codes u are not
  (they move only when a level crosses a key), and the keys pass their
  gradient straight through inside the codebook's outer cells and at kept
  outliers.
* `skew_exp(a_KxHxH)`: an orthogonal matrix per head from unconstrained
  parameters, exp(S) with S = (A - A^T) / 2 (I at A = 0), so an Adam step
  on A keeps a rotation a rotation.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from kvq_jax.quant import QuantSpec
from kvq_jax.quant.quantize import split_outliers


def straight_through(x: jax.Array, fn: Callable[[jax.Array], jax.Array],
                     bound: float | None = None) -> jax.Array:
  """fn(x) forward; backward the identity (fn itself is never
  differentiated), except, with `bound`, where |x| > bound and fn did not
  keep x exactly (a value clipped to the range, not an outlier): there the
  gradient is 0, as the clipped output does not move with x (LSQ)."""
  stopped = jax.lax.stop_gradient(x)
  out = jax.lax.stop_gradient(fn(stopped))
  if bound is None:
    return out + (x - stopped)
  passes = (jnp.abs(stopped) <= bound) | (out == stopped)
  return out + jnp.where(passes, x - stopped, 0.0)


def outer_edges(levels_C: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The codebook's representable range: its outer cells extended by half
  their neighbour gap ([-r, r] for the uniform mid-rise levels)."""
  low = levels_C[0] - (levels_C[1] - levels_C[0]) / 2
  high = levels_C[-1] + (levels_C[-1] - levels_C[-2]) / 2
  return low, high


def static_codebook_round_trip(z: jax.Array, levels_C: jax.Array,
                               spec: QuantSpec, dtype) -> jax.Array:
  """Static keys `z` (normalised, float32, head_dim last) cast to `dtype`,
  their `spec.outliers` largest per vector kept (rounded to the scale
  dtype), the rest rounded to the nearest of `levels_C` (increasing) --
  value for value what the cache stores for a spec with levels=levels_C.
  Gradients: module docstring."""
  z_sg = jax.lax.stop_gradient(z)
  lv = jax.lax.stop_gradient(levels_C)
  x = z_sg.astype(dtype).astype(jnp.float32)
  kept = jnp.zeros(x.shape, bool)
  if spec.outliers:
    x_in, values, index = split_outliers(x, spec)
    index = index.astype(jnp.int32)
    kept = jnp.any(jnp.arange(x.shape[-1]) == index[..., None], axis=-2)
  else:
    x_in = x
  codes = jnp.searchsorted((lv[1:] + lv[:-1]) / 2, x_in, side="left")
  y = levels_C[codes]
  if spec.outliers:
    y = jnp.put_along_axis(y, index, values.astype(jnp.float32), axis=-1,
                           inplace=False)
  low, high = outer_edges(lv)
  passes = ((z_sg >= low) & (z_sg <= high)) | kept
  return y + jnp.where(passes, z - z_sg, 0.0)


def uniform_levels(spec: QuantSpec) -> jax.Array:
  """The 2^b uniform mid-rise levels of a static spec without a codebook
  (`quantize`'s docstring): ((u + 1/2) 2 / L - 1) r."""
  count = 2 ** spec.bits
  u = jnp.arange(count, dtype=jnp.float32)
  return ((u + 0.5) * (2.0 / count) - 1.0) * jnp.float32(spec.clip_ratio)


def skew_exp(a_KxHxH: jax.Array, squarings: int = 6,
             terms: int = 12) -> jax.Array:
  """Orthogonal [K, H, H]: exp(S), S = (A - A^T) / 2, by scaling and
  squaring a Taylor series (matmuls only: no LAPACK call inside the fit's
  jitted program, where XLA:CPU's solver custom calls stalled). Exact
  identity at A = 0; orthogonal to float32 rounding while the largest
  entry of S stays below about 2^squarings (|S / 2^squarings| <= 1 keeps
  the truncated series' error below 1 / (terms + 1)!)."""
  s = (a_KxHxH - jnp.swapaxes(a_KxHxH, -1, -2)) / (2 * 2 ** squarings)
  eye = jnp.broadcast_to(jnp.eye(a_KxHxH.shape[-1], dtype=a_KxHxH.dtype),
                         a_KxHxH.shape)
  mm = lambda x, y: jnp.einsum("kab,kbc->kac", x, y,
                               precision=jax.lax.Precision.HIGHEST)
  out, term = eye, eye
  for n in range(1, terms + 1):
    term = mm(term, s) / n
    out = out + term
  for _ in range(squarings):
    out = mm(out, out)
  return out
