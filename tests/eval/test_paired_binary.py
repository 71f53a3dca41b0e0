"""Paired pass/fail statistics on hand-made tables, exact values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvq_jax.eval.paired_binary import (bootstrap_ci95, mcnemar_exact,
                                        paired_pass_fail)


@pytest.mark.parametrize("lost, gained, want", [
    (0, 0, 1.0),            # nothing flipped
    (3, 0, 0.25),           # 2 * (1/2)^3
    (5, 1, 0.21875),        # 2 * (1 + 6) / 64
    (2, 2, 1.0),            # capped at 1
    (10, 0, 2 / 1024),
    (1, 7, 2 * 9 / 256)])   # symmetric in lost / gained
def test_mcnemar_exact_values(lost, gained, want):
  assert mcnemar_exact(lost, gained) == pytest.approx(want, abs=1e-15)
  assert mcnemar_exact(gained, lost) == mcnemar_exact(lost, gained)


def test_mcnemar_refuses_negative_counts():
  with pytest.raises(ValueError, match="lost=-1"):
    mcnemar_exact(-1, 2)


def test_bootstrap_exact_on_tiny_tables():
  assert bootstrap_ci95(0, 0, 10) == (0.0, 0.0)
  assert bootstrap_ci95(1, 0, 1) == (-1.0, -1.0)
  # Two draws from {-1, +1}: sums -2, 0, +2 with 1/4, 1/2, 1/4.
  assert bootstrap_ci95(1, 1, 2) == (-1.0, 1.0)
  # Three draws from {-1: 1/3, 0: 2/3}: P[sum=-3] = 1/27 >= 2.5%, and the
  # CDF first reaches 97.5% at 0.
  assert bootstrap_ci95(1, 0, 3) == (-1.0, 0.0)
  # 40 problems, 2 lost: P[no lost draw] = 0.95^40 = 0.1285 > 2.5%, so the
  # upper end is 0; the lower end is the 2.5% quantile of -Bin(40, 0.05)/40.
  low, high = bootstrap_ci95(2, 0, 40)
  assert high == 0.0
  cdf = np.cumsum([math.comb(40, k) * 0.05 ** k * 0.95 ** (40 - k)
                   for k in range(41)])
  k975 = int(np.searchsorted(cdf, 0.975))
  assert low == -k975 / 40


def test_bootstrap_matches_monte_carlo():
  rng = np.random.default_rng(0)
  d = np.array([-1] * 10 + [1] * 2 + [0] * 152)
  sums = rng.choice(d, (20000, d.size)).mean(1)
  low, high = bootstrap_ci95(10, 2, 164)
  np.testing.assert_allclose([low, high], np.quantile(sums, [0.025, 0.975]),
                             atol=1.5 / 164)


def test_paired_pass_fail_table():
  base = [True, True, True, False, False, True]
  quant = [True, False, False, False, True, True]
  s = paired_pass_fail(base, quant)
  assert (s.n, s.base_passed, s.quant_passed, s.lost, s.gained) == (
      6, 4, 3, 2, 1)
  assert s.delta == pytest.approx(-1 / 6)
  assert s.mcnemar_p == pytest.approx(1.0)  # 2 * (1 + 3) / 8, capped
  assert s.ci95_low <= s.delta <= s.ci95_high
  assert not s.measurable
  assert s.pass_at_1 == pytest.approx(0.5)


def test_paired_pass_fail_measurable_when_all_flip_one_way():
  s = paired_pass_fail([True] * 20, [False] * 12 + [True] * 8)
  assert s.lost == 12 and s.ci95_high < 0 and s.measurable
  assert s.mcnemar_p == pytest.approx(2 / 2 ** 12)


def test_paired_pass_fail_refuses_mismatched_tables():
  with pytest.raises(ValueError, match="the same problems"):
    paired_pass_fail([True, False], [True])
