"""Orthonormal (randomised) Hadamard rotation along head_dim.

H = Sylvester Hadamard / sqrt(n): symmetric and orthogonal (H @ H = I). The
randomised rotation R = D H first flips the signs of the coordinates by a
fixed random diagonal D (+-1, drawn from `key`), then applies H:

    rotate(x)   = (x * d) @ H        (x R)
    unrotate(y) = (y @ H) * d        (y R^T, so unrotate(rotate(x)) = x)

With `key` None, d = 1 and R = H (its own inverse), the plain rotation. A
rotation applied before quantization is undone at read time: for keys the
query is rotated instead (q.k = (qR).(kR)); for values the attention output
is rotated back ((P vR) R^T = P v). The random signs make every rotated
coordinate of a unit vector distributed like a coordinate of a uniform point
on the sphere whatever the input (outlier channels included), which is what
the Lloyd-Max codebooks of `kvq_jax.quant.codebook` are built for.

`key` is a (seed, layer) pair: each layer of a cache gets its own signs, the
same on every run (`sign_vector`); they are regenerated from the seed, not
stored.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

RotationKey = tuple[int, int] | None


@functools.lru_cache(maxsize=None)
def hadamard_matrix_np(n: int) -> np.ndarray:
  if n < 1 or n & (n - 1):
    raise ValueError(
        f"Hadamard rotation needs head_dim to be a power of two; got {n}.")
  h = np.ones((1, 1), np.float32)
  while h.shape[0] < n:
    h = np.block([[h, h], [h, -h]])
  return h / np.sqrt(np.float32(n))


@functools.lru_cache(maxsize=None)
def sign_vector(n: int, key: RotationKey) -> np.ndarray:
  """The diagonal d of D: n values +-1 (float32) from `key`; ones for None."""
  if key is None:
    return np.ones((n,), np.float32)
  seed, layer = key
  rng = np.random.default_rng(np.random.SeedSequence([seed, layer]))
  return np.where(rng.integers(0, 2, size=n) == 1, 1.0, -1.0).astype(
      np.float32)


def _matmul_h(x: jax.Array) -> jax.Array:
  h = jnp.asarray(hadamard_matrix_np(x.shape[-1]))
  return jnp.einsum("...h,hj->...j", x.astype(jnp.float32), h,
                    precision=jax.lax.Precision.HIGHEST)


def rotate(x: jax.Array, key: RotationKey = None) -> jax.Array:
  """x R along the last axis, in float32."""
  x = x.astype(jnp.float32)
  if key is not None:
    x = x * jnp.asarray(sign_vector(x.shape[-1], key))
  return _matmul_h(x)


def unrotate(y: jax.Array, key: RotationKey = None) -> jax.Array:
  """y R^T along the last axis, in float32 (the inverse of `rotate`)."""
  x = _matmul_h(y)
  if key is not None:
    x = x * jnp.asarray(sign_vector(x.shape[-1], key))
  return x
