"""scheme='static' (fixed range, no scale) and dense-and-sparse outliers."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kvq_jax.kernels.cache_layout import describe_packed
from kvq_jax.quant import (QuantSpec, bits_per_element, constant_arrays,
                           dequantize, nbytes, pack, quantize, unpack)

ST2 = QuantSpec("int2", "static", "per_token")
ST4 = QuantSpec("int4", "static", "per_token")


def test_static_hand_case_int2():
  """L = 4 levels over [-1, 1]: -0.75, -0.25, 0.25, 0.75; u = floor((x + 1)
  * 2) clipped to 0..3; NaN takes 0.0's code, +Inf the top one."""
  x = jnp.asarray([[-1.2, -0.6, -0.1, 0.0, 0.3, 0.9, jnp.nan, jnp.inf]])
  qa = quantize(x, ST2)
  assert qa.scale is None and qa.zero is None
  np.testing.assert_array_equal(np.asarray(unpack(qa.data, 2)),
                                [[0, 0, 1, 2, 2, 3, 2, 3]])
  np.testing.assert_array_equal(
      np.asarray(dequantize(qa)),
      [[-0.75, -0.75, -0.25, 0.25, 0.25, 0.75, 0.25, 0.75]])


def test_static_clip_ratio_scales_the_range_and_nibble_order():
  spec = QuantSpec("int4", "static", "per_token", clip_ratio=0.5)
  x = jnp.asarray([[-0.5, -0.49, 0.0, 0.02, 0.47, 0.5, 0.7, -3.0]])
  qa = quantize(x, spec)
  codes = np.floor((np.asarray(x) / 0.5 + 1) * 8).clip(0, 15)
  np.testing.assert_array_equal(np.asarray(unpack(qa.data, 4)), codes)
  data = np.asarray(qa.data)
  np.testing.assert_array_equal(data & 0xF, codes[:, 0::2])
  np.testing.assert_array_equal(data >> 4, codes[:, 1::2])
  np.testing.assert_allclose(np.asarray(dequantize(qa)),
                             ((codes + 0.5) / 8 - 1) * 0.5, rtol=1e-6)


@pytest.mark.parametrize("bits", [8, 4, 3, 2])
def test_static_error_bound_inside_the_range(bits):
  fmt = f"int{bits}"
  x = jax.random.uniform(jax.random.PRNGKey(bits), (6, 64), minval=-1,
                         maxval=1)
  y = dequantize(quantize(x, QuantSpec(fmt, "static", "per_token")))
  assert float(jnp.max(jnp.abs(y - x))) <= 1.0 / 2 ** bits + 1e-6


def test_static_stores_only_codes():
  x = jnp.zeros((1, 3, 8, 64))
  qa = quantize(x, ST4)
  assert nbytes(qa) == 3 * 8 * 64 // 2
  assert bits_per_element(ST4, 64) == 4.0
  assert "static" in describe_packed(qa, 64, "k", 8)
  with_outliers = quantize(x, QuantSpec("int4", granularity="per_token",
                                         outliers=1))
  assert "outliers" in describe_packed(with_outliers, 64, "v", 8)


def _outlier_spec(n, **kw):
  return QuantSpec("int4", kw.pop("scheme", "symmetric"),
                   kw.pop("granularity", "per_token"), outliers=n, **kw)


def test_outliers_hand_case():
  """The two largest magnitudes come back exactly (index order: by
  magnitude); the rest is what quantizing the vector without them gives."""
  x = np.array([[0.1, -5.0, 0.2, 3.0, -0.15, 0.05, 0.0, 0.12]], np.float32)
  qa = quantize(jnp.asarray(x), _outlier_spec(2))
  np.testing.assert_array_equal(np.asarray(qa.outlier_index), [[1, 3]])
  np.testing.assert_array_equal(np.asarray(qa.outlier_value, np.float32),
                                [[-5.0, 3.0]])
  rest = x.copy()
  rest[0, [1, 3]] = 0.0
  plain = quantize(jnp.asarray(rest), QuantSpec("int4", "symmetric",
                                                "per_token"))
  np.testing.assert_array_equal(np.asarray(qa.scale), np.asarray(plain.scale))
  want = np.asarray(dequantize(plain)).copy()
  want[0, [1, 3]] = [-5.0, 3.0]
  np.testing.assert_array_equal(np.asarray(dequantize(qa)), want)


def test_outliers_skip_non_finite_and_break_ties_low_index():
  x = jnp.asarray([[jnp.inf, 1.0, -2.0, 2.0], [jnp.nan] * 3 + [0.5]])
  qa = quantize(x, _outlier_spec(1))
  np.testing.assert_array_equal(np.asarray(qa.outlier_index), [[2], [3]])
  y = np.asarray(dequantize(qa))
  assert y[0, 2] == -2.0 and y[1, 3] == 0.5
  assert np.all(np.isfinite(y))
  # With fewer finite values than outliers, a chosen NaN comes back as 0.
  qa = quantize(jnp.asarray([[jnp.nan, jnp.nan, 1.0, 2.0]]), _outlier_spec(3))
  assert sorted(np.asarray(qa.outlier_index)[0].tolist()) == [0, 2, 3]
  np.testing.assert_array_equal(np.asarray(dequantize(qa))[0, [0, 2, 3]],
                                [0.0, 1.0, 2.0])


