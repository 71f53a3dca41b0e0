"""Differentiable rounding of the KL fit (`calibration.straight_through`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

from kvq_jax.calibration.straight_through import (outer_edges, skew_exp,
                                                  static_codebook_round_trip,
                                                  uniform_levels)
from kvq_jax.quant import QuantSpec, dequantize, quantize

LEVELS = (-0.9, -0.3, 0.1, 0.8)


@pytest.mark.parametrize("outliers", [0, 1])
def test_codebook_round_trip_is_the_cache_value_for_value(outliers):
  spec = QuantSpec("int2", "static", "per_token", levels=LEVELS,
                   outliers=outliers)
  z = jax.random.normal(jax.random.key(0), (3, 5, 16)) * 0.8
  want = dequantize(quantize(z, spec), jnp.float32)
  got = static_codebook_round_trip(z, jnp.asarray(LEVELS), spec, "float32")
  np.testing.assert_array_equal(got, want)


def test_codebook_round_trip_uniform_levels_match_the_static_grid():
  spec = QuantSpec("int3", "static", "per_token")
  z = jax.random.uniform(jax.random.key(1), (4, 32), minval=-1.3, maxval=1.3)
  want = dequantize(quantize(z, spec), jnp.float32)
  got = static_codebook_round_trip(z, uniform_levels(spec), spec, "float32")
  np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)


def test_codebook_gradients_by_hand():
  """sum(y): d/dc_j = how many values round to level j; d/dz = 1 inside
  the outer cells, 0 beyond them; a kept outlier passes 1 and adds to no
  level."""
  levels = jnp.asarray(LEVELS)
  z = jnp.asarray([[-2.0, -0.5, 0.0, 0.2, 0.9, 0.95]])
  plain = QuantSpec("int2", "static", "per_token", levels=LEVELS)
  gz, gc = jax.grad(lambda z, c: static_codebook_round_trip(
      z, c, plain, "float32").sum(), argnums=(0, 1))(z, levels)
  # codes: -2 -> 0 (clipped), -0.5 -> 1, 0 -> 2, 0.2 -> 2, 0.9 -> 3,
  # 0.95 -> 3; outer edges -1.2 and 1.15.
  np.testing.assert_array_equal(gc, [1, 1, 2, 2])
  np.testing.assert_array_equal(gz, [[0, 1, 1, 1, 1, 1]])
  np.testing.assert_allclose(outer_edges(levels), (-1.2, 1.15), rtol=1e-6)
  kept = QuantSpec("int2", "static", "per_token", levels=LEVELS, outliers=1)
  gz, gc = jax.grad(lambda z, c: static_codebook_round_trip(
      z, c, kept, "float32").sum(), argnums=(0, 1))(z, levels)
  np.testing.assert_array_equal(gc, [0, 1, 2, 2])
  np.testing.assert_array_equal(gz, [[1, 1, 1, 1, 1, 1]])


def test_skew_exp_is_orthogonal_expm_and_the_identity_at_zero():
  a = jax.random.normal(jax.random.key(2), (3, 8, 8))
  r = skew_exp(a)
  s = np.asarray(a, np.float64)
  for head in range(3):  # An independent matrix exponential.
    np.testing.assert_allclose(
        r[head], scipy.linalg.expm((s[head] - s[head].T) / 2), atol=2e-5)
  np.testing.assert_allclose(jnp.einsum("kab,kcb->kac", r, r),
                             np.broadcast_to(np.eye(8), (3, 8, 8)),
                             atol=1e-5)
  np.testing.assert_array_equal(skew_exp(jnp.zeros((2, 4, 4))),
                                np.broadcast_to(np.eye(4), (2, 4, 4)))
