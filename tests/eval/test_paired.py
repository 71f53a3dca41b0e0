"""Window-clustered means, stderrs and the ΔPPL interval, checked by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvq_jax.eval.paired import (Z_95, ClusterMean, cluster_mean,
                                 delta_ppl_ci95, paired_stats, window_mean)


def test_cluster_mean_unequal_windows_by_hand():
  # Window sums d = (0.4, 0.0, 0.5), counts n = (2, 2, 1):
  # mean = 0.9 / 5 = 0.18; residuals d - mean n = (0.04, -0.36, 0.32),
  # squares 0.0016 + 0.1296 + 0.1024 = 0.2336;
  # var = 3/2 * 0.2336 / 5^2 = 0.014016.
  result = cluster_mean([0.4, 0.0, 0.5], [2, 2, 1])
  assert result.mean == pytest.approx(0.18)
  assert result.stderr == pytest.approx(math.sqrt(0.014016))
  assert (result.num_windows, result.count) == (3, 5)


def test_window_mean_equal_windows_by_hand():
  # Window means (2, 2, 6): mean 10/3; their sample variance is
  # ((4/3)^2 + (4/3)^2 + (8/3)^2) / 2 = 16/3, over 3 windows 16/9: se 4/3.
  values = [[1.0, 3.0], [2.0, 2.0], [6.0, 6.0]]
  result = window_mean(values)
  assert result.mean == pytest.approx(10 / 3)
  assert result.stderr == pytest.approx(4 / 3)
  # The naive per-token stderr (llama.cpp's, ignoring windows) differs:
  # deviations of the 6 tokens from 10/3 are (-7, -1, -4, -4, 8, 8)/3,
  # population variance 210/54 = 35/9, over 5: 7/9, stderr sqrt(7)/3 = 0.88.
  naive = math.sqrt(np.var(np.ravel(values)) / 5)
  assert naive == pytest.approx(math.sqrt(7) / 3)
  assert result.stderr > 1.4 * naive


def test_single_window_stderr_is_nan_not_zero():
  result = window_mean([[0.1, 0.2, 0.3]])
  assert result.mean == pytest.approx(0.2)
  assert math.isnan(result.stderr)


def test_constant_windows_have_zero_stderr():
  assert window_mean([[0.5, 0.5], [0.5, 0.5]]).stderr == 0.0


@pytest.mark.parametrize("sums, counts, match", [
    ([1.0, 2.0], [1], "equal length"),
    ([], [], "no windows"),
    ([1.0, 2.0], [1, -1], "negative count"),
    ([0.0, 0.0], [0, 0], "zero tokens"),
])
def test_cluster_mean_rejects_bad_input(sums, counts, match):
  with pytest.raises(ValueError, match=match):
    cluster_mean(sums, counts)


def test_window_mean_rejects_flat_input():
  with pytest.raises(ValueError, match=r"\[num_windows, tokens_per_window\]"):
    window_mean([1.0, 2.0])


def test_delta_ppl_ci95_by_hand():
  # Baseline PPL 10 (mean NLL ln 10), δ = 0.01 ± 0.005:
  # CI = 10 (exp(0.01 ∓ 1.96 * 0.005) - 1) = 10 (exp(0.0002) - 1),
  # 10 (exp(0.0198) - 1) = 0.0020002, 0.199973.
  delta = ClusterMean(mean=0.01, stderr=0.005, num_windows=4, count=40)
  low, high = delta_ppl_ci95(math.log(10.0), delta)
  assert Z_95 == 1.96
  assert low == pytest.approx(0.0020002, rel=1e-4)
  assert high == pytest.approx(0.199973, rel=1e-5)
  assert low < 10 * math.expm1(0.01) < high  # ΔPPL itself lies inside.


def test_delta_ppl_ci95_negative_delta_and_undefined():
  delta = ClusterMean(mean=-0.05, stderr=0.01, num_windows=4, count=40)
  low, high = delta_ppl_ci95(math.log(20.0), delta)
  # 20 (exp(-0.05 ∓ 0.0196) - 1) = 20 (exp(-0.0696) - 1),
  #                                 20 (exp(-0.0304) - 1).
  assert low == pytest.approx(20 * (math.exp(-0.0696) - 1))
  assert high == pytest.approx(20 * (math.exp(-0.0304) - 1))
  assert high < 0  # Excludes 0: a measurable improvement.
  one = ClusterMean(mean=0.01, stderr=math.nan, num_windows=1, count=10)
  assert all(math.isnan(x) for x in delta_ppl_ci95(1.0, one))


def test_paired_stats_metrics_by_hand():
  base = np.array([[1.0, 2.0], [3.0, 4.0], [1.0, 1.0]])  # Mean NLL 2.
  # Differences per window (0.1, 0.3), (0, 0), (0.5, 0.5): window means 0.2,
  # 0, 0.5, mean 0.7/3; deviations -1/30, -7/30, 8/30, squares summing to
  # 114/900; sample variance 57/900, over 3 windows 19/900: se sqrt(19)/30.
  quant = base + np.array([[0.1, 0.3], [0.0, 0.0], [0.5, 0.5]])
  # KL window means 0.1, 0.1, 0.3: mean 1/6, deviations -1/15, -1/15, 2/15,
  # sample variance (6/225)/2 = 1/75, over 3: 1/225, se 1/15.
  kl = np.array([[0.0, 0.2], [0.1, 0.1], [0.3, 0.3]])
  # top-1 window means 0.5, 1, 0: sample variance 0.25, over 3: se sqrt(1/12).
  top1 = np.array([[True, False], [True, True], [False, False]])
  metrics = paired_stats(base, quant, kl, top1).metrics()
  assert set(metrics) == {"delta_nll_mean", "delta_nll_stderr",
                          "delta_ppl_ci95_low", "delta_ppl_ci95_high",
                          "kl_stderr", "top1_stderr"}
  se = math.sqrt(19) / 30
  assert metrics["delta_nll_mean"] == pytest.approx(0.7 / 3)
  assert metrics["delta_nll_stderr"] == pytest.approx(se)
  assert metrics["delta_ppl_ci95_low"] == pytest.approx(
      math.exp(2.0) * (math.exp(0.7 / 3 - 1.96 * se) - 1))
  assert metrics["delta_ppl_ci95_high"] == pytest.approx(
      math.exp(2.0) * (math.exp(0.7 / 3 + 1.96 * se) - 1))
  assert metrics["kl_stderr"] == pytest.approx(1 / 15)
  assert metrics["top1_stderr"] == pytest.approx(math.sqrt(1 / 12))


def test_paired_stats_rejects_mismatched_shapes():
  a = np.zeros((2, 3))
  with pytest.raises(ValueError, match=r"all \[W, N\]"):
    paired_stats(a, a, a, np.zeros((3, 2)))
