"""Per-channel key statistics from calibration windows -> `KeyAffine`s.

For one layer, with pre-RoPE keys k [.., K, H] and post-RoPE queries q
[.., N, H] (N = K * G query heads) recorded on the calibration windows
(`recording.record_qkv`):

  mu_c   = mean over tokens of k_c                           (per kv head)
  sd_c   = std over tokens of k_c
  qrms_c = sqrt(mean over tokens and the G query heads of the group of
           q_c^2), averaged over each RoPE pair (c, c + R/2) of the rotary
           channels (RoPE rotates a pair, so the query weight a pre-RoPE
           key channel meets is the pair's mean energy)
  s_c    = sd_c^alpha / qrms_c^beta, normalised to geometric mean 1 per head

and the cache stores (k - mu) / s (`kvq_jax.cache.key_affine`). That is
mode "std". Mode "range" (for scheme='static' keys, KVQuant's calibrated
per-channel ranges) instead takes, per kv head and channel, the quantiles
lo = Q(1 - p) and hi = Q(p) of k over the calibration tokens (p =
range_quantile; 1: min and max) and sets

  mu_c = (lo + hi) / 2,   s_c = max((hi - lo) / 2, 1e-6)

so the calibrated range maps to [-1, 1]; keys beyond it saturate unless
they are kept as outliers (`QuantSpec.outliers`). With codebook_bits, range
mode also fits, per layer and bit width b, 2^b levels for static keys
(KVQuant's non-uniform "nuq" datatype): a weighted 1-D k-means (Lloyd's
algorithm from the quantiles (i + 1/2) / 2^b, 100 iterations) over every
normalised calibration key z = (k - mu) / s of the layer, except the
`outliers` largest |z| of each vector (kept exactly at run time), weighted
by s_c^2 qrms_c^2: the expected squared change of a score q . k per unit
of error on z_c. With rotation="pca" (issue 14's method 4, calibrated
rotations) every statistic above is taken in rotated coordinates: per kv
head, R holds the principal axes of the centred keys weighted by the
queries that read them (`weighted_principal_axes`), keys become R (k - m)
and the query weights diag(R diag(qrms^2) R^T); the affine stores R
(`KeyAffine.rotation`, charged as float32 per-layer constants). For an
isotropic error on the stored key, (alpha, beta) = (0.5, 0.5) would
minimise E[(q . dk)^2]; the default (0.5, 0) was picked from a quick 4-window
comparison of a few exponent pairs on SmolLM2 (a prototype, not a landed
measurement: compare others with `experiments.calibrate_keys --alpha
--beta` and `experiments.run --config.cache.key_stats=DIR`).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from kvq_jax.cache.key_affine import MODES, KeyAffine
from kvq_jax.cache.key_stats_recipe import DEFAULT_MODE
from kvq_jax.calibration.recording import LayerRecord

_EPS = 1e-6
ROTATIONS = ("none", "pca")


@dataclasses.dataclass(frozen=True)
class KeyStatsOptions:
  """mode: "std", "range" or "transform"; alpha, beta: the exponents of s and shift:
  subtract the mean (False: mu = 0), in std mode; range_quantile: p of range
  mode, in (0.5, 1] (module docstring)."""

  alpha: float = 0.5
  beta: float = 0.0
  shift: bool = True
  mode: str = DEFAULT_MODE  # "std"
  range_quantile: float = 1.0
  codebook_bits: tuple[int, ...] = ()
  outliers: int = 0
  rotation: str = "none"

  def __post_init__(self):
    if self.mode not in MODES:
      raise ValueError(f"KeyStatsOptions.mode={self.mode!r}: allowed: "
                       f"{', '.join(MODES)}.")
    if self.codebook_bits and self.mode != "range":
      raise ValueError("KeyStatsOptions.codebook_bits needs mode='range' "
                       "(mode 'transform' fits every width 1..8 itself).")
    if any(b not in (2, 3, 4, 5, 8) for b in self.codebook_bits):
      raise ValueError(
          f"KeyStatsOptions.codebook_bits={self.codebook_bits}: allowed: "
          "bit widths among 2, 3, 4, 5, 8.")
    if self.rotation not in ROTATIONS:
      raise ValueError(
          f"KeyStatsOptions.rotation={self.rotation!r}: allowed: "
          f"{', '.join(ROTATIONS)}.")
    if not 0.5 < self.range_quantile <= 1.0:
      raise ValueError(
          f"KeyStatsOptions.range_quantile={self.range_quantile!r}: allowed: "
          "a float in (0.5, 1].")


def _pair_mean(energy_KxH: np.ndarray, rotary_dim: int) -> np.ndarray:
  out = energy_KxH.copy()
  half = rotary_dim // 2
  pair = 0.5 * (energy_KxH[:, :half] + energy_KxH[:, half:rotary_dim])
  out[:, :half] = pair
  out[:, half:rotary_dim] = pair
  return out


def layer_affine(record: LayerRecord, rotary_dim: int,
                 options: KeyStatsOptions = KeyStatsOptions()) -> KeyAffine:
  """The `KeyAffine` of one layer (module docstring)."""
  k = np.asarray(record.k_pre_BxTxKxH, np.float64)
  q = np.asarray(record.q_BxTxNxH, np.float64)
  kh, h = k.shape[-2:]
  n = q.shape[-2]
  if n % kh or q.shape[-1] != h or not 0 < rotary_dim <= h \
      or rotary_dim % 2:
    raise ValueError(
        f"key stats: q {q.shape}, k {k.shape}, rotary_dim={rotary_dim}; "
        "allowed: N a multiple of K, the same head_dim, an even rotary_dim "
        "<= head_dim.")
  k = k.reshape(-1, kh, h)
  q = q.reshape(-1, kh, n // kh, h)
  qrms2 = np.maximum(_pair_mean(np.mean(q * q, axis=(0, 2)), rotary_dim),
                     _EPS ** 2)
  rotation, mean = None, np.zeros((kh, h))
  if options.rotation == "pca":
    mean = k.mean(axis=0)
    rotation = weighted_principal_axes(k - mean, qrms2)
    # Everything below sees the rotated keys and query weights; the shift
    # is mapped back to the key space at the end.
    k = np.einsum("kch,tkh->tkc", rotation, k - mean)
    qrms2 = np.einsum("kch,kh,kch->kc", rotation, qrms2, rotation)
  if options.mode == "transform":
    return _transform_affine(k, qrms2, options, rotation, mean)
  if options.mode == "range":
    p = options.range_quantile
    lo, hi = np.quantile(k, [1.0 - p, p], axis=0)
    mu, s = (lo + hi) / 2, np.maximum((hi - lo) / 2, _EPS)
    z = (k - mu) / s
    weight = np.broadcast_to(s * s * qrms2, z.shape)
    if options.outliers:
      rank = np.argsort(np.argsort(-np.abs(z), axis=-1), axis=-1)
      keep = rank >= options.outliers
      z, weight = z[keep], weight[keep]
    books = {b: weighted_lloyd(z.ravel(), weight.ravel(), 2 ** b)
             for b in options.codebook_bits}
    return _affine(mu, s, "range", books, rotation, mean)
  if options.shift:
    mu = k.mean(axis=0)
  else:  # the rotated coordinates of the key-space origin
    mu = (np.zeros((kh, h)) if rotation is None
          else -np.einsum("kch,kh->kc", rotation, mean))
  sd = np.maximum(k.std(axis=0), _EPS)
  s = sd ** options.alpha / np.sqrt(qrms2) ** options.beta
  s = s / np.exp(np.mean(np.log(s), axis=-1, keepdims=True))
  return _affine(mu, s, "std", {}, rotation, mean)


def _transform_affine(k_TxKxH, qrms2_KxH, options: KeyStatsOptions, rotation,
                      mean_KxH) -> KeyAffine:
  """Mode transform (module docstring of `cache.key_affine`): centred,
  unit-variance components, one weighted codebook per width 1..8 pooled
  over the layer's components, and each component's weighted error at
  0..8 bits with those codebooks (per calibration token, summed over the
  kv heads). Without a rotation the components are the channels."""
  mu = k_TxKxH.mean(axis=0)
  s = np.maximum(k_TxKxH.std(axis=0), _EPS)
  z = (k_TxKxH - mu) / s
  weight = np.broadcast_to(s * s * qrms2_KxH, z.shape)
  keep = np.ones(z.shape, bool)
  if options.outliers:  # Kept exactly at run time: not coded.
    rank = np.argsort(np.argsort(-np.abs(z), axis=-1), axis=-1)
    keep = rank >= options.outliers
  zk, wk = z[keep], weight[keep]
  books = {b: weighted_lloyd(zk, wk, 2 ** b,
                            start=compander_start(zk, wk, 2 ** b))
           for b in range(1, 9)}
  err = np.where(keep, weight * z * z, 0.0)
  table = [err.sum(axis=(0, 1))]
  for b in range(1, 9):
    c = books[b]
    u = np.searchsorted((c[1:] + c[:-1]) / 2, z, side="left")
    err = np.where(keep, weight * (z - c[u]) ** 2, 0.0)
    table.append(err.sum(axis=(0, 1)))
  distortion = np.stack(table, axis=-1) / len(z)
  affine = _affine(mu, s, "transform", books, rotation, mean_KxH)
  return dataclasses.replace(affine, distortion=distortion)


def _affine(mu_KxH, s_KxH, mode, books, rotation, mean_KxH) -> KeyAffine:
  """The `KeyAffine`; with a rotation R (fitted about the key mean m), mu
  lives in the rotated coordinates, so the key-space shift is m + R^T mu:
  then R (k - shift) = R (k - m) - mu."""
  if rotation is None:
    return KeyAffine.from_arrays(mu_KxH, s_KxH, mode=mode, codebooks=books)
  shift = mean_KxH + np.einsum("kch,kc->kh", rotation, mu_KxH)
  return KeyAffine.from_arrays(shift, s_KxH, mode=mode, codebooks=books,
                               rotation_KxHxH=rotation)


def weighted_principal_axes(centred_TxKxH: np.ndarray,
                            qrms2_KxH: np.ndarray) -> np.ndarray:
  """Per kv head, the principal axes of the keys weighted by the queries
  that read them: the eigenvectors of W C W with C the key covariance and
  W = diag(qrms), in decreasing order of eigenvalue, as the rows of an
  orthogonal [H, H] matrix R (float64 [K, H, H]). A channel the queries
  barely read counts little in choosing the axes."""
  w = np.sqrt(qrms2_KxH)
  x = centred_TxKxH * w
  cov = np.einsum("tkh,tkc->khc", x, x) / len(x)
  _, vectors = np.linalg.eigh(cov)  # ascending eigenvalues, columns
  return np.swapaxes(vectors[:, :, ::-1], 1, 2)


def compander_start(x: np.ndarray, w: np.ndarray, count: int,
                    bins: int = 4096) -> np.ndarray:
  """`count` levels at the quantiles (i + 1/2) / count of the weighted
  density of x raised to 1/3 (a histogram of `bins` cells): the high-rate
  optimum's spacing (Panter-Dite), a start from which Lloyd's algorithm
  converges at 5..8 bits where plain quantiles of x are far off."""
  hist, edges = np.histogram(x, bins=bins, weights=w)
  cdf = np.concatenate([[0.0], np.cumsum(np.cbrt(np.maximum(hist, 0.0)))])
  cdf /= cdf[-1]
  return np.interp((np.arange(count) + 0.5) / count, cdf, edges)


def weighted_lloyd(x: np.ndarray, w: np.ndarray, count: int,
                   iterations: int = 100,
                   start: np.ndarray | None = None) -> np.ndarray:
  """`count` increasing levels minimising sum w (x - c[nearest])^2 (1-D
  k-means by Lloyd's algorithm, started from `start` or the quantiles
  (i + 1/2) / count of x); an empty cell keeps its level."""
  order = np.argsort(x)
  xs, ws = x[order], w[order]
  cw = np.concatenate([[0.0], np.cumsum(ws)])
  cwx = np.concatenate([[0.0], np.cumsum(ws * xs)])
  c = (np.quantile(xs, (np.arange(count) + 0.5) / count) if start is None
       else np.asarray(start, np.float64))
  for _ in range(iterations):
    edges = np.concatenate([[0], np.searchsorted(xs, (c[1:] + c[:-1]) / 2,
                                                 side="right"), [xs.size]])
    wsum = cw[edges[1:]] - cw[edges[:-1]]
    c = np.where(wsum > 0, (cwx[edges[1:]] - cwx[edges[:-1]])
                 / np.where(wsum > 0, wsum, 1.0), c)
    c = np.maximum.accumulate(c + np.arange(count) * 1e-6)
  return c


def key_affines(records: Sequence[LayerRecord], rotary_dim: int,
                options: KeyStatsOptions = KeyStatsOptions()
                ) -> tuple[KeyAffine, ...]:
  """One `KeyAffine` per layer."""
  return tuple(layer_affine(r, rotary_dim, options) for r in records)
