"""Bit planes: plane j of a packed array is dequantize(...)[..., j::P]."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from kvq_jax.quant import QuantizedArray, QuantSpec, dequantize, quantize
from kvq_jax.quant.planes import (dequantize_planes, interleave_planes,
                                  nonfinite_rows, plane_count)

SPECS = {
    "q4_0": QuantSpec("int4", "symmetric", "per_group", 32, rounding="ggml",
                      scale_dtype="float16"),
    "int4_g8_asym": QuantSpec("int4", "asymmetric", "per_group", 8),
    "int2_g8_asym": QuantSpec("int2", "asymmetric", "per_group", 8),
    "int4_token": QuantSpec("int4", "symmetric", "per_token"),
    "int8_g16": QuantSpec("int8", "symmetric", "per_group", 16),
    # KIVI keys: per channel over 4-token groups along the row axis.
    "int2_channel": QuantSpec("int2", "asymmetric", "per_channel", 4,
                              axis=-2),
}


def test_plane_counts():
  assert plane_count(SPECS["q4_0"]) == 2
  assert plane_count(SPECS["int2_g8_asym"]) == 4
  assert plane_count(SPECS["int8_g16"]) == 1
  assert plane_count(None) == 0
  assert plane_count(QuantSpec("int3", "symmetric", "per_token")) == 0
  assert plane_count(QuantSpec("int5", "asymmetric", "per_group", 32)) == 0
  assert plane_count(QuantSpec("fp8_e4m3", "symmetric", "per_token")) == 0
  assert plane_count(QuantSpec("int4", "lloyd_max", "per_token")) == 0
  assert plane_count(QuantSpec("int4", "symmetric", "per_token",
                               outliers=1)) == 0


def test_hand_computed_bytes():
  """Byte 0x21 holds int4 codes [1, 2]; 0xE4 int2 codes [0, 1, 2, 3]."""
  spec4 = QuantSpec("int4", "asymmetric", "per_token")
  qa = QuantizedArray(jnp.asarray([[0x21]], jnp.uint8),
                      jnp.asarray([[2.0]]), jnp.asarray([[0.5]]), spec4, 2,
                      "float32")
  lo, hi = dequantize_planes(qa)
  assert lo.tolist() == [[2.5]] and hi.tolist() == [[4.5]]
  spec2 = QuantSpec("int2", "symmetric", "per_token")
  qa = QuantizedArray(jnp.asarray([[0xE4]], jnp.uint8), jnp.asarray([[1.0]]),
                      None, spec2, 4, "float32")
  # Symmetric int2 stores q + 2: codes 0..3 are -2, -1, 0, 1.
  assert [p.tolist() for p in dequantize_planes(qa)] == [[[-2.0]], [[-1.0]],
                                                         [[0.0]], [[1.0]]]


@pytest.mark.parametrize("name", sorted(SPECS))
def test_planes_are_the_strided_dequantized_tensor(name):
  spec = SPECS[name]
  x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 3, 8, 64)),
                  jnp.float32)
  qa = quantize(x, spec)
  full = np.asarray(dequantize(qa, jnp.float32))
  planes = dequantize_planes(qa)
  assert len(planes) == plane_count(spec)
  for j, plane in enumerate(planes):
    np.testing.assert_allclose(np.asarray(plane), full[..., j::len(planes)],
                               rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(np.asarray(interleave_planes(planes)), full,
                             rtol=1e-6, atol=1e-6)


def test_planes_refuse_formats_without_them():
  qa = quantize(jnp.ones((2, 24)), QuantSpec("int3", "symmetric",
                                             "per_token"))
  with pytest.raises(ValueError, match="no bit planes.*2, 4 or 8 bits"):
    dequantize_planes(qa)


def test_nonfinite_rows_from_scales_and_zeros():
  x = jnp.asarray(np.random.default_rng(1).standard_normal((2, 8, 16)),
                  jnp.float32)
  qa = quantize(x, SPECS["int4_g8_asym"])
  assert not np.asarray(nonfinite_rows(qa)).any()
  bad = dataclasses.replace(
      qa, scale=qa.scale.at[0, 3, 1].set(jnp.nan),
      zero=qa.zero.at[1, 5, 0].set(jnp.inf))
  want = np.zeros((2, 8), bool)
  want[0, 3] = want[1, 5] = True
  np.testing.assert_array_equal(np.asarray(nonfinite_rows(bad)), want)
  # Per channel over 4-row groups: one bad statistic spoils its 4 rows.
  qc = quantize(x, SPECS["int2_channel"])
  qc = dataclasses.replace(qc, scale=qc.scale.at[1, 1, 7].set(jnp.nan))
  want = np.zeros((2, 8), bool)
  want[1, 4:8] = True
  np.testing.assert_array_equal(np.asarray(nonfinite_rows(qc)), want)
