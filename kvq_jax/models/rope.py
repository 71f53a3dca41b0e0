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

  def __call__(self, x_BxTxNxH: jax.Array, positions_BxT: jax.Array) -> jax.Array:
    """Rotates x at the given absolute positions; returns x's dtype."""
    half = self.rotary_dim // 2
    angles_BxTx1xR = self.angles(positions_BxT)[:, :, None, :]
    cos, sin = jnp.cos(angles_BxTx1xR), jnp.sin(angles_BxTx1xR)
    x = x_BxTxNxH.astype(jnp.float32)
    x1, x2 = x[..., :half], x[..., half:self.rotary_dim]
    rotated = jnp.concatenate(
        [x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., self.rotary_dim:]],
        axis=-1)
    return rotated.astype(x_BxTxNxH.dtype)
