"""Bit packing of unsigned integer codes along the last axis.

Codes are unsigned integers in [0, 2^bits) held in uint8. The byte layout
(little-endian within a byte, the contract every kernel reads):

* int8: one code per byte.
* int4: element 2i in the low nibble (bits 0-3) of byte i, element 2i+1 in the
  high nibble (bits 4-7). Codes [1, 2] -> byte 0x21.
* int2: element 4i+j in bits 2j..2j+1 of byte i. Codes [0, 1, 2, 3] -> 0xE4.
* int3: 8 codes in 3 bytes. Element 8i+j occupies bits 3j..3j+2 of the 24-bit
  little-endian word formed by bytes 3i (bits 0-7), 3i+1 (bits 8-15) and
  3i+2 (bits 16-23).
* int5: 8 codes in 5 bytes, likewise. Element 8i+j occupies bits 5j..5j+4 of
  the 40-bit little-endian word formed by bytes 5i..5i+4 (byte 5i+k holds
  bits 8k..8k+7). Codes [1, 2, 3, 4, 5, 6, 7, 31] -> bytes 0x41, 0x0C, 0x52,
  0xCC, 0xF9. (This is not ggml's q5 byte layout, which splits low nibbles
  and fifth bits; `quantize` matches ggml's values, not its bytes.)

Symmetric integer formats store q in [-2^(bits-1), 2^(bits-1) - 1] offset as
u = q + 2^(bits-1) (int4: -8 -> 0x0, 0 -> 0x8, +7 -> 0xF); asymmetric formats
store u in [0, 2^bits - 1] directly. That offset is applied by `quantize`,
not here: this module only moves bits.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

SUPPORTED_BITS = (8, 5, 4, 3, 2)


def _check_bits(bits: int) -> None:
  if bits not in SUPPORTED_BITS:
    raise ValueError(
        f"bits={bits!r} is not supported; allowed: "
        f"{', '.join(map(str, SUPPORTED_BITS))}.")


def _block(bits: int) -> int:
  return 8 // bits if 8 % bits == 0 else 8


def _overlaps(bits: int, k: int) -> list[tuple[int, int]]:
  """(j, shift) for each code j of 8 with bits inside byte k of the word.

  Code j sits at word bits bits*j.., so byte k gets `code << shift` (shift =
  bits*j - 8k; a right shift by -shift when negative).
  """
  return [(j, bits * j - 8 * k) for j in range(8)
          if bits * j < 8 * (k + 1) and bits * (j + 1) > 8 * k]


@partial(jax.jit, static_argnums=1)
def pack(codes_u8: jax.Array, bits: int) -> jax.Array:
  """Packs codes [..., n] (uint8, each < 2^bits) into bytes [..., n*bits/8].

  Bits above `bits` in a code are discarded. `n` must be a multiple of 8/bits
  (8 for int3 and int5).
  """
  _check_bits(bits)
  codes = jnp.asarray(codes_u8).astype(jnp.uint8)
  if bits == 8:
    return codes
  n = codes.shape[-1]
  block = _block(bits)
  if n % block:
    raise ValueError(
        f"pack: last axis length {n} (shape={codes.shape}) is not a multiple "
        f"of {block}, the number of {bits}-bit codes packed together.")
  lead = codes.shape[:-1]
  mask = (1 << bits) - 1
  if 8 % bits:  # int3, int5: 8 codes -> `bits` bytes.
    c = codes.reshape(lead + (n // 8, 8)).astype(jnp.uint32) & mask
    out = []
    for k in range(bits):  # Byte k holds bits 8k..8k+7 of the word.
      byte = jnp.zeros(c.shape[:-1], jnp.uint32)
      for j, shift in _overlaps(bits, k):
        byte |= c[..., j] << shift if shift >= 0 else c[..., j] >> -shift
      out.append(byte & 0xFF)
    return jnp.stack(out, axis=-1).astype(jnp.uint8).reshape(
        lead + (n * bits // 8,))
  c = codes.reshape(lead + (n // block, block)) & jnp.uint8(mask)
  shifts = (jnp.arange(block, dtype=jnp.uint8) * bits).astype(jnp.uint8)
  return jnp.sum(c << shifts, axis=-1, dtype=jnp.uint8)  # Disjoint bits.


@partial(jax.jit, static_argnums=1)
def unpack(packed_u8: jax.Array, bits: int) -> jax.Array:
  """Inverse of `pack`: bytes [..., m] -> codes [..., m*8/bits] (uint8)."""
  _check_bits(bits)
  packed = jnp.asarray(packed_u8).astype(jnp.uint8)
  if bits == 8:
    return packed
  m = packed.shape[-1]
  lead = packed.shape[:-1]
  mask = (1 << bits) - 1
  if 8 % bits:  # int3, int5: `bits` bytes -> 8 codes.
    if m % bits:
      raise ValueError(
          f"unpack: last axis length {m} (shape={packed.shape}) is not a "
          f"multiple of {bits}, the bytes holding 8 int{bits} codes.")
    b = packed.reshape(lead + (m // bits, bits)).astype(jnp.uint32)
    codes = [jnp.zeros(b.shape[:-1], jnp.uint32) for _ in range(8)]
    for k in range(bits):
      for j, shift in _overlaps(bits, k):
        codes[j] |= b[..., k] >> shift if shift >= 0 else b[..., k] << -shift
    out = jnp.stack(codes, axis=-1) & mask
    return out.astype(jnp.uint8).reshape(lead + (m * 8 // bits,))
  block = 8 // bits
  shifts = (jnp.arange(block, dtype=jnp.uint8) * bits).astype(jnp.uint8)
  codes = (packed[..., None] >> shifts) & jnp.uint8(mask)
  return codes.reshape(lead + (m * block,))
