"""Rounding a delta to its confidence interval, and 'no measurable change'."""

from __future__ import annotations

import math

import pytest

from kvq_jax.eval.uncertainty_format import (decimals_for, describe_delta_ci,
                                             format_delta_ci,
                                             format_mean_stderr,
                                             format_signed, is_measurable)

NAN = math.nan


@pytest.mark.parametrize("uncertainty, decimals", [
    (0.1, 2), (0.1026, 2), (0.0123, 3), (0.0996, 2),  # 0.0996 -> 0.10.
    (0.99, 2), (0.996, 1),  # 0.996 -> 1.0.
    (1.5, 1), (25.0, 0), (250.0, 0), (3e-5, 6),
    (0.0, None), (NAN, None), (math.inf, None),
])
def test_decimals_keep_two_significant_digits(uncertainty, decimals):
  assert decimals_for(uncertainty) == decimals


def test_decimals_reject_negative():
  with pytest.raises(ValueError, match=r"allowed: >= 0"):
    decimals_for(-0.1)


@pytest.mark.parametrize("delta, low, high, text", [
    # Half-width 0.1026 -> 2 decimals; CI contains 0.
    (0.0812, -0.0214, 0.1838, "+0.08 [\u22120.02, +0.18]"),
    # Negative delta, CI excluding 0; half-width 1.2 -> 1 decimal.
    (-1.234, -2.5, -0.1, "\u22121.2 [\u22122.5, \u22120.1]"),
    # Half-width 0.0049 -> 4 decimals.
    (0.01234, 0.00744, 0.01724, "+0.0123 [+0.0074, +0.0172]"),
    # Large: half-width 35 -> no decimals.
    (123.4, 88.0, 158.0, "+123 [+88, +158]"),
    # Half-width 0.103 -> 2 decimals; a bound rounding to zero has no sign.
    (0.1, -0.003, 0.203, "+0.10 [0.00, +0.20]"),
    # Undefined interval (one window): three significant digits, no CI.
    (0.08123, NAN, NAN, "+0.0812 [no CI: needs \u2265 2 windows]"),
    # Zero width (identical runs): three significant digits.
    (0.0, 0.0, 0.0, "0 [0, 0]"),
])
def test_format_delta_ci(delta, low, high, text):
  assert format_delta_ci(delta, low, high) == text


@pytest.mark.parametrize("low, high, measurable", [
    (-0.02, 0.18, False),  # Contains 0.
    (0.01, 0.18, True),  # Entirely above 0.
    (-2.5, -0.1, True),  # Entirely below 0: a measurable improvement.
    (0.0, 0.2, False),  # Touches 0.
    (-0.3, 0.0, False),
    (0.0, 0.0, False),
    (NAN, NAN, False),  # Undefined: nothing measured.
])
def test_is_measurable(low, high, measurable):
  assert is_measurable(low, high) is measurable


def test_reversed_interval_rejected():
  with pytest.raises(ValueError, match="low > high"):
    format_delta_ci(0.1, 0.2, 0.0)
  with pytest.raises(ValueError, match="low > high"):
    is_measurable(0.2, 0.0)


@pytest.mark.parametrize("delta, low, high, text", [
    (0.0812, -0.0214, 0.1838,
     "+0.08 [\u22120.02, +0.18], no measurable change"),
    (-0.0812, -0.1838, 0.0214,
     "\u22120.08 [\u22120.18, +0.02], no measurable change"),
    (0.5, 0.3, 0.7, "+0.50 [+0.30, +0.70]"),
    (-0.5, -0.7, -0.3, "\u22120.50 [\u22120.70, \u22120.30]"),
    (0.08123, NAN, NAN, "+0.0812 [no CI: needs \u2265 2 windows]"),
])
def test_describe_delta_ci(delta, low, high, text):
  assert describe_delta_ci(delta, low, high) == text


@pytest.mark.parametrize("value, decimals, text", [
    (0.5, 2, "+0.50"), (-0.5, 2, "\u22120.50"), (-0.004, 2, "0.00"),
    (0.0, None, "0"), (-0.012345, None, "\u22120.0123"), (NAN, 2, "nan"),
])
def test_format_signed(value, decimals, text):
  assert format_signed(value, decimals) == text


@pytest.mark.parametrize("mean, stderr, text", [
    (0.01236, 0.00061, "0.01236 \u00b1 0.00061"),
    (0.9651, 0.0213, "0.965 \u00b1 0.021"),
    (-0.0042, 0.0031, "-0.0042 \u00b1 0.0031"),
    (0.012345, NAN, "0.0123 \u00b1 n/a"),
    (1.0, 0.0, "1 \u00b1 0"),
])
def test_format_mean_stderr(mean, stderr, text):
  assert format_mean_stderr(mean, stderr) == text


@pytest.mark.parametrize("mean, stderr, text", [
    (0.00655, 0.0042, "+0.0066 \u00b1 0.0042"),
    (-0.0042, 0.0031, "\u22120.0042 \u00b1 0.0031"),
    (-0.0001, 0.0031, "\u22120.0001 \u00b1 0.0031"),
    (0.0123, NAN, "+0.0123 \u00b1 n/a"),
])
def test_format_mean_stderr_signed(mean, stderr, text):
  assert format_mean_stderr(mean, stderr, signed=True) == text
