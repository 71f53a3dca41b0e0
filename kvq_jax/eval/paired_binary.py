"""Paired statistics of pass/fail outcomes: a preset against its baseline on
the same problems.

With b = problems the baseline passes and the preset fails, c = the reverse,
n problems in all:

* Δpass@1 = (c - b) / n.
* McNemar's exact test: under "no change" each of the b + c discordant
  problems flips either way with probability 1/2, so
  p = min(1, 2 * P[Binomial(b + c, 1/2) <= min(b, c)]), and p = 1 when
  nothing flipped.
* The paired bootstrap 95% CI of Δpass@1, computed exactly (the "ideal"
  bootstrap, no Monte Carlo): a resample draws n problems with replacement,
  each contributing d = +1 (c-type), -1 (b-type) or 0, so its sum has the
  law of n draws from {-1: b/n, 0: (n-b-c)/n, +1: c/n}, obtained by
  convolving that three-point law n times. The interval is the 2.5% and
  97.5% quantiles of sum / n (the smallest value whose CDF reaches the
  level). Deterministic, so a table gives one interval.

"No measurable change" when the interval contains 0, as for ΔPPL.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from kvq_jax.eval.uncertainty_format import is_measurable


@dataclasses.dataclass(frozen=True)
class PairedPassFail:
  """A preset's outcomes against the baseline's on the same n problems."""

  n: int
  base_passed: int
  quant_passed: int
  lost: int  # b: baseline passes, preset fails.
  gained: int  # c: baseline fails, preset passes.
  delta: float  # (gained - lost) / n.
  ci95_low: float
  ci95_high: float
  mcnemar_p: float

  @property
  def base_pass_at_1(self) -> float:
    return self.base_passed / self.n

  @property
  def pass_at_1(self) -> float:
    return self.quant_passed / self.n

  @property
  def measurable(self) -> bool:
    """False when the 95% interval contains or touches 0 ('no measurable
    change'), as `uncertainty_format.is_measurable`."""
    return is_measurable(self.ci95_low, self.ci95_high)


def mcnemar_exact(lost: int, gained: int) -> float:
  """Two-sided exact McNemar p-value of `lost` and `gained` discordant pairs."""
  for name, value in (("lost", lost), ("gained", gained)):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
      raise ValueError(f"mcnemar_exact: {name}={value!r}; allowed: an int "
                       ">= 0.")
  n = lost + gained
  if n == 0:
    return 1.0
  tail = sum(math.comb(n, i) for i in range(min(lost, gained) + 1))
  return min(1.0, 2.0 * tail / 2 ** n)


def bootstrap_ci95(lost: int, gained: int, n: int) -> tuple[float, float]:
  """The exact paired-bootstrap 95% interval of (gained - lost) / n."""
  if n < 1 or lost < 0 or gained < 0 or lost + gained > n:
    raise ValueError(f"bootstrap_ci95: lost={lost}, gained={gained}, n={n}; "
                     "allowed: 0 <= lost + gained <= n, n >= 1.")
  step = np.array([lost, n - lost - gained, gained], np.float64) / n
  law = np.ones(1)
  for _ in range(n):  # law[k]: P[sum = k - (current draws)].
    law = np.convolve(law, step)
  values = np.arange(-n, n + 1) / n
  cdf = np.cumsum(law)
  cdf /= cdf[-1]
  low = values[np.searchsorted(cdf, 0.025 - 1e-12)]
  high = values[np.searchsorted(cdf, 0.975 - 1e-12)]
  return float(low), float(high)


def paired_pass_fail(base: Sequence[bool], quant: Sequence[bool]
                     ) -> PairedPassFail:
  """Every figure of a paired pass/fail comparison (module docstring)."""
  base, quant = [bool(x) for x in base], [bool(x) for x in quant]
  if len(base) != len(quant) or not base:
    raise ValueError(f"paired_pass_fail: {len(base)} baseline and "
                     f"{len(quant)} preset outcomes; allowed: the same "
                     "problems, at least one.")
  n = len(base)
  lost = sum(b and not q for b, q in zip(base, quant))
  gained = sum(q and not b for b, q in zip(base, quant))
  low, high = bootstrap_ci95(lost, gained, n)
  return PairedPassFail(n=n, base_passed=sum(base), quant_passed=sum(quant),
                        lost=lost, gained=gained, delta=(gained - lost) / n,
                        ci95_low=low, ci95_high=high,
                        mcnemar_p=mcnemar_exact(lost, gained))
