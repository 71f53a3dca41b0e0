"""What the scalar, one-coordinate-at-a-time formats leave on the table.

Three measures of the dependence between coordinates of one kv head's keys
or values (rows = tokens), each in dB and in equivalent bits (6.02 dB =
1 bit per coordinate at the same distortion):

* `transform_gain(x_NxD, rate, metric_DxD)`: the Gaussian rate-distortion
  gain at `rate` bits per coordinate of (a) unequal bits per native
  channel and (b) a PCA basis with unequal bits per component (reverse
  water-filling), both against equal bits per native channel, with the
  error measured in `metric` (identity: plain MSE). The high-rate limit of
  (b) is the classic coding gain AM(diag)/GM(eigenvalues); at a finite
  rate components below the water level get no bits, which keeps the gain
  finite where some eigenvalues are ~0.
* `ridge_bits(x_prev_NxD, y_NxE, ...)`: a ridge predictor of y from x
  (here: a layer's keys or values from the previous layer's), fitted on the
  first rows, scored on the rest; equivalent bits = -log4(relative MSE).
* `vq_vs_scalar(x_NxD, dim, rate, ...)`: k-means codebooks of 2^(dim·rate)
  entries per group of `dim` consecutive channels against per-channel
  Lloyd-Max with 2^rate levels, both fitted on the first rows without any
  per-token scale, MSE on the rest: the space-filling and shape gain plus
  whatever dependence inside the group k-means captures.

All numpy, float64. `research.dependence_runner` applies them per layer
and kv head of a real model.
"""

from __future__ import annotations

import numpy as np

from kvq_jax.quant import bit_allocation

DB_PER_BIT = 20.0 * np.log10(2.0)  # 6.02 dB.


def _db(ratio: float) -> float:
  return float(10.0 * np.log10(ratio))


def water_fill(variances_D: np.ndarray, rate: float) -> float:
  """Mean distortion per coordinate of independent Gaussians of these
  variances coded at `rate` bits per coordinate on average (reverse
  water-filling: D_i = min(var_i, theta), sum of 1/2 log2(var_i/D_i) =
  D * rate)."""
  return float(np.mean(bit_allocation.reverse_water_filling(
      variances_D, rate)[1]))


def _sqrt_psd(m: np.ndarray) -> np.ndarray:
  w, u = np.linalg.eigh(0.5 * (m + m.T))
  return (u * np.sqrt(np.maximum(w, 0.0))) @ u.T


def transform_gain(x_NxD: np.ndarray, rate: float,
                   metric_DxD: np.ndarray | None = None) -> dict:
  """Gains over equal bits per native channel (module docstring)."""
  x = np.asarray(x_NxD, np.float64)
  x = x - x.mean(axis=0)
  cov = x.T @ x / len(x)
  d = cov.shape[0]
  m = np.eye(d) if metric_DxD is None else np.asarray(metric_DxD, np.float64)
  # The error e costs e^T M e. Native channel i at equal bits: its error
  # variance var_i 2^(-2R), weighted by M_ii (independent errors).
  native = np.diag(m) * np.diag(cov)
  equal = float(np.mean(native)) * 2.0 ** (-2.0 * rate)
  root = _sqrt_psd(m)
  eig = np.linalg.eigvalsh(root @ cov @ root)
  allocated = water_fill(native, rate)
  pca = water_fill(eig, rate)
  high_rate = float(np.mean(native)) / float(
      np.exp(np.mean(np.log(np.maximum(eig, 1e-30)))))
  out = {"native_alloc_db": _db(equal / allocated) if allocated > 0 else None,
         "pca_db": _db(equal / pca) if pca > 0 else None,
         "pca_high_rate_db": _db(high_rate)}
  for key in ("native_alloc", "pca"):
    db = out[f"{key}_db"]
    out[f"{key}_bits"] = None if db is None else db / DB_PER_BIT
  return out


