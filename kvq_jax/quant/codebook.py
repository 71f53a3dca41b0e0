"""Lloyd-Max codebooks for the coordinates of a randomly rotated unit vector.

If a vector of dimension d is normalised and rotated by a random orthogonal
transform (the cache's randomised Hadamard, `kvq_jax.cache.hadamard`), each
coordinate t of the result is distributed like one coordinate of a uniform
point on the sphere S^(d-1):

    p(t) = (1 - t^2)^((d - 3) / 2) / B(1/2, (d - 1)/2),   t in [-1, 1],

whatever the vector was (TurboQuant, "scalar HIGGS"). Scaled by sqrt(d),
z = sqrt(d) t has unit variance and tends to N(0, 1) as d grows. The 2^b
centroids here are the Lloyd-Max (minimum mean squared error) scalar
quantizer of z: each centroid is the mean of p over its cell and each cell
boundary the midpoint of its two centroids. They are computed once per
(bits, d) by Lloyd iterations on a fine grid of the exact density and cached.

`centroids(bits, dim)` -> float32 [2^b], ascending and symmetric about 0.
`thresholds(bits, dim)` -> float32 [2^b - 1], the cell boundaries.
"""

from __future__ import annotations

import functools

import numpy as np

SUPPORTED_BITS = (2, 3, 4, 5)
MIN_DIM = 4
_GRID = 400_001
_MAX_ITERS = 20_000
_TOL = 1e-12


def _density_grid(dim: int) -> tuple[np.ndarray, np.ndarray]:
  """(z, w): a grid over [-sqrt(d), sqrt(d)] and normalised weights of p."""
  t = np.linspace(-1.0, 1.0, _GRID)
  with np.errstate(divide="ignore", invalid="ignore"):
    logp = 0.5 * (dim - 3) * np.log1p(-t * t)
  logp[~np.isfinite(logp)] = -np.inf if dim > 3 else 0.0
  w = np.exp(logp - np.max(logp))
  return t * np.sqrt(dim), w / w.sum()


def _check(bits: int, dim: int) -> None:
  if bits not in SUPPORTED_BITS:
    raise ValueError(
        f"Lloyd-Max codebook: bits={bits!r} is not supported; allowed: "
        f"{', '.join(map(str, SUPPORTED_BITS))}.")
  if isinstance(dim, bool) or not isinstance(dim, int) or dim < MIN_DIM:
    raise ValueError(
        f"Lloyd-Max codebook: dim={dim!r} (elements normalised together) is "
        f"too small; allowed: an int >= {MIN_DIM}.")


@functools.lru_cache(maxsize=None)
def _centroids64(bits: int, dim: int) -> np.ndarray:
  _check(bits, dim)
  z, w = _density_grid(dim)
  # Cumulative mass F and first moment G at the grid points; between them
  # both are interpolated linearly, so cell boundaries move continuously.
  f = np.cumsum(w)
  g = np.cumsum(w * z)
  n = 2 ** bits
  c = np.interp((np.arange(n) + 0.5) / n, f, z)  # quantiles: the start.
  for _ in range(_MAX_ITERS):
    mid = 0.5 * (c[1:] + c[:-1])
    fe = np.concatenate([[0.0], np.interp(mid, z, f), [1.0]])
    ge = np.concatenate([[0.0], np.interp(mid, z, g), [g[-1]]])
    new = (ge[1:] - ge[:-1]) / (fe[1:] - fe[:-1])
    new = 0.5 * (new - new[::-1])  # exact symmetry about 0.
    done = np.max(np.abs(new - c)) < _TOL
    c = new
    if done:
      break
  return c


def centroids(bits: int, dim: int) -> np.ndarray:
  """The 2^bits Lloyd-Max centroids of sqrt(dim) * (sphere coordinate)."""
  return _centroids64(bits, dim).astype(np.float32)


def thresholds(bits: int, dim: int) -> np.ndarray:
  """Cell boundaries: midpoints of consecutive centroids, [2^bits - 1]."""
  c = _centroids64(bits, dim)
  return (0.5 * (c[1:] + c[:-1])).astype(np.float32)
