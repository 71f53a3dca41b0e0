"""Paired, window-clustered statistics of a quantized run against its baseline.

Both runs score the same tokens of the same windows, so the quality change is
measured per token (nll_quant - nll_base) and averaged: the baseline's own
token-to-token spread cancels. Tokens of one window share their context and
are correlated, so the uncertainty is computed over windows, not tokens.

Cluster-robust (ratio-estimator) standard error of a mean over W windows,
window w contributing the sum d_w of its per-token values and n_w tokens:

  mean = sum_w d_w / sum_w n_w
  var  = W / (W - 1) * sum_w (d_w - mean * n_w)^2 / (sum_w n_w)^2
  stderr = sqrt(var)

With equal n_w this is the sample standard deviation of the window means over
sqrt(W). With one window it is undefined and reported as NaN (never 0).

ΔPPL and its 95% interval, the baseline mean NLL m_b held fixed (paired):

  ΔPPL = exp(m_q) - exp(m_b) = exp(m_b) * (exp(δ) - 1),  δ = m_q - m_b
  CI95 = exp(m_b) * (exp(δ ∓ Z_95 * stderr(δ)) - 1)

exp is monotone, so the interval always contains ΔPPL.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

Z_95 = 1.96  # Two-sided 95% normal quantile (rounded, as usually quoted).


@dataclasses.dataclass(frozen=True)
class ClusterMean:
  """A mean over tokens with its window-clustered standard error."""

  mean: float
  stderr: float  # NaN when num_windows == 1.
  num_windows: int
  count: int  # Tokens summed over all windows.


def cluster_mean(sums_W, counts_W) -> ClusterMean:
  """Ratio-estimator mean and cluster-robust stderr (module docstring).

  `sums_W[w]` is the sum of window w's per-token values, `counts_W[w]` its
  number of tokens. Raises ValueError on mismatched shapes, no windows,
  negative counts or zero tokens in all.
  """
  d = np.asarray(sums_W, dtype=np.float64)
  n = np.asarray(counts_W, dtype=np.float64)
  if d.ndim != 1 or d.shape != n.shape:
    raise ValueError(f"cluster_mean: sums shape {d.shape} and counts shape "
                     f"{n.shape}; allowed: two 1-D arrays of equal length.")
  if d.size == 0:
    raise ValueError("cluster_mean: no windows; allowed: at least one.")
  if np.any(n < 0):
    raise ValueError(f"cluster_mean: counts {n.tolist()} include a negative "
                     "count; allowed: counts >= 0.")
  total = float(n.sum())
  if total == 0:
    raise ValueError("cluster_mean: zero tokens in all windows; the mean is "
                     "undefined (check eval.scoring and eval.window_len).")
  windows = d.size
  mean = float(d.sum()) / total
  if windows == 1:
    stderr = math.nan
  else:
    resid = d - mean * n
    stderr = math.sqrt(windows / (windows - 1) * float(np.sum(resid * resid))
                       / (total * total))
  return ClusterMean(mean=mean, stderr=stderr, num_windows=windows,
                     count=int(total))


def window_mean(values_WxN) -> ClusterMean:
  """`cluster_mean` of per-token values [W, N], one row per window."""
  values = np.asarray(values_WxN, dtype=np.float64)
  if values.ndim != 2:
    raise ValueError(f"window_mean: values of shape {values.shape}; allowed: "
                     "[num_windows, tokens_per_window].")
  return cluster_mean(values.sum(axis=1),
                      np.full(values.shape[0], values.shape[1]))


def delta_ppl_ci95(baseline_mean_nll: float, delta_nll: ClusterMean
                   ) -> tuple[float, float]:
  """(low, high) of ΔPPL: exp(m_b) * (exp(δ ∓ Z_95 * stderr) - 1).

  (NaN, NaN) when the stderr is NaN (one window).
  """
  if math.isnan(delta_nll.stderr):
    return math.nan, math.nan
  scale = math.exp(baseline_mean_nll)
  half = Z_95 * delta_nll.stderr
  return (scale * math.expm1(delta_nll.mean - half),
          scale * math.expm1(delta_nll.mean + half))


@dataclasses.dataclass(frozen=True)
class PairedStats:
  """Window-clustered means of a quantized run's per-token comparisons."""

  delta_nll: ClusterMean  # nll_quant - nll_base.
  kl: ClusterMean  # KL(baseline || quant), nats.
  top1: ClusterMean  # Whether the argmax tokens agree (0/1).
  baseline_mean_nll: float

  def metrics(self) -> dict[str, float]:
    low, high = delta_ppl_ci95(self.baseline_mean_nll, self.delta_nll)
    return {
        "delta_nll_mean": self.delta_nll.mean,
        "delta_nll_stderr": self.delta_nll.stderr,
        "delta_ppl_ci95_low": low,
        "delta_ppl_ci95_high": high,
        "kl_stderr": self.kl.stderr,
        "top1_stderr": self.top1.stderr,
    }


def paired_stats(nll_base_WxN, nll_quant_WxN, kl_WxN, top1_WxN
                 ) -> PairedStats:
  """PairedStats from per-window per-token arrays [W, N] of equal shape."""
  arrays = [np.asarray(a) for a in (nll_base_WxN, nll_quant_WxN, kl_WxN,
                                    top1_WxN)]
  shapes = {a.shape for a in arrays}
  if len(shapes) != 1:
    raise ValueError(f"paired_stats: shapes {[a.shape for a in arrays]}; "
                     "allowed: nll_base, nll_quant, kl and top1 all [W, N].")
  base, quant, kl, top1 = (a.astype(np.float64) for a in arrays)
  return PairedStats(delta_nll=window_mean(quant - base), kl=window_mean(kl),
                     top1=window_mean(top1),
                     baseline_mean_nll=float(base.mean()))
