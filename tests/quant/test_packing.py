"""Bit-exact packing layout and round trips."""

from __future__ import annotations

import hypothesis
from hypothesis import strategies as st
import jax.numpy as jnp
import numpy as np
import pytest

from kvq_jax.quant import QuantSpec, dequantize, pack, quantize, unpack


def _u8(values):
  return jnp.asarray(np.asarray(values, np.uint8))


def test_int4_nibble_order():
  np.testing.assert_array_equal(pack(_u8([1, 2]), 4), [0x21])
  np.testing.assert_array_equal(pack(_u8([0xF, 0x0, 0x0, 0xF]), 4), [0x0F, 0xF0])
  np.testing.assert_array_equal(unpack(_u8([0x21, 0xA5]), 4), [1, 2, 5, 0xA])


def test_int2_order():
  np.testing.assert_array_equal(pack(_u8([0, 1, 2, 3]), 2), [0xE4])
  np.testing.assert_array_equal(pack(_u8([3, 0, 0, 0, 0, 0, 0, 3]), 2), [0x03, 0xC0])
  np.testing.assert_array_equal(unpack(_u8([0xE4]), 2), [0, 1, 2, 3])


def test_int3_order():
  # Element j of 8 at bits 3j..3j+2 of the little-endian 24-bit word.
  codes = [1, 2, 3, 4, 5, 6, 7, 0]
  word = sum(c << (3 * j) for j, c in enumerate(codes))
  expected = [word & 0xFF, (word >> 8) & 0xFF, (word >> 16) & 0xFF]
  np.testing.assert_array_equal(pack(_u8(codes), 3), expected)
  np.testing.assert_array_equal(unpack(_u8(expected), 3), codes)
  np.testing.assert_array_equal(pack(_u8([7] * 8), 3), [0xFF] * 3)


def test_int8_is_identity():
  np.testing.assert_array_equal(pack(_u8([0, 128, 255]), 8), [0, 128, 255])
  np.testing.assert_array_equal(unpack(_u8([0, 128, 255]), 8), [0, 128, 255])


def test_symmetric_int4_edges_are_offset_codes():
  spec = QuantSpec(format="int4", granularity="per_token", clip_ratio=0.5,
                   scale_dtype="float32")
  # Clipped amax 14 * 0.5 = 7 -> scale exactly 1: q = -8, +7 (saturated), 0, 1.
  x = jnp.asarray([[-8.0, 14.0, 0.0, 1.0]], jnp.float32)
  qa = quantize(x, spec)
  assert float(qa.scale[0, 0]) == 1.0
  np.testing.assert_array_equal(qa.data, [[0xF0, 0x98]])
  np.testing.assert_array_equal(unpack(qa.data, 4), [[0x0, 0xF, 0x8, 0x9]])
  np.testing.assert_array_equal(dequantize(qa), [[-8.0, 7.0, 0.0, 1.0]])


def test_asymmetric_int4_edges_are_raw_codes():
  spec = QuantSpec(format="int4", scheme="asymmetric", granularity="per_token",
                   scale_dtype="float32")
  x = jnp.asarray([[0.0, 15.0, 1.0, 14.0]], jnp.float32)
  qa = quantize(x, spec)
  assert float(qa.scale[0, 0]) == 1.0 and float(qa.zero[0, 0]) == 0.0
  np.testing.assert_array_equal(unpack(qa.data, 4), [[0, 15, 1, 14]])
  np.testing.assert_array_equal(qa.data, [[0xF0, 0xE1]])


@pytest.mark.parametrize("fmt", ["int8", "int4", "int3", "int2"])
def test_all_zero_symmetric_packs_to_offset_and_back(fmt):
  spec = QuantSpec(format=fmt, granularity="per_group", group_size=8)
  qa = quantize(jnp.zeros((3, 5, 7, 8), jnp.bfloat16), spec)
  assert qa.data.shape == (3, 5, 7, 8 * spec.bits // 8)
  codes = unpack(qa.data, spec.bits)
  np.testing.assert_array_equal(codes, np.full((3, 5, 7, 8), 2 ** (spec.bits - 1)))
  np.testing.assert_array_equal(dequantize(qa), np.zeros((3, 5, 7, 8)))


@pytest.mark.parametrize("bits", [8, 4, 3, 2])
def test_odd_leading_shape_matches_reference(bits):
  rng = np.random.default_rng(bits)
  codes = rng.integers(0, 2 ** bits, size=(3, 5, 7, 8), dtype=np.uint8)
  packed = np.asarray(pack(jnp.asarray(codes), bits))
  # Reference: per row, concatenate codes LSB-first into one big integer.
  flat = codes.reshape(-1, 8)
  for row_codes, row_bytes in zip(flat, packed.reshape(flat.shape[0], -1)):
    word = sum(int(c) << (bits * j) for j, c in enumerate(row_codes))
    assert list(row_bytes) == [(word >> (8 * b)) & 0xFF for b in range(bits)]
  np.testing.assert_array_equal(unpack(jnp.asarray(packed), bits), codes)


@hypothesis.settings(max_examples=25, deadline=None)
@hypothesis.given(
    bits=st.sampled_from([8, 4, 3, 2]),
    lead=st.lists(st.integers(1, 4), min_size=0, max_size=3),
    blocks=st.integers(1, 5),
    seed=st.integers(0, 2 ** 31 - 1))
def test_round_trip_random_codes(bits, lead, blocks, seed):
  block = 8 if bits == 3 else 8 // bits
  shape = tuple(lead) + (blocks * block,)
  codes = np.random.default_rng(seed).integers(0, 2 ** bits, size=shape,
                                               dtype=np.uint8)
  packed = pack(jnp.asarray(codes), bits)
  assert packed.dtype == jnp.uint8
  assert packed.shape == tuple(lead) + (blocks * block * bits // 8,)
  np.testing.assert_array_equal(unpack(packed, bits), codes)


def test_bad_bits_and_lengths_raise():
  with pytest.raises(ValueError, match=r"bits=5"):
    pack(_u8([1, 2]), 5)
  with pytest.raises(ValueError, match=r"length 3.*multiple of 2"):
    pack(_u8([1, 2, 3]), 4)
  with pytest.raises(ValueError, match=r"length 4.*multiple of 3"):
    unpack(_u8([1, 2, 3, 4]), 3)
