"""QuantSpec validation, derived properties and shape checks."""

from __future__ import annotations

import fractions

import jax.numpy as jnp
import pytest

from kvq_jax.quant import QuantSpec, quantize


@pytest.mark.parametrize("kwargs, match", [
    (dict(format="int6"), r"QuantSpec.format='int6' is not supported; allowed: int8, int5, int4"),
    (dict(scheme="affine"), r"QuantSpec.scheme='affine'.*allowed: symmetric, symmetric_narrow, asymmetric"),
    (dict(format="fp8_e4m3", scheme="symmetric_narrow"), r"QuantSpec.scheme='symmetric_narrow'.*fp8_e4m3.*symmetric"),
    (dict(rounding="llama"), r"QuantSpec.rounding='llama'.*allowed: kvq, ggml"),
    (dict(group_size=32, rounding="ggml"), r"rounding='ggml' needs scale_dtype='float16'.*'bfloat16'"),
    (dict(format="fp8_e4m3", group_size=32, scale_dtype="float16", rounding="ggml"), r"rounding='ggml'.*format='fp8_e4m3'.*allowed: int8, int5, int4, int3, int2"),
    (dict(group_size=32, scale_dtype="float16", clip_ratio=0.9, rounding="ggml"), r"rounding='ggml' needs clip_ratio=1.0.*0.9"),
    (dict(format="fp8_e4m3", scheme="asymmetric"), r"QuantSpec.scheme='asymmetric'.*fp8_e4m3.*symmetric"),
    (dict(format="fp8_e5m2", scheme="asymmetric"), r"QuantSpec.scheme='asymmetric'.*fp8_e5m2"),
    (dict(granularity="per_block"), r"QuantSpec.granularity='per_block'.*allowed: per_tensor"),
    (dict(scale_dtype="float64"), r"QuantSpec.scale_dtype='float64'.*allowed: float32, bfloat16, float16"),
    (dict(group_size=32, clip_ratio=0.0), r"QuantSpec.clip_ratio=0.0.*\(0, 1\]"),
    (dict(group_size=32, clip_ratio=1.5), r"QuantSpec.clip_ratio=1.5.*\(0, 1\]"),
    (dict(group_size=32, clip_ratio=-0.5), r"QuantSpec.clip_ratio=-0.5"),
    (dict(group_size=32, clip_ratio=float("nan")), r"QuantSpec.clip_ratio=nan"),
    (dict(granularity="per_group"), r"QuantSpec.group_size=None.*per_group"),
    (dict(granularity="per_group", group_size=0), r"QuantSpec.group_size=0"),
    (dict(granularity="per_group", group_size=8.0), r"QuantSpec.group_size=8.0"),
    (dict(granularity="per_token", group_size=32), r"QuantSpec.group_size=32.*per_token.*None"),
    (dict(granularity="per_tensor", group_size=32), r"QuantSpec.group_size=32.*per_tensor"),
    (dict(granularity="per_channel", group_size=1), r"QuantSpec.group_size=1.*per_channel"),
    (dict(granularity="per_tensor", axis=-1), r"QuantSpec.axis=-1.*per_tensor"),
    (dict(granularity="per_token", axis=2), r"QuantSpec.axis=2.*negative"),
])
def test_invalid_spec_raises_naming_the_field(kwargs, match):
  with pytest.raises(ValueError, match=match):
    QuantSpec(**kwargs)


@pytest.mark.parametrize("fmt, bits, is_float, cpb, block", [
    ("int8", 8, False, 1, 1), ("int5", 5, False, fractions.Fraction(8, 5), 8),
    ("int4", 4, False, 2, 2),
    ("int3", 3, False, fractions.Fraction(8, 3), 8), ("int2", 2, False, 4, 4),
    ("fp8_e4m3", 8, True, 1, 1), ("fp8_e5m2", 8, True, 1, 1),
])
def test_derived_properties(fmt, bits, is_float, cpb, block):
  spec = QuantSpec(format=fmt, granularity="per_token")
  assert (spec.bits, spec.is_float, spec.codes_per_byte, spec.pack_block) == (
      bits, is_float, cpb, block)
  assert spec.packed_dim(64) == 64 // spec.codes_per_byte == 64 * bits // 8


def test_group_axis_resolution_and_hashability():
  assert QuantSpec(granularity="per_token").group_axis == -1
  assert QuantSpec(granularity="per_group", group_size=32).group_axis == -1
  assert QuantSpec(granularity="per_channel").group_axis == -3
  assert QuantSpec(granularity="per_channel", axis=-2).group_axis == -2
  a = QuantSpec(group_size=32)
  assert a == QuantSpec(group_size=32) and hash(a) == hash(QuantSpec(group_size=32))
  assert a.format == "int4" and a.scheme == "symmetric"
  assert a.granularity == "per_group" and a.scale_dtype == "bfloat16"
  assert a.rounding == "kvq" and not a.has_zero
  assert not QuantSpec(scheme="symmetric_narrow", group_size=32).has_zero
  assert QuantSpec(scheme="asymmetric", group_size=32).has_zero
  with pytest.raises(AttributeError):
    a.format = "int8"  # Frozen.


@pytest.mark.parametrize("spec, shape, match", [
    (QuantSpec(group_size=48), (1, 4, 2, 64), r"QuantSpec.group_size=48 does not divide.*64"),
    (QuantSpec(granularity="per_channel"), (1, 1, 2, 64), r"per_channel.*length 1"),
    (QuantSpec(granularity="per_channel", group_size=4), (1, 6, 2, 64), r"QuantSpec.group_size=4 does not divide.*6"),
    (QuantSpec(format="int4", granularity="per_token"), (2, 7), r"int4.*length is 7.*multiple of 2"),
    (QuantSpec(format="int2", granularity="per_tensor"), (2, 6), r"int2.*multiple of 4"),
    (QuantSpec(format="int3", granularity="per_token"), (2, 12), r"int3.*multiple of 8"),
    (QuantSpec(format="int5", granularity="per_token"), (2, 12), r"int5.*multiple of 8"),
    (QuantSpec(granularity="per_token", axis=-5), (1, 4, 2, 64), r"QuantSpec.axis=-5 is out of range"),
    (QuantSpec(granularity="per_channel"), (4, 64), r"QuantSpec.axis=-3 is out of range"),
])
def test_invalid_shape_raises(spec, shape, match):
  with pytest.raises(ValueError, match=match):
    spec.validate_shape(shape)
  with pytest.raises(ValueError, match=match):
    quantize(jnp.zeros(shape, jnp.float32), spec)


def test_non_float_input_raises():
  with pytest.raises(ValueError, match=r"x.dtype=int32"):
    quantize(jnp.zeros((2, 8), jnp.int32), QuantSpec(granularity="per_token"))
