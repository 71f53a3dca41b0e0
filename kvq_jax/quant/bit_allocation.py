"""Bits per component under a budget (transform coding, issue 34).

Two allocators of `total` bits over the components of a vector:

* `reverse_water_filling(variances, rate)`: the Gaussian rate-distortion
  answer. Component c of variance v_c gets D_c = min(v_c, theta) and
  b_c = max(0, 1/2 log2(v_c / theta)), the water level theta chosen so that
  the mean of b is `rate`; real-valued bits, the high-rate reference.
* `greedy_widths(distortion, total)`: integer widths 0..8 from measured
  distortion curves. distortion[c][b] is the (weighted) error of component
  c coded with b bits, b = 0..8. Starting from 0 bits everywhere, each of
  the `total` bits goes to the component whose error falls most from one
  more bit (ties: the lower component). For curves whose decrements shrink
  (convex in b, as a Gaussian's 6.02 dB a bit) this is optimal among
  integer allocations (Fox 1966); a curve that is not is taken as it is.
"""

from __future__ import annotations

import functools

import numpy as np

MAX_WIDTH = 8


def water_level(variances: np.ndarray, rate: float) -> float:
  """theta with mean_c max(0, 1/2 log2(v_c / theta)) = rate (bisection)."""
  var = np.maximum(np.asarray(variances, np.float64), 0.0)
  total = rate * var.size
  if not np.any(var > 0):
    return 0.0
  lo, hi = 0.0, float(var.max())
  for _ in range(200):
    theta = 0.5 * (lo + hi)
    bits = np.sum(0.5 * np.log2(np.maximum(var / max(theta, 1e-300), 1.0)))
    lo, hi = (theta, hi) if bits > total else (lo, theta)
  return 0.5 * (lo + hi)


def reverse_water_filling(variances: np.ndarray, rate: float
                          ) -> tuple[np.ndarray, np.ndarray]:
  """(bits_c, distortion_c) of independent Gaussians at mean `rate`."""
  var = np.maximum(np.asarray(variances, np.float64), 0.0)
  theta = water_level(var, rate)
  bits = 0.5 * np.log2(np.maximum(var / max(theta, 1e-300), 1.0))
  return bits, np.minimum(var, theta)


def coding_gain_db(variances: np.ndarray) -> float:
  """High-rate gain of unequal over equal bits: 10 log10(AM / GM)."""
  var = np.maximum(np.asarray(variances, np.float64), 1e-300)
  return float(10.0 * np.log10(np.mean(var) / np.exp(np.mean(np.log(var)))))


def greedy_widths(distortion, total: int) -> tuple[int, ...]:
  """Integer widths (module docstring); `distortion` [C][9] nested floats
  or an array."""
  table = np.asarray(distortion, np.float64)
  if table.ndim != 2 or table.shape[1] != MAX_WIDTH + 1:
    raise ValueError(
        f"greedy_widths: distortion of shape {table.shape}; allowed: "
        f"[components, {MAX_WIDTH + 1}] (errors at 0..{MAX_WIDTH} bits).")
  if isinstance(total, bool) or not 0 <= total <= MAX_WIDTH * len(table):
    raise ValueError(
        f"greedy_widths: total={total!r} bits for {len(table)} components; "
        f"allowed: 0..{MAX_WIDTH * len(table)}.")
  return _greedy(tuple(map(tuple, table.tolist())), int(total))


@functools.lru_cache(maxsize=512)
def _greedy(table: tuple, total: int) -> tuple[int, ...]:
  d = np.asarray(table)
  widths = np.zeros(len(d), np.int64)
  rows = np.arange(len(d))
  for _ in range(total):
    gain = np.where(widths < MAX_WIDTH,
                    d[rows, widths] - d[rows, np.minimum(widths + 1,
                                                         MAX_WIDTH)],
                    -np.inf)
    widths[int(np.argmax(gain))] += 1
  return tuple(int(w) for w in widths)
