"""Vector-quantization codebooks for groups of rotated coordinates.

After the cache's randomised Hadamard (`kvq_jax.cache.hadamard`) and
normalisation to norm sqrt(d), c consecutive coordinates of a d-element
vector are close to c independent standard normals (exactly so as d grows;
`kvq_jax.quant.codebook` gives the exact one-coordinate density). Scheme
`vector` (`kvq_jax.quant.quantize`) codes each such c-group with one 8-bit
index into a 256-entry codebook in R^c: c = 4 at 2 bits per element, c = 2
at 4 bits. The codebook here is k-means (Lloyd's algorithm) on samples of
N(0, I_c), started from the product of the scalar Lloyd-Max levels, so on
its training set it can only lower the product quantizer's error.

The codebooks are per-format constants: fitted once by
`python -m experiments.make_vq_codebooks` (`fit_gaussian`, fixed seed) and
shipped as `vq_codebooks.npz` beside this file, so every machine codes with
the same table. `tests/quant/test_vector_quant.py` checks the shipped
tables against fresh samples (a Lloyd fixed point, and lower error than the
product codebook).

`centroids(bits)` -> float32 [256, 8 // bits].
"""

from __future__ import annotations

import functools
import itertools
import pathlib

import numpy as np

from kvq_jax.quant import codebook

SUPPORTED_BITS = (1, 2, 4)
INDEX_BITS = 8
TABLE_PATH = pathlib.Path(__file__).with_name("vq_codebooks.npz")
# The scalar start: Lloyd-Max levels of a coordinate of a large sphere
# (indistinguishable from N(0, 1)'s at this dimension).
_START_DIM = 4096


def _check(bits: int) -> None:
  if bits not in SUPPORTED_BITS:
    raise ValueError(
        f"vector codebook: bits={bits!r} is not supported; allowed: "
        f"{', '.join(map(str, SUPPORTED_BITS))} (one 8-bit index per "
        "8 // bits elements).")


def group_dim(bits: int) -> int:
  """Elements coded by one index: 8 at 1 bit, 4 at 2 bits, 2 at 4 bits."""
  _check(bits)
  return INDEX_BITS // bits


def product_start(bits: int) -> np.ndarray:
  """The product of the scalar Lloyd-Max levels: float64 [256, c] (1 bit:
  N(0, 1)'s +-sqrt(2/pi))."""
  if bits == 1:
    levels = np.sqrt(2.0 / np.pi) * np.array([-1.0, 1.0])
  else:
    levels = codebook._centroids64(bits, _START_DIM)  # pylint: disable=protected-access
  return np.asarray(list(itertools.product(levels, repeat=group_dim(bits))))


def nearest(x_NxC: np.ndarray, cb_MxC: np.ndarray) -> tuple[np.ndarray,
                                                            np.ndarray]:
  """(index [N], squared distance [N]) of each row's nearest codeword."""
  d = ((x_NxC * x_NxC).sum(1)[:, None] - 2.0 * x_NxC @ cb_MxC.T
       + (cb_MxC * cb_MxC).sum(1)[None, :])
  index = d.argmin(1)
  return index, np.maximum(d[np.arange(len(d)), index], 0.0)


def lloyd_step(x_NxC: np.ndarray, cb_MxC: np.ndarray) -> np.ndarray:
  """One Lloyd iteration: every codeword moves to the mean of its cell (an
  empty cell keeps its codeword)."""
  index, _ = nearest(x_NxC, cb_MxC)
  sums = np.zeros_like(cb_MxC)
  np.add.at(sums, index, x_NxC)
  count = np.bincount(index, minlength=len(cb_MxC))[:, None]
  return np.where(count > 0, sums / np.maximum(count, 1), cb_MxC)


def fit_gaussian(bits: int, num_samples: int = 1 << 18, iters: int = 300,
                 seed: int = 0, tol: float = 1e-7) -> np.ndarray:
  """k-means codebook of N(0, I_c) for `bits` per element: float64 [256, c].

  Lloyd iterations from `product_start` (1 bit: the first 256 draws) on
  `num_samples` draws of `np.random.default_rng(seed)`, until no codeword
  moves by more than `tol` or after `iters` iterations.
  """
  x = np.random.default_rng(seed).standard_normal(
      (num_samples, group_dim(bits)))
  cb = x[:256].copy() if bits == 1 else product_start(bits)
  for _ in range(iters):
    new = lloyd_step(x, cb)
    done = np.max(np.abs(new - cb)) < tol
    cb = new
    if done:
      break
  return cb


@functools.lru_cache(maxsize=None)
def _tables() -> dict[int, np.ndarray]:
  if not TABLE_PATH.exists():
    raise ValueError(
        f"vector codebook: {TABLE_PATH} is missing; it ships with the "
        "package (regenerate: python -m experiments.make_vq_codebooks).")
  with np.load(TABLE_PATH) as tables:
    return {bits: tables[f"bits{bits}"].astype(np.float32)
            for bits in SUPPORTED_BITS}


def centroids(bits: int) -> np.ndarray:
  """The shipped 256-entry codebook for `bits` per element, [256, c]."""
  _check(bits)
  return _tables()[bits]
