"""scheme='lloyd_max': codes into the Lloyd-Max codebook, one scale per group."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kvq_jax.kernels.cache_layout import describe_packed
from kvq_jax.quant import (QuantSpec, bits_per_element, codebook,
                           constant_arrays, dequantize, pack, quantize,
                           unpack)

LM4 = QuantSpec("int4", "lloyd_max", "per_token")


def test_hand_case_two_level_vector_is_exact():
  """x = [1, -1, 1, -1] (d = 4): y = x * 2 / |x| = x, each coordinate goes
  to the centroid a nearest +-1, the least-squares scale is 1/a, so x comes
  back exactly (up to the bfloat16 scale)."""
  spec = QuantSpec("int2", "lloyd_max", "per_token", scale_dtype="float32")
  c = codebook.centroids(2, 4)
  x = jnp.asarray([[1.0, -1.0, 1.0, -1.0]])
  qa = quantize(x, spec)
  up, down = int(np.argmin(np.abs(c - 1))), int(np.argmin(np.abs(c + 1)))
  np.testing.assert_array_equal(np.asarray(unpack(qa.data, 2)),
                                [[up, down, up, down]])
  np.testing.assert_allclose(np.asarray(qa.scale), [[1 / c[up]]], rtol=1e-6)
  np.testing.assert_allclose(np.asarray(dequantize(qa)), x, rtol=1e-6)


def test_codes_are_nearest_centroids_nibble_order():
  """int4: element 2i in the low nibble of byte i; the code of each element
  is the index of its nearest centroid after normalisation."""
  x = jax.random.normal(jax.random.PRNGKey(1), (3, 64))
  qa = quantize(x, LM4)
  xs = np.asarray(x, np.float64)
  y = xs * 8.0 / np.linalg.norm(xs, axis=-1, keepdims=True)
  c = codebook.centroids(4, 64)
  expected = np.argmin(np.abs(y[..., None] - c), axis=-1).astype(np.uint8)
  np.testing.assert_array_equal(np.asarray(qa.data), np.asarray(
      pack(jnp.asarray(expected), 4)))
  data = np.asarray(qa.data)
  np.testing.assert_array_equal(data & 0xF, expected[:, 0::2])
  np.testing.assert_array_equal(data >> 4, expected[:, 1::2])


def test_scale_is_least_squares():
  x = jax.random.normal(jax.random.PRNGKey(2), (5, 32))
  spec = QuantSpec("int3", "lloyd_max", "per_token", scale_dtype="float32")
  qa = quantize(x, spec)
  cu = codebook.centroids(3, 32)[np.asarray(unpack(qa.data, 3))]
  xs = np.asarray(x)
  want = np.sum(xs * cu, axis=-1) / np.sum(cu * cu, axis=-1)
  np.testing.assert_allclose(np.asarray(qa.scale)[:, 0], want, rtol=1e-5)


# Lloyd-Max MSE of N(0, 1) per coordinate (Max 1960): relative L2 bound.
GAUSSIAN_MSE = {2: 0.1175, 3: 0.03454, 4: 0.009497, 5: 0.002499}


@pytest.mark.parametrize("bits", [2, 3, 4, 5])
@pytest.mark.parametrize("group", [None, 32])
def test_relative_l2_on_gaussian_vectors(bits, group):
  x = jax.random.normal(jax.random.PRNGKey(bits), (64, 4, 64))
  spec = QuantSpec(f"int{bits}", "lloyd_max",
                   "per_group" if group else "per_token", group)
  y = dequantize(quantize(x, spec))
  rel = float(jnp.linalg.norm(y - x) / jnp.linalg.norm(x))
  assert rel < 1.05 * np.sqrt(GAUSSIAN_MSE[bits])
  uniform = QuantSpec(f"int{bits}", "symmetric",
                      "per_group" if group else "per_token", group)
  # Where the codebook beats uniform levels on Gaussian data (at int3 in
  # groups of 32 the uniform grid's per-group range is as good: 0.175 vs
  # 0.177, so it is not asserted there).
  if bits == 2 or (bits == 3 and group is None):
    y_u = dequantize(quantize(x, uniform))
    assert rel < float(jnp.linalg.norm(y_u - x) / jnp.linalg.norm(x))


def test_all_zero_group_and_non_finite():
  x = jnp.asarray(np.random.default_rng(0).standard_normal((3, 16)),
                  jnp.float32)
  x = x.at[0].set(0.0).at[1, 3].set(jnp.inf).at[1, 4].set(-jnp.inf)
  x = x.at[2, 5].set(jnp.nan)
  spec = QuantSpec("int4", "lloyd_max", "per_token")
  qa = quantize(x, spec)
  y = np.asarray(dequantize(qa))
  codes = np.asarray(unpack(qa.data, 4))
  assert np.all(y[0] == 0) and float(qa.scale[0, 0]) == 0.0
  assert codes[1, 3] == 15 and codes[1, 4] == 0  # outer codes.
  assert np.all(np.isfinite(y))
  # NaN counts as 0: the other elements match the row without it.
  clean = np.asarray(dequantize(quantize(x.at[2, 5].set(0.0), spec)))
  np.testing.assert_array_equal(y[2], clean[2])


def test_accounting_and_constants():
  assert bits_per_element(LM4, 64) == pytest.approx(4.25)
  spec = QuantSpec("int2", "lloyd_max", "per_group", 32)
  assert bits_per_element(spec) == pytest.approx(2.5)
  (table,) = constant_arrays(spec, 64)
  np.testing.assert_array_equal(table, codebook.centroids(2, 32))
  assert constant_arrays(QuantSpec("int4", "symmetric", "per_token"),
                         64) == []


@pytest.mark.parametrize("kwargs,match", [
    (dict(format="int8"), "format='int8'"),
    (dict(format="fp8_e4m3"), "scheme"),
    (dict(granularity="per_channel", group_size=32), "granularity"),
    (dict(granularity="per_group", group_size=4, axis=-3), "axis"),
    (dict(clip_ratio=0.9), "clip_ratio"),
    (dict(rounding="ggml", scale_dtype="float16"), "rounding"),
])
def test_invalid_specs(kwargs, match):
  base = dict(format="int4", scheme="lloyd_max", granularity="per_token")
  with pytest.raises(ValueError, match=match):
    QuantSpec(**{**base, **kwargs})


def test_decode_kernel_refuses_codebooks():
  qa = quantize(jnp.zeros((1, 2, 8, 64)), LM4)
  reason = describe_packed(qa, 64, "k", 8)
  assert isinstance(reason, str) and "codebook" in reason
