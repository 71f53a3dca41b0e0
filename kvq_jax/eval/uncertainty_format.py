"""Printing a measured change no more precisely than its uncertainty allows.

Shared by every table that shows ΔPPL (run summary, sweep table, ...):

  format_delta_ci(0.0812, -0.0214, 0.1838)   -> '+0.08 [−0.02, +0.18]'
  is_measurable(-0.0214, 0.1838)             -> False (the CI contains 0)
  describe_delta_ci(0.0812, -0.0214, 0.1838)
      -> '+0.08 [−0.02, +0.18], no measurable change'
  format_mean_stderr(0.012345, 0.00061)      -> '0.01235 ± 0.00061'

Rounding rule: the interval's half-width (or the stderr) rounded to two
significant digits fixes the number of decimals of every number printed with
it; e.g. half-width 0.1 -> 2 decimals, 0.012 -> 3, 1.5 -> 1, 25 -> 0.
Negative numbers use the typographic minus '−' (U+2212); a number that rounds
to zero is printed without a sign.
"""

from __future__ import annotations

import math

MINUS = "\u2212"
UNDEFINED_CI = "no CI: needs ≥ 2 windows"
NO_CHANGE = "no measurable change"


def decimals_for(uncertainty: float) -> int | None:
  """Decimals that keep two significant digits of `uncertainty` (>= 0).

  None when it is 0, NaN or infinite: it then fixes no precision.
  """
  if not math.isfinite(uncertainty) or uncertainty == 0:
    return None
  if uncertainty < 0:
    raise ValueError(f"uncertainty={uncertainty}: allowed: >= 0.")
  exponent = int(f"{uncertainty:.1e}".split("e")[1])  # After 2-digit rounding.
  return max(0, 1 - exponent)


def format_signed(value: float, decimals: int | None) -> str:
  """'+0.08' / '−0.02' / '0.00' with `decimals` decimals.

  `decimals` None prints three significant digits instead.
  """
  if not math.isfinite(value):
    return str(value)
  magnitude = abs(value)
  text = (f"{magnitude:.3g}" if decimals is None
          else f"{magnitude:.{decimals}f}")
  if float(text) == 0:
    return text
  return ("+" if value > 0 else MINUS) + text


def _check_interval(low: float, high: float) -> None:
  if low > high:  # False for NaN: an undefined interval is allowed.
    raise ValueError(f"confidence interval [{low}, {high}]: low > high; "
                     "allowed: low <= high (or both NaN).")


def format_delta_ci(delta: float, low: float, high: float) -> str:
  """'+0.08 [−0.02, +0.18]': the change and its confidence interval.

  Decimals follow the half-width (high - low) / 2 (module docstring). A NaN
  interval gives '+0.0812 [no CI: needs ≥ 2 windows]'; a zero-width one
  prints three significant digits.
  """
  _check_interval(low, high)
  if math.isnan(low) or math.isnan(high):
    return f"{format_signed(delta, None)} [{UNDEFINED_CI}]"
  decimals = decimals_for((high - low) / 2)
  return (f"{format_signed(delta, decimals)} [{format_signed(low, decimals)}, "
          f"{format_signed(high, decimals)}]")


def is_measurable(low: float, high: float) -> bool:
  """Whether the interval excludes 0 (low > 0 or high < 0).

  False when it touches or contains 0, and when it is undefined (NaN).
  """
  _check_interval(low, high)
  return bool(low > 0 or high < 0)


def describe_delta_ci(delta: float, low: float, high: float) -> str:
  """`format_delta_ci`, followed by ', no measurable change' when the
  interval is defined and contains 0."""
  text = format_delta_ci(delta, low, high)
  if math.isnan(low) or math.isnan(high) or is_measurable(low, high):
    return text
  return f"{text}, {NO_CHANGE}"


def format_mean_stderr(mean: float, stderr: float, signed: bool = False
                       ) -> str:
  """'0.01235 ± 0.00061', both rounded to two significant digits of stderr.

  A NaN stderr gives '0.0123 ± n/a', a zero one '0.0123 ± 0' (three
  significant digits of the mean in both cases). `signed` prints the mean
  as a change, with '+'/'−' (`format_signed`).
  """
  decimals = decimals_for(stderr)
  if signed:
    mean_text = format_signed(mean, decimals)
  elif not math.isfinite(mean):
    mean_text = str(mean)
  else:
    mean_text = f"{mean:.3g}" if decimals is None else f"{mean:.{decimals}f}"
  if decimals is None:
    return f"{mean_text} ± {'0' if stderr == 0 else 'n/a'}"
  return f"{mean_text} ± {stderr:.{decimals}f}"
