"""Pareto front of (bits, delta PPL) on synthetic tables."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvq_jax.sweep.pareto import pareto_front


def test_front_of_a_small_table():
  #            A     B     C     D     E     F (NaN)
  bits = [16.0, 8.5, 4.5, 4.5, 3.0, 2.0]
  delta = [0.0, 0.01, 0.5, 2.0, 0.4, np.nan]
  # D is dominated by C (same bits, worse), C by E (fewer bits, better).
  assert pareto_front(bits, delta).tolist() == [
      True, True, False, False, True, False]


def test_duplicates_are_both_on_the_front():
  assert pareto_front([4.0, 4.0], [1.0, 1.0]).tolist() == [True, True]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 16), st.integers(-5, 50)),
                min_size=1, max_size=30))
def test_front_is_exactly_the_non_dominated_set(pairs):
  bits = np.array([p[0] for p in pairs], float)
  delta = np.array([p[1] for p in pairs], float)
  front = pareto_front(bits, delta)
  for i in range(len(pairs)):
    dominated = any(
        bits[j] <= bits[i] and delta[j] <= delta[i]
        and (bits[j] < bits[i] or delta[j] < delta[i])
        for j in range(len(pairs)))
    assert front[i] == (not dominated)
  assert front.any()
