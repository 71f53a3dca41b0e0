"""Transform coding's codes: a bit width per component, packed as one
stream per vector (`kvq_jax.quant.component_codes`)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from kvq_jax.quant import (QuantSpec, bits_per_element, constant_arrays,
                           dequantize, pack, quantize)
from kvq_jax.quant.component_codes import (pack_widths, packed_bytes,
                                           unpack_widths)


def _spec(widths, books=()):
  return QuantSpec("int3", "static", "per_token", component_bits=widths,
                   width_levels=books)


def test_hand_packed_stream():
  # Widths (0, 3, 5), codes (-, 5, 17): bits 101 then 10001, LSB first:
  # byte 0 = 0b1000_1101.
  data = pack_widths(jnp.asarray([[0, 5, 17]], jnp.uint8), (0, 3, 5))
  assert np.asarray(data).tolist() == [[0x8D]]
  # 3 + 3 + 3 bits: the ninth bit opens a second byte, zero-padded.
  data = pack_widths(jnp.asarray([[7, 0, 1]], jnp.uint8), (3, 3, 3))
  assert np.asarray(data).tolist() == [[0b0100_0111, 0b0000_0000]]
  data = pack_widths(jnp.asarray([[7, 0, 7]], jnp.uint8), (3, 3, 3))
  assert np.asarray(data).tolist() == [[0b1100_0111, 0b0000_0001]]
  assert packed_bytes((3, 3, 3)) == 2 and packed_bytes((0, 0)) == 0


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 8])
def test_equal_widths_are_the_plain_packing(bits):
  """The stream layout is `packing`'s for every width it packs: int4's
  low nibble first, int3's 24-bit little-endian words."""
  rng = np.random.default_rng(bits)
  codes = rng.integers(0, 2 ** bits, size=(3, 16)).astype(np.uint8)
  np.testing.assert_array_equal(
      pack_widths(jnp.asarray(codes), (bits,) * 16),
      pack(jnp.asarray(codes), bits))


def test_random_widths_round_trip():
  rng = np.random.default_rng(0)
  widths = tuple(int(w) for w in rng.integers(0, 9, size=24))
  codes = np.stack([rng.integers(0, 2 ** w, size=50) for w in widths],
                   axis=-1).astype(np.uint8)
  data = pack_widths(jnp.asarray(codes), widths)
  assert data.shape == (50, -(-sum(widths) // 8))
  np.testing.assert_array_equal(unpack_widths(data, widths), codes)


def _oracle(x, widths, books):
  """Nearest level per component (ties to the lower), 0 at width 0."""
  out = np.zeros_like(x)
  for c, w in enumerate(widths):
    if not w:
      continue
    if w in books:
      levels = np.asarray(books[w], np.float64)
    else:
      levels = (np.arange(2 ** w) + 0.5) * 2.0 / 2 ** w - 1.0
    dist = np.abs(x[..., c, None] - levels)
    out[..., c] = levels[np.argmin(dist, axis=-1)]
  return out


def test_quantize_matches_the_numpy_oracle():
  rng = np.random.default_rng(1)
  widths = (8, 5, 4, 3, 2, 1, 0, 2)
  books = {2: (-1.5, -0.4, 0.4, 1.5), 5: tuple(np.linspace(-2, 2, 32))}
  spec = _spec(widths, tuple(books.items()))
  x = rng.normal(size=(2, 3, 5, 8)).astype(np.float32)
  qa = quantize(jnp.asarray(x), spec)
  assert qa.scale is None and qa.data.shape == (2, 3, 5, 4)  # 25 bits.
  got = np.asarray(dequantize(qa, jnp.float32))
  np.testing.assert_allclose(got, _oracle(x.astype(np.float64), widths, books),
                             rtol=0, atol=1e-6)
  # Width 0 stores nothing and reads back 0; width 8's uniform levels
  # are within 1/256 inside [-1, 1].
  assert np.all(got[..., 6] == 0)
  inside = np.abs(x[..., 0]) < 1
  assert np.all(np.abs(got[..., 0] - x[..., 0])[inside] <= 1 / 256 + 1e-6)


def test_bits_are_hand_counted():
  widths = (8, 7, 6, 5, 4, 3, 2, 1, 0, 0, 4, 4, 4, 4, 4, 4)  # 60 bits.
  spec = _spec(widths, ((2, (-1.0, -0.3, 0.3, 1.0)),))
  # ceil(60 / 8) = 8 bytes for 16 elements: 4.0 bits; outliers add
  # (16 + 8) / 16 per element.
  assert bits_per_element(spec, 16) == 4.0
  with_outlier = QuantSpec("int3", "static", "per_token", outliers=1,
                           component_bits=widths)
  assert bits_per_element(with_outlier, 16) == 4.0 + 24 / 16
  # Constants: the 16 widths (uint8) and the one codebook (4 float32).
  consts = constant_arrays(spec, 16)
  assert sum(a.nbytes for a in consts) == 16 + 16


@pytest.mark.parametrize("kwargs, match", [
    (dict(component_bits=(9, 1)), "0..8"),
    (dict(component_bits=(2, 1), scheme="symmetric",
          granularity="per_group", group_size=2), "static"),
    (dict(component_bits=(2, 1), width_levels=((3, tuple(range(8))),)),
     "width in use"),
    (dict(width_levels=((2, (0.0, 1.0, 2.0, 3.0)),)), "without"),
])
def test_invalid_component_specs(kwargs, match):
  base = dict(format="int3", scheme="static", granularity="per_token")
  with pytest.raises(ValueError, match=match):
    QuantSpec(**{**base, **kwargs})


def test_widths_must_cover_the_vector():
  with pytest.raises(ValueError, match="one width per element"):
    quantize(jnp.zeros((2, 8)), _spec((2,) * 4))
