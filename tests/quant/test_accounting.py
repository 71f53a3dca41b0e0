"""bits_per_element and nbytes."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

from kvq_jax.quant import QuantSpec, bits_per_element, nbytes, quantize


@pytest.mark.parametrize("spec, axis_len, expected", [
    (QuantSpec(format="int8", granularity="per_token"), 64, 8.25),
    (QuantSpec(format="int4", group_size=32), None, 4.5),
    (QuantSpec(format="int4", scheme="asymmetric", group_size=32), None, 5.0),
    (QuantSpec(format="int2", scheme="asymmetric", group_size=32), None, 3.0),
    (QuantSpec(format="int3", group_size=32, scale_dtype="float32"), None, 4.0),
    # llama.cpp's q8_0, q4_0, q4_1, q5_0, q5_1 (float16 scale, and minimum).
    (QuantSpec(format="int8", scheme="symmetric_narrow", group_size=32,
               scale_dtype="float16", rounding="ggml"), None, 8.5),
    (QuantSpec(format="int4", group_size=32, scale_dtype="float16",
               rounding="ggml"), None, 4.5),
    (QuantSpec(format="int4", scheme="asymmetric", group_size=32,
               scale_dtype="float16", rounding="ggml"), None, 5.0),
    (QuantSpec(format="int5", group_size=32, scale_dtype="float16",
               rounding="ggml"), None, 5.5),
    (QuantSpec(format="int5", scheme="asymmetric", group_size=32,
               scale_dtype="float16", rounding="ggml"), None, 6.0),
    (QuantSpec(format="fp8_e4m3", group_size=32), None, 8.5),
    (QuantSpec(format="int2", scheme="asymmetric", granularity="per_channel",
               group_size=32), None, 3.0),
    (QuantSpec(format="int4", granularity="per_channel"), 128, 4.125),
    (QuantSpec(format="int4", granularity="per_tensor"), None, 4.0),
    (QuantSpec(format="int4", granularity="per_tensor"), 1024, 4 + 16 / 1024),
])
def test_bits_per_element(spec, axis_len, expected):
  assert bits_per_element(spec, axis_len) == expected


@pytest.mark.parametrize("spec", [
    QuantSpec(format="int8", granularity="per_token"),
    QuantSpec(format="int4", granularity="per_channel"),
])
def test_bits_per_element_needs_axis_len(spec):
  with pytest.raises(ValueError, match=r"axis_len=None"):
    bits_per_element(spec)
  with pytest.raises(ValueError, match=r"axis_len=0"):
    bits_per_element(spec, 0)


@pytest.mark.parametrize("spec, axis_len", [
    (QuantSpec(format="int8", granularity="per_token"), 64),
    (QuantSpec(format="int4", group_size=32), None),
    (QuantSpec(format="int4", scheme="asymmetric", group_size=32), None),
    (QuantSpec(format="int3", scheme="asymmetric", group_size=16), None),
    (QuantSpec(format="int5", scheme="asymmetric", group_size=16), None),
    (QuantSpec(format="int5", group_size=32, scale_dtype="float16",
               rounding="ggml"), None),
    (QuantSpec(format="int2", scheme="asymmetric", group_size=32), None),
    (QuantSpec(format="fp8_e5m2", group_size=32, scale_dtype="float32"), None),
    (QuantSpec(format="int4", granularity="per_channel"), 128),
    (QuantSpec(format="int2", scheme="asymmetric", granularity="per_channel",
               group_size=32), None),
    (QuantSpec(format="int8", granularity="per_tensor"), 128 * 3 * 64),
])
def test_nbytes_matches_bits_per_element(spec, axis_len):
  qa = quantize(jnp.ones((1, 128, 3, 64), jnp.bfloat16), spec)
  assert nbytes(qa) == 128 * 3 * 64 * bits_per_element(spec, axis_len) / 8
