"""Orthonormal Hadamard rotation along head_dim.

H = Sylvester Hadamard / sqrt(n): symmetric and orthogonal (H @ H = I), so a
rotation applied before quantization is undone exactly by applying H again:
for keys the query is rotated instead (q.k = (qH).(kH)); for values the
attention output is rotated back ((P vH) H = P v).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np


@functools.lru_cache(maxsize=None)
def hadamard_matrix_np(n: int) -> np.ndarray:
  if n < 1 or n & (n - 1):
    raise ValueError(
        f"Hadamard rotation needs head_dim to be a power of two; got {n}.")
  h = np.ones((1, 1), np.float32)
  while h.shape[0] < n:
    h = np.block([[h, h], [h, -h]])
  return h / np.sqrt(np.float32(n))


def rotate(x: jax.Array) -> jax.Array:
  """x @ H along the last axis, in float32 (H is its own inverse)."""
  h = jnp.asarray(hadamard_matrix_np(x.shape[-1]))
  return jnp.einsum("...h,hj->...j", x.astype(jnp.float32), h,
                    precision=jax.lax.Precision.HIGHEST)
