"""Static codes with a bit width per component (transform coding, issue 34).

A spec with `component_bits` = (b_0, ..., b_{H-1}), each in 0..8, codes
element c of every vector (the last axis) with b_c bits and no scale, for
tensors already normalised into a calibrated basis (`cache.key_affine` in
transform mode: each component centred and divided by its calibration
standard deviation). Per component, with the levels of its width b
(`spec.width_levels`' calibrated codebook c, increasing, thresholds
t_j = (c_j + c_{j+1}) / 2; or, without one, the uniform mid-rise levels
over [-r, r], r = clip_ratio, as scheme static):

  b = 0:  no code; x' = 0 (the component's calibration mean)
  b > 0:  u = #{t_j < x} (NaN as 0.0, +-Inf the outer codes), x' = c[u]

Packing (the contract `unpack_widths` reads): the codes of one vector form
one little-endian bit stream of sum(b) bits, component 0 first, code bit j
of component c at stream bit o_c + j (o_c = b_0 + ... + b_{c-1}); stream
bit 8i + j is bit j of byte i; the stream is zero-padded to whole bytes,
ceil(sum(b) / 8) of them per vector. Widths (0, 3, 5): codes [-, 5, 17]
-> bits 101 10001 -> byte 0 = 0b10001101 = 0x8D.
"""

from __future__ import annotations

from functools import partial
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

_F32 = jnp.float32
MAX_WIDTH = 8


def packed_bytes(widths: Sequence[int]) -> int:
  """Bytes per vector: ceil(sum(widths) / 8)."""
  return -(-int(sum(widths)) // 8)


def _stream_positions(widths: Sequence[int]) -> np.ndarray:
  """For stream bit s, the flat index c * 8 + j of its (component, bit)."""
  return np.asarray([c * MAX_WIDTH + j for c, w in enumerate(widths)
                     for j in range(w)], np.int32)


@partial(jax.jit, static_argnums=1)
def pack_widths(codes_u8: jax.Array, widths: tuple[int, ...]) -> jax.Array:
  """codes [..., H] (uint8, code c < 2^widths[c]) -> bytes [..., nbytes]."""
  if codes_u8.shape[-1] != len(widths):
    raise ValueError(
        f"pack_widths: codes of {codes_u8.shape[-1]} components for "
        f"{len(widths)} widths; allowed: one width per component.")
  lead = codes_u8.shape[:-1]
  shifts = jnp.arange(MAX_WIDTH, dtype=jnp.uint8)
  bits = (codes_u8[..., None] >> shifts) & 1  # [..., H, 8]
  stream = bits.reshape(lead + (len(widths) * MAX_WIDTH,))[
      ..., _stream_positions(widths)]
  nbytes = packed_bytes(widths)
  pad = nbytes * 8 - stream.shape[-1]
  stream = jnp.pad(stream, [(0, 0)] * len(lead) + [(0, pad)])
  stream = stream.reshape(lead + (nbytes, 8))
  return jnp.sum(stream << shifts, axis=-1, dtype=jnp.uint8)


@partial(jax.jit, static_argnums=1)
def unpack_widths(data_u8: jax.Array, widths: tuple[int, ...]) -> jax.Array:
  """The inverse of `pack_widths`: bytes [..., nbytes] -> codes [..., H]."""
  nbytes = packed_bytes(widths)
  if data_u8.shape[-1] != nbytes:
    raise ValueError(
        f"unpack_widths: {data_u8.shape[-1]} bytes per vector for widths "
        f"summing to {sum(widths)} bits; allowed: {nbytes}.")
  lead = data_u8.shape[:-1]
  shifts = jnp.arange(MAX_WIDTH, dtype=jnp.uint8)
  stream = ((data_u8[..., None] >> shifts) & 1).reshape(lead + (nbytes * 8,))
  # Gather every (component, bit) from its stream position; bits a width
  # does not have read a zero appended past the stream.
  stream = jnp.concatenate(
      [stream, jnp.zeros(lead + (1,), jnp.uint8)], axis=-1)
  where = np.full(len(widths) * MAX_WIDTH, nbytes * 8, np.int32)
  where[_stream_positions(widths)] = np.arange(int(sum(widths)))
  bits = stream[..., where].reshape(lead + (len(widths), MAX_WIDTH))
  return jnp.sum(bits << shifts, axis=-1, dtype=jnp.uint8)


def _levels(width: int, width_levels: dict, clip_ratio: float) -> np.ndarray:
  if width in width_levels:
    return np.asarray(width_levels[width], np.float32)
  count = 2 ** width
  return ((np.arange(count, dtype=np.float32) + 0.5) * (2.0 / count) - 1.0
          ) * np.float32(clip_ratio)


def _groups(widths: Sequence[int]) -> dict[int, np.ndarray]:
  """Components of each width > 0."""
  out = {}
  for c, w in enumerate(widths):
    if w:
      out.setdefault(w, []).append(c)
  return {w: np.asarray(cs, np.int32) for w, cs in out.items()}


def component_codes(x_nan0: jax.Array, widths: Sequence[int],
                    width_levels: dict, clip_ratio: float) -> jax.Array:
  """uint8 codes [..., H] of x [..., H] (NaN already 0; module docstring)."""
  codes = jnp.zeros(x_nan0.shape, jnp.uint8)
  for w, idx in _groups(widths).items():
    c = _levels(w, width_levels, clip_ratio)
    t = jnp.asarray((c[1:] + c[:-1]) / 2)
    u = jnp.searchsorted(t, x_nan0[..., idx], side="left").astype(jnp.uint8)
    codes = codes.at[..., idx].set(u)
  return codes


def component_values(codes_u8: jax.Array, widths: Sequence[int],
                     width_levels: dict, clip_ratio: float) -> jax.Array:
  """float32 x' [..., H] of codes [..., H] (0 where a width is 0)."""
  out = jnp.zeros(codes_u8.shape, _F32)
  for w, idx in _groups(widths).items():
    c = jnp.asarray(_levels(w, width_levels, clip_ratio))
    out = out.at[..., idx].set(c[codes_u8[..., idx]])
  return out