@pytest.mark.parametrize("spec", [
    _outlier_spec(2, scheme="asymmetric", granularity="per_group",
                  group_size=32),
    QuantSpec("int3", "static", "per_token", outliers=1)],
    ids=["int4_g32_asym_o2", "int3_st_o1"])
def test_outliers_count_indices_and_relative_l2(spec):
  """Heavy-tailed vectors: exactly n distinct indices per vector, those
  positions exact (to bfloat16), and the error below the outlier-free one."""
  key = jax.random.PRNGKey(0)
  x = jax.random.t(key, 3.0, (4, 7, 64)) * 0.2
  qa = quantize(x, spec)
  n = spec.outliers
  index = np.asarray(qa.outlier_index)
  assert index.shape == (4, 7, n) and index.dtype == np.uint8
  assert all(len(set(row)) == n for row in index.reshape(-1, n))
  y = dequantize(qa)
  picked = np.take_along_axis(np.asarray(y), index.astype(int), -1)
  np.testing.assert_array_equal(picked, np.asarray(qa.outlier_value,
                                                   np.float32))
  without = dequantize(quantize(x, dataclasses.replace(spec, outliers=0)))
  err = lambda z: float(jnp.linalg.norm(z - x) / jnp.linalg.norm(x))
  assert err(y) < 0.8 * err(without)
  assert err(y) < (0.15 if spec.bits == 4 else 0.3)


def test_outlier_accounting_matches_leaves():
  spec = _outlier_spec(2, scheme="asymmetric", granularity="per_group",
                       group_size=32)
  qa = quantize(jnp.zeros((3, 64)), spec)
  assert nbytes(qa) * 8 == 3 * 64 * bits_per_element(spec, 64)
  assert bits_per_element(spec, 64) == 4 + 32 / 32 + 2 * 24 / 64
  with pytest.raises(ValueError, match="axis_len"):
    bits_per_element(spec)


@pytest.mark.parametrize("kwargs, match", [
    (dict(format="fp8_e4m3", scheme="static"), "static"),
    (dict(scheme="static", granularity="per_group", group_size=8), "static"),
    (dict(scheme="static", rounding="ggml", scale_dtype="float16"), "ggml"),
    (dict(outliers=1, granularity="per_channel", group_size=8), "outliers"),
    (dict(outliers=1, format="fp8_e4m3"), "outliers"),
    (dict(outliers=-1), "outliers"),
])
def test_invalid_specs(kwargs, match):
  base = dict(format="int4", scheme="symmetric", granularity="per_token")
  with pytest.raises(ValueError, match=match):
    QuantSpec(**{**base, **kwargs})


def test_outliers_need_room_and_uint8_indices():
  with pytest.raises(ValueError, match="outliers"):
    quantize(jnp.zeros((2, 4)), _outlier_spec(4))
  with pytest.raises(ValueError, match="256"):
    quantize(jnp.zeros((1, 512)), _outlier_spec(1))
  assert np.asarray(pack(jnp.zeros((1, 2), jnp.uint8), 4)).shape == (1, 1)


def test_static_levels_hand_case_and_constant():
  """Calibrated levels: nearest level, ties to the lower (t = midpoints
  -1.0, -0.15, 1.1); NaN takes 0.0's code; the levels are a constant."""
  spec = QuantSpec("int2", "static", "per_token",
                   levels=(-1.5, -0.5, 0.2, 2.0))
  x = jnp.asarray([[-3.0, -1.0, -0.99, -0.15, -0.14, 1.1, 1.2, jnp.nan]])
  qa = quantize(x, spec)
  np.testing.assert_array_equal(np.asarray(unpack(qa.data, 2)),
                                [[0, 0, 1, 1, 2, 2, 3, 2]])
  np.testing.assert_array_equal(
      np.asarray(dequantize(qa)),
      np.float32([[-1.5, -1.5, -0.5, -0.5, 0.2, 0.2, 2.0, 0.2]]))
  np.testing.assert_array_equal(constant_arrays(spec, 8)[0],
                                np.float32([-1.5, -0.5, 0.2, 2.0]))
  assert bits_per_element(spec, 8) == 2.0


@pytest.mark.parametrize("kwargs", [
    dict(scheme="static", levels=(0.0, 1.0)),
    dict(scheme="static", levels=tuple(range(15)) + (3.0,)),
    dict(scheme="symmetric", levels=tuple(range(16))),
], ids=["count", "order", "scheme"])
def test_invalid_levels(kwargs):
  with pytest.raises(ValueError, match="levels"):
    QuantSpec("int4", granularity="per_token", **kwargs)
