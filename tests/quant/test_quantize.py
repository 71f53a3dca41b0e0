"""Round-trip accuracy, exactness on the grid, zeros and clipping."""

from __future__ import annotations

import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kvq_jax.quant import QuantSpec, dequantize, quantize, unpack
from tests.quant._helpers import GROUPINGS, SHAPE, group_ids, grouping_id, per_element

INT_FORMATS = ["int8", "int5", "int4", "int3", "int2"]
SCHEMES = ["symmetric", "symmetric_narrow", "asymmetric"]


def _x(seed=0, shape=SHAPE, dtype=jnp.float32):
  x = jax.random.normal(jax.random.key(seed), shape, jnp.float32) * 3.0 + 0.5
  return x.astype(dtype)


def _spec(fmt, scheme, grouping, **kw):
  return QuantSpec(format=fmt, scheme=scheme, **grouping, **kw)


def _allowed_error(x, scale, spec):
  """|scale| / 2, or |scale| where full-level symmetric saturates at the top
  code (x / scale > 2^(b-1) - 1/2: opposite in sign to the group's m)."""
  bound = np.abs(scale) / 2
  if spec.scheme == "symmetric" and not spec.is_float:
    top = x / scale > 2 ** (spec.bits - 1) - 0.5
    bound = np.where(top, np.abs(scale), bound)
  return bound


def _check_bound(x, qa, spec):
  x = np.asarray(x, np.float64)
  dq = np.asarray(dequantize(qa, jnp.float32), np.float64)
  scale = per_element(qa.scale, spec, x.shape)
  err = np.abs(x - dq)
  slack = 1e-6 * (np.abs(x) + np.abs(scale))  # float32 arithmetic.
  assert np.all(err <= _allowed_error(x, scale, spec) + slack), float(
      np.max(err / np.abs(scale)))


@pytest.mark.parametrize("grouping", GROUPINGS, ids=grouping_id)
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("fmt", INT_FORMATS)
def test_unclipped_error_at_most_half_a_step(fmt, scheme, grouping):
  spec = _spec(fmt, scheme, grouping)
  x = _x()
  qa = quantize(x, spec)
  assert qa.data.dtype == jnp.uint8 and qa.scale.dtype == jnp.bfloat16
  assert (qa.zero is None) == (scheme != "asymmetric")
  assert qa.shape == x.shape and qa.dtype == "float32"
  _check_bound(x, qa, spec)


