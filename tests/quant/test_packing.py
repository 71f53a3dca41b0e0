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


def test_int5_order():
  # Element j of 8 at bits 5j..5j+4 of the little-endian 40-bit word, by
  # hand for codes [1, 2, 3, 4, 5, 6, 7, 31]:
  #   byte 0 = bits 0-7   = c0 | c1 << 5 (low 3 bits of 2)   = 0x01 | 0x40 = 0x41
  #   byte 1 = bits 8-15  = c1 >> 3 | c2 << 2 | c3 << 7 (bit 0 of 4)
  #          = 0 | 0x0C | 0                                   = 0x0C
  #   byte 2 = bits 16-23 = c3 >> 1 | c4 << 4 (low 4 bits of 5)
  #          = 0x02 | 0x50                                    = 0x52
  #   byte 3 = bits 24-31 = c4 >> 4 | c5 << 1 | c6 << 6 (low 2 bits of 7)
  #          = 0 | 0x0C | 0xC0                                = 0xCC
  #   byte 4 = bits 32-39 = c6 >> 2 | c7 << 3                 = 0x01 | 0xF8 = 0xF9
  codes = [1, 2, 3, 4, 5, 6, 7, 31]
  expected = [0x41, 0x0C, 0x52, 0xCC, 0xF9]
  np.testing.assert_array_equal(pack(_u8(codes), 5), expected)
  np.testing.assert_array_equal(unpack(_u8(expected), 5), codes)
  np.testing.assert_array_equal(pack(_u8([31] * 8), 5), [0xFF] * 5)
  np.testing.assert_array_equal(pack(_u8([31] + [0] * 7), 5),
                                [0x1F, 0, 0, 0, 0])
  np.testing.assert_array_equal(pack(_u8([0] * 7 + [31]), 5),
                                [0, 0, 0, 0, 0xF8])


def test_int8_is_identity():
  np.testing.assert_array_equal(pack(_u8([0, 128, 255]), 8), [0, 128, 255])
  np.testing.assert_array_equal(unpack(_u8([0, 128, 255]), 8), [0, 128, 255])


def test_symmetric_int4_edges_are_offset_codes():
  spec = QuantSpec(format="int4", granularity="per_token", clip_ratio=0.5,
                   scale_dtype="float32")
  # Clipped signed max -16 * 0.5 = -8 -> scale -8 / -8 = 1: q = -16 -> -8
  # (saturated), 8 -> 7 (saturated), 0, 2; stored u = q + 8.
  x = jnp.asarray([[-16.0, 8.0, 0.0, 2.0]], jnp.float32)
  qa = quantize(x, spec)
  assert float(qa.scale[0, 0]) == 1.0
  np.testing.assert_array_equal(unpack(qa.data, 4), [[0x0, 0xF, 0x8, 0xA]])
  np.testing.assert_array_equal(qa.data, [[0xF0, 0xA8]])
  np.testing.assert_array_equal(dequantize(qa), [[-8.0, 7.0, 0.0, 2.0]])


@pytest.mark.parametrize("x, scale, codes, packed, back", [
    # m = -1 (negative) -> scale = -1 / -8 = 0.125; q = x / 0.125 =
    # [-8, 4, 2, 0]; u = q + 8 = [0, 12, 10, 8]; every value comes back.
    ([-1.0, 0.5, 0.25, 0.0], 0.125, [0, 12, 10, 8], [0xC0, 0x8A],
     [-1.0, 0.5, 0.25, 0.0]),
    # m = +1 -> scale = 1 / -8 = -0.125 (signed); q = [-8, 4, -2, 0].
    ([1.0, -0.5, 0.25, 0.0], -0.125, [0, 12, 6, 8], [0xC0, 0x86],
     [1.0, -0.5, 0.25, 0.0]),
    # Tie |1| = |-1|: the first one sets m = 1 -> scale -0.125; -1 / -0.125 =
    # 8 saturates at q = 7 -> -0.875, the one value with error |scale|.
    ([1.0, -1.0, 0.5, 0.0], -0.125, [0, 15, 4, 8], [0xF0, 0x84],
     [1.0, -0.875, 0.5, 0.0]),
    # The other order: m = -1 -> scale 0.125, and +1 saturates at 0.875.
    ([-1.0, 1.0, 0.5, 0.0], 0.125, [0, 15, 12, 8], [0xF0, 0x8C],
     [-1.0, 0.875, 0.5, 0.0]),
])
def test_symmetric_int4_uses_all_sixteen_codes(x, scale, codes, packed, back):
  spec = QuantSpec(format="int4", granularity="per_token",
                   scale_dtype="float32")
  qa = quantize(jnp.asarray([x], jnp.float32), spec)
  assert float(qa.scale[0, 0]) == scale
  np.testing.assert_array_equal(unpack(qa.data, 4), [codes])
  np.testing.assert_array_equal(qa.data, [packed])
  np.testing.assert_array_equal(dequantize(qa), [back])


