"""The Pareto front of (bits per element, delta PPL): both minimised."""

from __future__ import annotations

import numpy as np


def pareto_front(bits_N, delta_N) -> np.ndarray:
  """bool [N]: True where no other point is at least as good on both axes
  and strictly better on one. NaN entries are never on the front and never
  dominate."""
  bits = np.asarray(bits_N, np.float64)
  delta = np.asarray(delta_N, np.float64)
  if bits.shape != delta.shape or bits.ndim != 1:
    raise ValueError(
        f"pareto_front: bits {bits.shape} and delta {delta.shape} must be "
        "1-D of equal length.")
  valid = np.isfinite(bits) & np.isfinite(delta)
  b, d = bits[:, None], delta[:, None]  # [N, 1] against [1, N] (others).
  no_worse = (bits[None, :] <= b) & (delta[None, :] <= d)
  better = (bits[None, :] < b) | (delta[None, :] < d)
  dominated = np.any(no_worse & better & valid[None, :], axis=1)
  return valid & ~dominated
