"""Rotary position embedding, Hugging Face ("rotate_half") convention.

The pair rotated together is (x[i], x[i + rotary_dim/2]) for i < rotary_dim/2,
as in Hugging Face's Llama. llama.cpp stores GGUF Q/K weights permuted for its
interleaved convention; `loaders/gguf.py` undoes that permutation so both
loaders feed this one implementation.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Rope:
  """Static (hashable) RoPE parameters; call it on [B, T, heads, head_dim]."""

  theta: float
  rotary_dim: int

  def inverse_frequencies(self) -> jax.Array:
    exponents = jnp.arange(0, self.rotary_dim, 2, dtype=jnp.float32)
    return 1.0 / (self.theta ** (exponents / self.rotary_dim))

  def angles(self, positions_BxT: jax.Array) -> jax.Array:
    """Rotation angles [B, T, rotary_dim/2] in float32."""
    return positions_BxT.astype(jnp.float32)[..., None] * self.inverse_frequencies()

  def cos_sin(self, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(cos, sin) of the angles at `positions` ([..., rotary_dim/2])."""
    angles = self.angles(positions)
    return jnp.cos(angles), jnp.sin(angles)

  def rotate(self, x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x [..., head_dim] rotated by the angles whose (cos, sin) are given,
    in float32: with cos, sin [..., n] (broadcast against x's leading
    axes; n = rotary_dim/2 from `cos_sin`) the pairs (x[i], x[i + n]) for
    i < n turn, elements from 2n on pass through.

    Rotations compose: rotate by position a then b is rotate by a + b, and
    the inverse is rotate by -a, so q . R(s + l) k = R(-s) q . R(l) k (the
    quantized caches read pre-RoPE keys block by block that way). A strided
    view x[..., j::P] (a bit plane, `quant.planes`) turns with the strided
    angles cos[..., j::P] when P divides n: its pairs stay inside it.
    """
    half = cos.shape[-1]
    x = x.astype(jnp.float32)
    x1, x2 = x[..., :half], x[..., half:2 * half]
    return jnp.concatenate(
        [x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., 2 * half:]],
        axis=-1)

  def __call__(self, x_BxTxNxH: jax.Array, positions_BxT: jax.Array) -> jax.Array:
    """Rotates x at the given absolute positions; returns x's dtype."""
    cos, sin = self.cos_sin(positions_BxT)
    return self.rotate(x_BxTxNxH, cos[:, :, None, :],
                       sin[:, :, None, :]).astype(x_BxTxNxH.dtype)