def test_symmetric_narrow_int4_keeps_fifteen_codes():
  # amax = 1 -> scale = float32(1 / 7) = 0.14285715 (just above 1/7);
  # q = round(x / scale) = [-7, 3, 2, 0] (0.5 / scale = 3.4999998 -> 3,
  # 0.25 / scale = 1.7499999 -> 2); u = q + 8 = [1, 11, 10, 8].
  spec = QuantSpec(format="int4", scheme="symmetric_narrow",
                   granularity="per_token", scale_dtype="float32")
  qa = quantize(jnp.asarray([[-1.0, 0.5, 0.25, 0.0]], jnp.float32), spec)
  assert float(qa.scale[0, 0]) == float(np.float32(1.0) / np.float32(7.0))
  np.testing.assert_array_equal(unpack(qa.data, 4), [[1, 11, 10, 8]])
  np.testing.assert_array_equal(qa.data, [[0xB1, 0x8A]])


def test_asymmetric_int4_edges_are_raw_codes():
  spec = QuantSpec(format="int4", scheme="asymmetric", granularity="per_token",
                   scale_dtype="float32")
  x = jnp.asarray([[0.0, 15.0, 1.0, 14.0]], jnp.float32)
  qa = quantize(x, spec)
  assert float(qa.scale[0, 0]) == 1.0 and float(qa.zero[0, 0]) == 0.0
  np.testing.assert_array_equal(unpack(qa.data, 4), [[0, 15, 1, 14]])
  np.testing.assert_array_equal(qa.data, [[0xF0, 0xE1]])


@pytest.mark.parametrize("scheme", ["symmetric", "symmetric_narrow"])
@pytest.mark.parametrize("fmt", ["int8", "int5", "int4", "int3", "int2"])
def test_all_zero_symmetric_packs_to_offset_and_back(fmt, scheme):
  spec = QuantSpec(format=fmt, scheme=scheme, granularity="per_group",
                   group_size=8)
  qa = quantize(jnp.zeros((3, 5, 7, 8), jnp.bfloat16), spec)
  assert qa.data.shape == (3, 5, 7, 8 * spec.bits // 8)
  codes = unpack(qa.data, spec.bits)
  np.testing.assert_array_equal(codes, np.full((3, 5, 7, 8), 2 ** (spec.bits - 1)))
  np.testing.assert_array_equal(dequantize(qa), np.zeros((3, 5, 7, 8)))


@pytest.mark.parametrize("bits", [8, 5, 4, 3, 2])
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
    bits=st.sampled_from([8, 5, 4, 3, 2]),
    lead=st.lists(st.integers(1, 4), min_size=0, max_size=3),
    blocks=st.integers(1, 5),
    seed=st.integers(0, 2 ** 31 - 1))
def test_round_trip_random_codes(bits, lead, blocks, seed):
  block = 8 if bits in (3, 5) else 8 // bits
  shape = tuple(lead) + (blocks * block,)
  codes = np.random.default_rng(seed).integers(0, 2 ** bits, size=shape,
                                               dtype=np.uint8)
  packed = pack(jnp.asarray(codes), bits)
  assert packed.dtype == jnp.uint8
  assert packed.shape == tuple(lead) + (blocks * block * bits // 8,)
  np.testing.assert_array_equal(unpack(packed, bits), codes)


def test_bad_bits_and_lengths_raise():
  with pytest.raises(ValueError, match=r"bits=6.*allowed: 8, 5, 4, 3, 2"):
    pack(_u8([1, 2]), 6)
  with pytest.raises(ValueError, match=r"length 3.*multiple of 2"):
    pack(_u8([1, 2, 3]), 4)
  with pytest.raises(ValueError, match=r"length 4.*multiple of 3"):
    unpack(_u8([1, 2, 3, 4]), 3)
  with pytest.raises(ValueError, match=r"length 4.*multiple of 8"):
    pack(_u8([1, 2, 3, 4]), 5)
  with pytest.raises(ValueError, match=r"length 4.*multiple of 5"):
    unpack(_u8([1, 2, 3, 4]), 5)