def fit_ridge(x_NxD: np.ndarray, y_NxE: np.ndarray, lam: float
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(w_DxE, mean_x, mean_y) of ridge with intercept; the penalty is `lam`
  times the mean diagonal of x's centred Gram matrix."""
  x, y = np.asarray(x_NxD, np.float64), np.asarray(y_NxE, np.float64)
  mx, my = x.mean(axis=0), y.mean(axis=0)
  xc, yc = x - mx, y - my
  gram = xc.T @ xc
  reg = lam * np.trace(gram) / gram.shape[0]
  w = np.linalg.solve(gram + reg * np.eye(gram.shape[0]), xc.T @ yc)
  return w, mx, my


def ridge_bits(x_NxD: np.ndarray, y_NxE: np.ndarray, train_frac: float = 0.75,
               lam: float = 1e-3) -> dict:
  """Held-out relative MSE of y ~ x (`fit_ridge` on the first rows) and its
  equivalent bits."""
  x, y = np.asarray(x_NxD, np.float64), np.asarray(y_NxE, np.float64)
  n = int(len(x) * train_frac)
  if not 0 < n < len(x):
    raise ValueError(f"ridge_bits: {len(x)} rows, train_frac {train_frac}: "
                     "need rows on both sides.")
  w, mx, my = fit_ridge(x[:n], y[:n], lam)
  pred = (x[n:] - mx) @ w + my
  resid = float(np.sum((y[n:] - pred) ** 2))
  total = float(np.sum((y[n:] - y[n:].mean(axis=0)) ** 2))
  rel = resid / total
  return {"relative_mse": rel, "bits": -0.5 * float(np.log2(rel))}


def kmeans(x_NxC: np.ndarray, k: int, iters: int = 25,
           seed: int = 0) -> np.ndarray:
  """Lloyd's k-means with k-means++ seeding; returns [k, C] centroids."""
  rng = np.random.default_rng(seed)
  x = np.asarray(x_NxC, np.float64)
  if k >= len(x):
    raise ValueError(f"kmeans: {k} centroids for {len(x)} points; allowed: "
                     "fewer centroids than points.")
  cent = [x[rng.integers(len(x))]]
  dist = np.sum((x - cent[0]) ** 2, axis=1)
  for _ in range(1, k):
    p = dist / dist.sum() if dist.sum() > 0 else None
    cent.append(x[rng.choice(len(x), p=p)])
    dist = np.minimum(dist, np.sum((x - cent[-1]) ** 2, axis=1))
  c = np.stack(cent)
  for _ in range(iters):
    c = cell_means(x, nearest(x, c), c)
  return c


def cell_means(x_NxC, assign_N, c_KxC, weights_N=None):
  """Each centroid moved to its cell's (weighted) mean; an empty or
  zero-weight cell keeps its centroid."""
  k = len(c_KxC)
  if weights_N is None:
    mass = np.bincount(assign_N, minlength=k)
    cols = [x_NxC[:, j] for j in range(x_NxC.shape[1])]
  else:
    mass = np.bincount(assign_N, weights=weights_N, minlength=k)
    cols = [weights_N * x_NxC[:, j] for j in range(x_NxC.shape[1])]
  sums = np.stack([np.bincount(assign_N, weights=col, minlength=k)
                   for col in cols], axis=1)
  filled = mass > 0
  out = c_KxC.copy()
  out[filled] = sums[filled] / mass[filled, None]
  return out


def nearest(x_NxC: np.ndarray, c_KxC: np.ndarray) -> np.ndarray:
  d = (np.sum(x_NxC ** 2, axis=1)[:, None] - 2.0 * x_NxC @ c_KxC.T
       + np.sum(c_KxC ** 2, axis=1)[None, :])
  return np.argmin(d, axis=1)


def lloyd_max_1d(x_N: np.ndarray, levels: int, iters: int = 50) -> np.ndarray:
  """Empirical Lloyd-Max levels of one channel (quantile start)."""
  x = np.asarray(x_N, np.float64)[:, None]
  c = np.quantile(x[:, 0], (np.arange(levels) + 0.5) / levels)[:, None]
  for _ in range(iters):
    c = cell_means(x, np.searchsorted(0.5 * (c[1:, 0] + c[:-1, 0]), x[:, 0]),
                    c)
    c = np.sort(c, axis=0)
  return c[:, 0]


def _scalar_mse(train, test, levels):
  err = 0.0
  for ch in range(train.shape[1]):
    c = lloyd_max_1d(train[:, ch], levels)
    idx = np.searchsorted(0.5 * (c[1:] + c[:-1]), test[:, ch])
    err += float(np.sum((test[:, ch] - c[idx]) ** 2))
  return err / test.size


def vq_vs_scalar(x_NxD: np.ndarray, dim: int, rate: int,
                 train_frac: float = 0.75, seed: int = 0) -> dict:
  """Held-out MSE per coordinate of k-means on `dim`-channel groups and of
  per-channel Lloyd-Max, at `rate` bits per coordinate; the gain in dB and
  bits (positive: the vector quantizer is better)."""
  x = np.asarray(x_NxD, np.float64)
  if x.shape[1] % dim:
    raise ValueError(f"vq_vs_scalar: {x.shape[1]} channels do not split "
                     f"into groups of {dim}.")
  n = int(len(x) * train_frac)
  train, test = x[:n], x[n:]
  vq = 0.0
  for g in range(0, x.shape[1], dim):
    c = kmeans(train[:, g:g + dim], 2 ** (dim * rate), seed=seed + g)
    part = test[:, g:g + dim]
    vq += float(np.sum((part - c[nearest(part, c)]) ** 2))
  vq /= test.size
  scalar = _scalar_mse(train, test, 2 ** rate)
  db = _db(scalar / vq)
  return {"vq_mse": vq, "scalar_mse": scalar, "gain_db": db,
          "gain_bits": db / DB_PER_BIT}
