"""Fitted vector-quantization tables for the values, against the shipped
Gaussian table (issue 34, method 3's per-layer, weighted and scale-free
codebooks).

The cache's int{b}_vq values (scheme `vector`, `kvq_jax.quant.quantize`):
each value head vector x (D elements) is turned by the layer's randomised
Hadamard R (x R, `kvq_jax.cache.hadamard`), normalised to norm sqrt(D),
each c-element group takes its Euclidean-nearest codeword of one 256-entry
table C, and one least-squares scale per vector brings it back. The shipped
C is k-means of N(0, I_c), one table for every layer and head of every
model. Here, on a layer's own rotated rows (`x_NxD` below is x R):

- `encode_scaled` / `encode_unscaled`: the cache's encoding with any table
  (Euclidean nearest codeword, least-squares scale), and the same without
  a scale (the table holds the raw rotated groups; stored bits b exactly).
- `fit_table`: Lloyd's k-means of the c-groups, started from a given
  table, each group weighted by `group_weights` (or equally). For the
  scaled code the points are the normalised groups and their natural
  weight is rho^2 = |x|^2 / D (the error in x is about rho^2 times the
  error of the normalised group); times the metric's weight of the group.
- `distortion`: held-out cost per element of a reconstruction, plain
  (|e|^2) and in a metric M of the rotated coordinates (e M e^T / D).
- `rotated_metric`: M for the rotated coordinates, R^T M R, of a metric of
  the native ones (for values: sum over the group's query heads of
  W_o[n] W_o[n]^T, `dependence_runner.value_metric`).
- `table_bits`: a fitted table's entries charged per cached value element
  at a context, as every per-sequence constant is.

Gains are 0.5 log2(cost shared / cost fitted) bits (6.02 dB a bit).
"""

from __future__ import annotations

import numpy as np

from kvq_jax.quant import vector_codebook
from kvq_jax.research.dependence import cell_means


def _groups(x_NxD: np.ndarray, c: int) -> np.ndarray:
  n, d = x_NxD.shape
  if d % c:
    raise ValueError(f"value tables: {d} elements do not split into groups "
                     f"of {c}.")
  return x_NxD.reshape(n * (d // c), c)


def normalised(x_NxD: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(y = x sqrt(D) / |x| (0 for a zero row), rho^2 = |x|^2 / D)."""
  x = np.asarray(x_NxD, np.float64)
  d = x.shape[1]
  sq = np.sum(x * x, axis=1)
  norm = np.sqrt(sq)
  y = x * (np.sqrt(d) / np.where(norm > 0, norm, 1.0))[:, None]
  return y, sq / d


def encode_scaled(x_NxD: np.ndarray, table_MxC: np.ndarray) -> np.ndarray:
  """The cache's vector code of every row with `table_MxC`: nearest
  codeword per c-group of the normalised row, then the least-squares
  scale of the row. Returns the reconstruction [N, D] (float64)."""
  x = np.asarray(x_NxD, np.float64)
  table = np.asarray(table_MxC, np.float64)
  y, _ = normalised(x)
  idx, _ = vector_codebook.nearest(_groups(y, table.shape[1]), table)
  cu = table[idx].reshape(x.shape)
  den = np.sum(cu * cu, axis=1)
  s = np.where(den > 0, np.sum(x * cu, axis=1) / np.where(den > 0, den, 1.0),
               0.0)
  return cu * s[:, None]


def encode_unscaled(x_NxD: np.ndarray, table_MxC: np.ndarray) -> np.ndarray:
  """Nearest codeword per c-group of the raw row: no scale stored."""
  x = np.asarray(x_NxD, np.float64)
  table = np.asarray(table_MxC, np.float64)
  idx, _ = vector_codebook.nearest(_groups(x, table.shape[1]), table)
  return table[idx].reshape(x.shape)


def group_weights(n: int, d: int, c: int, row_weight_N=None,
                  group_weight_J=None) -> np.ndarray:
  """Weight of every c-group of N rows, in `_groups` order [N * D / c]:
  row weight times group weight (ones where None)."""
  row = np.ones(n) if row_weight_N is None else np.asarray(row_weight_N,
                                                           np.float64)
  grp = np.ones(d // c) if group_weight_J is None else np.asarray(
      group_weight_J, np.float64)
  return (row[:, None] * grp[None, :]).reshape(-1)


def fit_table(points_PxC: np.ndarray, start_MxC: np.ndarray,
              weights_P: np.ndarray | None = None,
              iters: int = 20) -> np.ndarray:
  """Weighted Lloyd's k-means from `start_MxC`: every codeword moves to the
  weighted mean of its cell (an empty or zero-weight cell keeps its
  codeword). Returns float64 [M, C]."""
  p = np.asarray(points_PxC, np.float64)
  w = np.ones(len(p)) if weights_P is None else np.asarray(weights_P,
                                                           np.float64)
  if w.shape != (len(p),) or np.any(w < 0):
    raise ValueError(f"fit_table: weights of shape {w.shape} for {len(p)} "
                     "points; allowed: one non-negative weight per point.")
  cb = np.asarray(start_MxC, np.float64)
  for _ in range(iters):
    idx, _ = vector_codebook.nearest(p, cb)
    cb = cell_means(p, idx, cb, w)
  return cb


def rotated_metric(metric_DxD: np.ndarray, signs_D: np.ndarray,
                   hadamard_DxD: np.ndarray) -> np.ndarray:
  """R^T M R with R = diag(signs) H: the metric of the coordinates x R."""
  r = np.asarray(signs_D, np.float64)[:, None] * np.asarray(hadamard_DxD,
                                                             np.float64)
  return r.T @ np.asarray(metric_DxD, np.float64) @ r


def metric_group_weights(metric_DxD: np.ndarray, c: int) -> np.ndarray:
  """Each c-group's mean diagonal entry of the metric, normalised to mean
  1 [D / c]: the weight of its error in a weighted k-means."""
  diag = np.diag(np.asarray(metric_DxD, np.float64))
  w = diag.reshape(-1, c).mean(axis=1)
  return w / w.mean()


def distortion(x_NxD: np.ndarray, recon_NxD: np.ndarray,
               metric_DxD: np.ndarray | None = None) -> dict:
  """Cost per element: 'plain' mean |e|^2, 'weighted' mean e M e^T / D
  (None without a metric)."""
  e = np.asarray(x_NxD, np.float64) - np.asarray(recon_NxD, np.float64)
  out = {"plain": float(np.mean(e * e)), "weighted": None}
  if metric_DxD is not None:
    out["weighted"] = float(np.mean(np.einsum("nd,de,ne->n", e, metric_DxD,
                                              e)) / e.shape[1])
  return out


def gain_bits(shared: float, fitted: float) -> float:
  """Equivalent bits of a distortion ratio (positive: fitted is better)."""
  return float(0.5 * np.log2(shared / fitted))


def table_bits(num_tables: int, entries: int, dim: int, context: int,
               layers: int, kv_heads: int, head_dim: int,
               entry_bits: int = 16) -> float:
  """Bits per cached value element that `num_tables` tables of `entries` x
  `dim` values of `entry_bits` add at `context` tokens."""
  if context < 1:
    raise ValueError(f"table_bits: context {context}; allowed: >= 1.")
  return (num_tables * entries * dim * entry_bits
          / (context * layers * kv_heads * head_dim))
