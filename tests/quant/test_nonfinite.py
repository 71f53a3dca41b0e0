"""Degenerate inputs and the non-finite policy (see quantize.py docstring)."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from kvq_jax.quant import QuantSpec, dequantize, quantize, unpack

SHAPE = (2, 4, 16)  # Groups of 8 along the last axis: 16 groups.
SPECS = [
    QuantSpec(format=f, scheme=s, granularity="per_group", group_size=8)
    for f in ("int8", "int5", "int4", "int3", "int2")
    for s in ("symmetric", "symmetric_narrow", "asymmetric")
] + [QuantSpec(format=f, granularity="per_group", group_size=8)
     for f in ("fp8_e4m3", "fp8_e5m2")] + [
    QuantSpec(format=f, scheme=s, granularity="per_group", group_size=8,
              scale_dtype="float16", rounding="ggml")
    for f, s in (("int8", "symmetric_narrow"), ("int4", "symmetric"),
                 ("int4", "asymmetric"), ("int5", "symmetric"),
                 ("int5", "asymmetric"))]
SPEC_IDS = [f"{s.format}-{s.scheme}-{s.rounding}" for s in SPECS]


def _x(seed=0):
  rng = np.random.default_rng(seed)
  return (rng.standard_normal(SHAPE) * 2.0).astype(np.float32)


def _leaves(qa):
  return [np.asarray(l) for l in (qa.data, qa.scale, qa.zero) if l is not None]


@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
@pytest.mark.parametrize("fill", [0.0, 3.0, -2.5, 1e-40, -1e-40, 1e30, -1e30])
@pytest.mark.parametrize("scale_dtype", ["bfloat16", "float16"])
def test_degenerate_groups_are_finite(spec, fill, scale_dtype):
  ggml = spec.rounding == "ggml"
  if ggml and scale_dtype != "float16":
    pytest.skip("ggml stores float16 scales")
  spec = dataclasses.replace(spec, scale_dtype=scale_dtype)
  x = _x()
  x[0, 1, :8] = fill  # A constant group.
  x[1, 2, 3] = fill  # One odd value inside a normal group.
  qa = quantize(jnp.asarray(x), spec)
  for leaf in (qa.scale, qa.zero):
    if leaf is not None:
      assert np.all(np.isfinite(np.asarray(leaf, np.float32)))
  dq = np.asarray(dequantize(qa))
  assert np.all(np.isfinite(dq))
  group = dq[0, 1, :8]
  if fill == 0.0:
    assert np.all(group == 0.0)
  elif abs(fill) < 1e-30:  # Flushed or rounded to zero: |scale| = tiny.
    assert np.all(np.abs(group) <= 2 * float(jnp.finfo(scale_dtype).tiny))
    expected = 0.0 if ggml else np.float32(jnp.finfo(scale_dtype).tiny)
    assert abs(np.asarray(qa.scale, np.float32)[0, 1, 0]) == expected
  elif abs(fill) > 1e20:
    if scale_dtype == "float16":  # Scale (or zero) caps at float16's max.
      meta = [abs(float(qa.scale[0, 1, 0]))]
      if qa.zero is not None:
        meta.append(abs(float(qa.zero[0, 1, 0])))
      assert max(meta) == 65504.0
      assert np.all(np.sign(group) == np.sign(fill))
    else:
      np.testing.assert_allclose(group, fill, rtol=2 ** -3)
  elif spec.is_float:  # Constant group: fp8 relative bound.
    np.testing.assert_allclose(group, fill, rtol=2 ** -3)
  else:  # Constant group: within half a step; asymmetric exact.
    scale = abs(float(qa.scale[0, 1, 0]))
    assert np.all(np.abs(group - fill) <= scale / 2 * (1 + 1e-6))
    if spec.scheme == "asymmetric":
      assert np.all(group == fill)


def _groups_except(a, g):
  """All of `a` but group g (= (i, j, k) index of an 8-wide group)."""
  mask = np.ones(a.shape, bool)
  i, j, k = g
  width = a.shape[-1] // 2  # Two groups per row along the last axis.
  mask[i, j, k * width:(k + 1) * width] = False
  return a[mask]


@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_value_follows_policy_and_stays_in_its_group(spec, bad):
  x = _x(seed=1)
  x[1, 2, 8:] = np.abs(x[1, 2, 8:]) + 0.5  # All-positive target group.
  clean = quantize(jnp.asarray(x), spec)
  x_bad = x.copy()
  x_bad[1, 2, 11] = bad
  dirty = quantize(jnp.asarray(x_bad), spec)
  # Scale/zero of the group come from its finite values only.
  others = x[1, 2, 8:][np.arange(8) != 3]
  clean_wo = quantize(jnp.asarray(np.concatenate(
      [x[1, 2, :8], others, others[:1]])[None]), spec)
  np.testing.assert_array_equal(np.asarray(dirty.scale)[1, 2, 1],
                                np.asarray(clean_wo.scale)[0, 1])
  # Every other group: bit-identical leaves and outputs.
  for a, b in zip(_leaves(clean), _leaves(dirty)):
    if a.shape[-1] == SHAPE[-1] // 8:  # scale / zero: one entry per group.
      a, b = a.copy(), b.copy()
      a[1, 2, 1] = b[1, 2, 1] = 0
      np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
    else:  # data: bytes of group (1, 2, 1) are the second half of the row.
      np.testing.assert_array_equal(_groups_except(a, (1, 2, 1)),
                                    _groups_except(b, (1, 2, 1)))
  dq_clean = np.asarray(dequantize(clean))
  dq = np.asarray(dequantize(dirty))
  np.testing.assert_array_equal(_groups_except(dq, (1, 2, 1)),
                                _groups_except(dq_clean, (1, 2, 1)))
  assert np.all(np.isfinite(dq))
  got = dq[1, 2, 11]
  scale = np.float32(np.asarray(dirty.scale, np.float32)[1, 2, 1])
  if spec.is_float:
    fmax = float(jnp.finfo(spec.fp8_dtype).max)
    expected = {True: 0.0}.get(np.isnan(bad), np.sign(bad) * fmax * scale)
    assert got == np.float32(expected)
    return
  codes = np.asarray(unpack(dirty.data, spec.bits))[1, 2, 11]
  levels = 2 ** spec.bits - 1
  if spec.scheme != "asymmetric":
    # +Inf -> the largest value: code `levels` for a positive scale, code 0
    # for a negative one (full-level symmetric; here m > 0, so scale < 0).
    top, bottom = (levels, 0) if scale > 0 else (0, levels)
    if spec.scheme == "symmetric":
      assert scale < 0
    expected_code = {np.inf: top, -np.inf: bottom}.get(
        bad, 2 ** (spec.bits - 1))
    assert codes == expected_code
    if np.isnan(bad):
      assert got == 0.0
  else:
    # All finite values positive: 0.0 is below the range -> code 0 = zero.
    expected_code = {np.inf: levels}.get(bad, 0)
    assert codes == expected_code
    zero = np.float32(np.asarray(dirty.zero, np.float32)[1, 2, 1])
    if bad != np.inf:
      assert got == zero


@pytest.mark.parametrize("fmt", ["int4", "int8"])
def test_asymmetric_nan_maps_to_grid_point_nearest_zero(fmt):
  spec = QuantSpec(format=fmt, scheme="asymmetric", granularity="per_token",
                   scale_dtype="float32")
  x = np.asarray([[-1.3, 2.9, 0.7, np.nan, 0.1, -0.4, 1.1, 2.0]], np.float32)
  qa = quantize(jnp.asarray(x), spec)
  got = float(dequantize(qa)[0, 3])
  assert abs(got) <= float(qa.scale[0, 0]) / 2
  x0 = x.copy()
  x0[0, 3] = 0.0  # 0 is inside [min, max], so the stats do not change.
  assert got == float(dequantize(quantize(jnp.asarray(x0), spec))[0, 3])


def test_group_of_only_non_finite_values_is_finite():
  x = np.zeros((1, 16), np.float32)
  x[0, :8] = [np.nan, np.inf, -np.inf, np.nan, np.inf, np.inf, -np.inf, np.nan]
  for spec in SPECS:
    dq = np.asarray(dequantize(quantize(jnp.asarray(x), spec)))
    assert np.all(np.isfinite(dq)), spec
    assert np.all(dq[0, 8:] == 0.0)
