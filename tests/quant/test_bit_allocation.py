"""Bits per component under a budget, against Gaussian known answers."""

from __future__ import annotations

import numpy as np
import pytest

from kvq_jax.quant.bit_allocation import (coding_gain_db, greedy_widths,
                                          reverse_water_filling)


def test_water_filling_known_answer():
  # Variances 4^3, 4^2, 4, 1 at a mean of 1.5 bits (6 in all): the water
  # level is 1, so b = 1/2 log2(v) = (3, 2, 1, 0) and D = (1, 1, 1, 1).
  bits, dist = reverse_water_filling([64.0, 16.0, 4.0, 1.0], 1.5)
  np.testing.assert_allclose(bits, [3, 2, 1, 0], atol=1e-9)
  np.testing.assert_allclose(dist, [1, 1, 1, 1], atol=1e-9)
  # At 0.5 bits (2 in all) the last two sit below the water: theta = 16
  # solves 1/2 log2(64 / theta) + 1/2 log2(16 / theta) = 2.
  bits, dist = reverse_water_filling([64.0, 16.0, 4.0, 1.0], 0.5)
  np.testing.assert_allclose(bits, [1.5, 0.5, 0, 0], atol=1e-9)
  np.testing.assert_allclose(dist, [8, 8, 4, 1], atol=1e-9)


def test_coding_gain_known_answer():
  # AM/GM of (64, 16, 4, 1): 85 / 4 over 8 = 2.65625 -> 4.2427 dB.
  assert coding_gain_db([64.0, 16.0, 4.0, 1.0]) == pytest.approx(
      10 * np.log10(85 / 32), abs=1e-12)
  assert coding_gain_db([3.0] * 5) == pytest.approx(0.0, abs=1e-12)


def _high_rate_table(variances):
  """D_c(b) = v_c 4^-b: 6.02 dB a bit."""
  v = np.asarray(variances, np.float64)
  return v[:, None] * 4.0 ** -np.arange(9)[None, :]


def test_greedy_matches_water_filling_on_the_gaussian_model():
  assert greedy_widths(_high_rate_table([64, 16, 4, 1]), 6) == (3, 2, 1, 0)
  # Random variances: the greedy integer allocation is within one bit of
  # the real-valued water-filling everywhere, spends exactly the budget,
  # and no single move of one bit lowers the total error.
  rng = np.random.default_rng(0)
  var = np.exp(rng.normal(0, 2, size=32))
  table = _high_rate_table(var)
  widths = np.asarray(greedy_widths(table, 80))
  bits, _ = reverse_water_filling(var, 80 / 32)
  assert widths.sum() == 80
  assert np.all(np.abs(widths - bits) <= 1.0 + 1e-9)
  total = table[np.arange(32), widths].sum()
  for i in range(32):
    for j in range(32):
      if i != j and widths[i] > 0 and widths[j] < 8:
        moved = widths.copy()
        moved[i] -= 1
        moved[j] += 1
        assert table[np.arange(32), moved].sum() >= total - 1e-12


def test_greedy_saturates_and_validates():
  assert greedy_widths(_high_rate_table([1.0, 1.0]), 16) == (8, 8)
  with pytest.raises(ValueError, match="0..16"):
    greedy_widths(_high_rate_table([1.0, 1.0]), 17)
  with pytest.raises(ValueError, match="components, 9"):
    greedy_widths(np.ones((2, 4)), 1)