@pytest.mark.parametrize("scale_dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_bound_holds_for_every_scale_dtype(scheme, scale_dtype):
  spec = QuantSpec(format="int4", scheme=scheme, granularity="per_group",
                   group_size=8, scale_dtype=scale_dtype)
  x = _x(seed=1) * 100.0 - 30.0  # Shifted: asymmetric lo > 0 in some groups.
  qa = quantize(x, spec)
  assert qa.scale.dtype == jnp.dtype(scale_dtype)
  _check_bound(x, qa, spec)


def _on_grid(spec, seed):
  """x = integer codes * per-group power-of-two step (+ zero), extremes hit.

  Full-level symmetric steps have a random sign (negative scales)."""
  rng = np.random.default_rng(seed)
  ids = group_ids(spec, SHAPE)
  n = ids.max() + 1
  step = 2.0 ** rng.integers(-6, 4, size=n)
  half = 2 ** (spec.bits - 1)
  if spec.scheme == "symmetric":
    step *= rng.choice([-1.0, 1.0], size=n)
    q = rng.integers(-half, half, size=SHAPE).astype(np.float64)
    lo_code, hi_code, offset = -half, half - 1, np.zeros(n)
  elif spec.scheme == "symmetric_narrow":
    q = rng.integers(-half + 1, half, size=SHAPE).astype(np.float64)
    lo_code, hi_code, offset = -half + 1, half - 1, np.zeros(n)
  else:
    levels = 2 ** spec.bits - 1
    q = rng.integers(0, levels + 1, size=SHAPE).astype(np.float64)
    lo_code, hi_code = 0, levels
    offset = rng.integers(-40, 41, size=n) * 0.25
  flat_ids, flat_q = ids.ravel(), q.ravel()
  for g in range(n):  # Every group reaches both ends of its range.
    members = np.flatnonzero(flat_ids == g)
    flat_q[members[0]], flat_q[members[-1]] = lo_code, hi_code
  x = flat_q.reshape(SHAPE) * step[ids] + offset[ids]
  return x.astype(np.float32)


@pytest.mark.parametrize("grouping", GROUPINGS, ids=grouping_id)
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("fmt", INT_FORMATS)
def test_values_on_the_grid_come_back_exactly(fmt, scheme, grouping):
  spec = _spec(fmt, scheme, grouping)
  x = _on_grid(spec, seed=zlib.crc32(f"{fmt}-{scheme}".encode()) % 1000)
  np.testing.assert_array_equal(dequantize(quantize(jnp.asarray(x), spec)), x)


@pytest.mark.parametrize("grouping", GROUPINGS, ids=grouping_id)
@pytest.mark.parametrize("fmt, scheme", [
    (f, s) for f in INT_FORMATS for s in ("symmetric", "symmetric_narrow")
] + [("fp8_e4m3", "symmetric"), ("fp8_e5m2", "symmetric")])
def test_symmetric_zeros_stay_zero(fmt, scheme, grouping):
  spec = _spec(fmt, scheme, grouping)
  x = np.array(_x(seed=2), np.float32)
  mask = np.random.default_rng(3).random(SHAPE) < 0.3
  x[mask] = 0.0
  dq = np.asarray(dequantize(quantize(jnp.asarray(x), spec)))
  assert np.all(dq[mask] == 0.0)


@pytest.mark.parametrize("grouping", GROUPINGS[1:], ids=grouping_id)
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("fmt", ["int4", "int2", "fp8_e4m3"])
def test_all_zero_groups_are_exact_and_isolated(fmt, scheme, grouping):
  if fmt.startswith("fp8") and scheme != "symmetric":
    pytest.skip("fp8 is symmetric only")
  spec = _spec(fmt, scheme, grouping)
  x = np.array(_x(seed=4), np.float32)
  ids = group_ids(spec, SHAPE)
  zero_group = ids == ids.ravel()[-1]
  x[zero_group] = 0.0
  qa = quantize(jnp.asarray(x), spec)
  dq = np.asarray(dequantize(qa))
  assert np.all(dq[zero_group] == 0.0)
  tiny = np.float32(jnp.finfo(jnp.bfloat16).tiny)
  scale = per_element(qa.scale, spec, SHAPE)
  assert np.all(scale[zero_group] == tiny)  # +tiny, whatever the scheme.
  assert np.all(np.abs(scale[~zero_group]) > tiny)


def test_per_tensor_all_zero_is_exact():
  for scheme in SCHEMES:
    spec = QuantSpec(format="int4", scheme=scheme, granularity="per_tensor")
    qa = quantize(jnp.zeros(SHAPE, jnp.bfloat16), spec)
    np.testing.assert_array_equal(dequantize(qa), np.zeros(SHAPE))


def test_narrow_scale_is_rounded_up_in_bfloat16():
  # amax / 7 = 10 / 7 = 1.428..., bfloat16 neighbours 1.421875 and 1.4296875.
  x = jnp.asarray([[10.0, -3.0, 1.0, 0.0]], jnp.float32)
  qa = quantize(x, QuantSpec(format="int4", scheme="symmetric_narrow",
                             granularity="per_token"))
  assert float(qa.scale[0, 0]) == 1.4296875
  assert np.asarray(unpack(qa.data, 4))[0, 0] == 15  # 10 / 1.4297 = 6.99 -> 7.


def test_full_level_scale_magnitude_is_rounded_up_and_keeps_its_sign():
  # m = 10.1 (positive) -> scale = 10.1 / -8 = -1.2625; the bfloat16
  # neighbours of 1.2625 are 1.2578125 and 1.265625, so scale = -1.265625.
  # q = round(x / scale): 10.1 -> -7.98 -> -8; -3 -> 2.37 -> 2;
  # 1 -> -0.79 -> -1; 0 -> 0. Stored u = q + 8 = [0, 10, 7, 8].
  x = jnp.asarray([[10.1, -3.0, 1.0, 0.0]], jnp.float32)
  qa = quantize(x, QuantSpec(format="int4", granularity="per_token"))
  assert float(qa.scale[0, 0]) == -1.265625
  np.testing.assert_array_equal(unpack(qa.data, 4), [[0, 10, 7, 8]])
  np.testing.assert_array_equal(
      dequantize(qa), [[10.125, -2.53125, 1.265625, 0.0]])


def test_asymmetric_zero_rounded_down_scale_up():
  # lo = -1.01 (bf16 neighbours -1.0078125 and -1.015625), hi = 2.
  x = jnp.asarray([[-1.01, 2.0, 0.5, 1.0]], jnp.float32)
  spec = QuantSpec(format="int4", scheme="asymmetric", granularity="per_token")
  qa = quantize(x, spec)
  zero, scale = float(qa.zero[0, 0]), float(qa.scale[0, 0])
  assert zero == -1.015625
  assert scale >= (2.0 - zero) / 15 and np.float32(scale) == np.float32(
      jnp.asarray(scale, jnp.bfloat16))
  assert scale < (2.0 - zero) / 15 * (1 + 2 ** -7)


def _fp8_bound(x, dq, scale, fmt):
  rel = 2.0 ** -4 if fmt == "fp8_e4m3" else 2.0 ** -3
  # Half the subnormal spacing: e4m3fn 2^-9, e5m2 2^-16 (times the scale).
  absolute = (2.0 ** -10 if fmt == "fp8_e4m3" else 2.0 ** -17) * scale
  err = np.abs(x - dq)
  return np.all(err <= rel * np.abs(x) * (1 + 2 ** -10) + absolute)


@pytest.mark.parametrize("grouping", GROUPINGS, ids=grouping_id)
@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_relative_error(fmt, grouping):
  spec = _spec(fmt, "symmetric", grouping)
  # Wide dynamic range, so some values land in the subnormal range.
  x = np.asarray(_x(seed=5), np.float64) * 10.0 ** np.random.default_rng(6).uniform(
      -6, 2, size=SHAPE)
  x = x.astype(np.float32)
  qa = quantize(jnp.asarray(x), spec)
  assert qa.data.dtype == spec.fp8_dtype
  dq = np.asarray(dequantize(qa, jnp.float32), np.float64)
  scale = per_element(qa.scale, spec, SHAPE)
  assert _fp8_bound(x.astype(np.float64), dq, scale, fmt)
  fmax = float(jnp.finfo(spec.fp8_dtype).max)
  assert np.all(np.abs(np.asarray(qa.data, np.float32)) <= fmax)


def _first_of_largest_magnitude(v):
  return v[np.argmax(np.abs(v))]


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("fmt", INT_FORMATS + ["fp8_e4m3"])
def test_clipping_saturates_at_the_clipped_range(fmt, scheme):
  if fmt.startswith("fp8") and scheme != "symmetric":
    pytest.skip("fp8 is symmetric only")
  ratio = 0.5
  spec = QuantSpec(format=fmt, scheme=scheme, granularity="per_group",
                   group_size=8, clip_ratio=ratio, scale_dtype="float32")
  x = np.asarray(_x(seed=7), np.float32)
  qa = quantize(jnp.asarray(x), spec)
  x = x.astype(np.float64)
  dq = np.asarray(dequantize(qa), np.float64)
  ids = group_ids(spec, SHAPE)
  per_group = lambda f: np.vectorize(lambda i: f(x[ids == i]))(ids)
  scale = per_element(qa.scale, spec, SHAPE)
  tol = 1e-6 * (np.abs(x) + np.abs(dq) + np.abs(scale))  # float32 arithmetic.
  half = 2 ** (spec.bits - 1)
  if spec.is_float or scheme == "symmetric_narrow":
    hi = ratio * per_group(lambda v: np.max(np.abs(v)))
    lo = -hi
    top = float(jnp.finfo(spec.fp8_dtype).max) if spec.is_float else half - 1
    np.testing.assert_allclose(scale, hi / top, rtol=1e-6)
    top_value = top * scale
    bottom_value = -(top + (0 if spec.is_float else 1)) * scale
  elif scheme == "symmetric":  # Clipped signed max m -> code -half.
    m = ratio * per_group(_first_of_largest_magnitude)
    np.testing.assert_allclose(scale, m / -half, rtol=1e-6)
    hi, lo = np.abs(m), -np.abs(m)
    top_value = np.maximum(-half * scale, (half - 1) * scale)
    bottom_value = np.minimum(-half * scale, (half - 1) * scale)
  else:  # [min, max] shrinks around its centre c to c +- ratio * width / 2.
    c = (per_group(np.max) + per_group(np.min)) / 2
    w = (per_group(np.max) - per_group(np.min)) / 2
    lo, hi = c - ratio * w, c + ratio * w
    zero = per_element(qa.zero, spec, SHAPE)
    np.testing.assert_allclose(zero, lo, rtol=1e-6, atol=1e-6 * w.max())
    np.testing.assert_allclose(zero + (2 ** spec.bits - 1) * scale, hi,
                               rtol=1e-6, atol=1e-6 * w.max())
    top_value, bottom_value = zero + (2 ** spec.bits - 1) * scale, zero
  above, below = x > hi, x < lo
  assert above.any() and below.any()
  # Saturation: never beyond the extreme values, and clipped values sit on
  # them (symmetric_narrow: -qmax or -qmax-1 below the range).
  assert np.all(dq <= top_value + tol) and np.all(dq >= bottom_value - tol)
  np.testing.assert_allclose(dq[above], top_value[above], rtol=1e-6)
  if scheme == "symmetric_narrow":
    codes = np.asarray(unpack(qa.data, spec.bits))
    assert np.all(codes[below] <= 1)
  else:
    np.testing.assert_allclose(dq[below], bottom_value[below], rtol=1e-6)
  if not spec.is_float:
    inside = ~above & ~below
    allowed = _allowed_error(x, scale, spec) + tol
    assert np.all(np.abs(x - dq)[inside] <= allowed[inside])
