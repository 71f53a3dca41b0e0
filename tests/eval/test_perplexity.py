"""perplexity_from_nll: llama.cpp's PPL and standard error, checked by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvq_jax.eval.perplexity import perplexity_from_nll


def test_matches_hand_computed_llama_cpp_formula():
  # mean 3, population variance ((-2)^2 + (-1)^2 + 0 + 3^2) / 4 = 3.5.
  result = perplexity_from_nll([1.0, 2.0, 3.0, 6.0])
  assert result.count == 4
  assert result.mean_nll == pytest.approx(3.0)
  assert result.ppl == pytest.approx(math.exp(3.0))
  assert result.stderr == pytest.approx(math.exp(3.0) * math.sqrt(3.5 / 3))


def test_two_dimensional_input_is_flattened():
  nll = np.array([[0.5, 1.5], [2.5, 3.5]], np.float32)
  result = perplexity_from_nll(nll)
  # mean 2, population variance (2.25 + 0.25 + 0.25 + 2.25) / 4 = 1.25.
  assert result.ppl == pytest.approx(math.exp(2.0))
  assert result.stderr == pytest.approx(math.exp(2.0) * math.sqrt(1.25 / 3))


def test_constant_nll_has_zero_stderr_and_single_token_too():
  assert perplexity_from_nll([2.0] * 5).stderr == 0.0
  single = perplexity_from_nll([math.log(7.0)])
  assert single.ppl == pytest.approx(7.0) and single.stderr == 0.0


def test_large_mean_small_spread_is_not_cancelled_away():
  nll = 50.0 + np.array([0.0, 1e-4, 2e-4, 3e-4])
  expected_var = np.var(np.array([0.0, 1e-4, 2e-4, 3e-4]))
  result = perplexity_from_nll(nll)
  assert result.stderr == pytest.approx(
      result.ppl * math.sqrt(expected_var / 3), rel=1e-6)


def test_empty_raises_value_error():
  with pytest.raises(ValueError, match="zero scored tokens"):
    perplexity_from_nll([])


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_raises_floating_point_error(bad):
  with pytest.raises(FloatingPointError, match="1 of 3"):
    perplexity_from_nll([1.0, bad, 2.0])
