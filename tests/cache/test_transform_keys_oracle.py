"""Transform-coded keys (issue 34) in the real cache against a numpy oracle.

Spec: K static, 3 bits per component on average, in a transform-mode key
affine (random orthogonal basis per kv head stored as int8 rows, shift,
per-component scale, a width per component from the error table, one
codebook per width), keys before RoPE; V full precision. Again with
`component_allocation='equal'` (every component 3 bits, the affine's
3-bit codebook: the basis without the allocation) and with no basis (the
components are the channels: the ca presets). The oracle
normalises each key in float64 with the stored basis, codes each
component to the nearest level of its width's codebook (0 at width 0),
reconstructs R^T (z' s) + shift, applies RoPE and attends in float64. It
shares no code with the cache: the affine's arrays are its only input.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kvq_jax.cache.quantized import QuantizedLayerCache
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.models.rope import Rope
from kvq_jax.quant import QuantSpec

from tests.cache.tiny_setup import transform_affine

B, K, G, H, T = 1, 2, 2, 16, 11
THETA = 10000.0
ROPE = Rope(theta=THETA, rotary_dim=H)
AFFINE = transform_affine(K, H, seed=3)
CHANNELS = transform_affine(K, H, seed=3, rotated=False)


def _spec(allocation="greedy", affine=AFFINE):
  return CacheSpec(k=QuantSpec("int3", "static", "per_token"), v=None,
                   key_rope="pre", key_affines=(affine,), block_size=8,
                   window_dtype="float32",
                   component_allocation=allocation).layer(0)


def _widths(spec):
  return spec.k.component_bits or (spec.k.bits,) * H


def _numpy_rope(x_TxKxH):
  half = H // 2
  inv = 1.0 / THETA ** (np.arange(0, H, 2, dtype=np.float64) / H)
  ang = np.arange(x_TxKxH.shape[0])[:, None, None] * inv
  x1, x2 = x_TxKxH[..., :half], x_TxKxH[..., half:]
  return np.concatenate([x1 * np.cos(ang) - x2 * np.sin(ang),
                         x2 * np.cos(ang) + x1 * np.sin(ang)], axis=-1)


def _oracle_keys(k_TxKxH, widths, affine):
  arrays = [np.asarray(a, np.float64) for a in affine.arrays()]
  shift, scale = arrays[:2]
  if len(arrays) == 4:  # The basis: int8 rows and a scale per row.
    rot = arrays[2] * arrays[3][..., None]  # [K, H, H], rows = components.
  else:
    rot = np.broadcast_to(np.eye(H), (K, H, H))
  z = np.einsum("kch,tkh->tkc", rot, k_TxKxH - shift) / scale
  books = dict(affine.codebooks)
  out = np.zeros_like(z)
  for c, w in enumerate(widths):
    if w:
      levels = np.asarray(books[w], np.float64)
      out[..., c] = levels[np.argmin(np.abs(z[..., c, None] - levels), -1)]
  return np.einsum("kch,tkc->tkh", rot, out * scale) + shift


def _oracle(q, k, v, widths=None, affine=AFFINE):
  k = k.astype(np.float64)
  keys = _numpy_rope(k if widths is None else _oracle_keys(k, widths, affine))
  out = np.zeros((T, K * G, H))
  for i in range(T):
    for head in range(K * G):
      s = keys[:i + 1, head // G] @ q[i, head].astype(np.float64) / np.sqrt(H)
      p = np.exp(s - s.max())
      out[i, head] = (p / p.sum()) @ v[:i + 1, head // G]
  return out


@jax.jit
def _attend(cache, q, k, v):
  positions = cache.length_B[:, None] + jnp.arange(q.shape[1])[None, :]
  return cache.attend(q, k, v, positions, ROPE)


def run_chunks(spec, q, k, v, chunks, capacity=16):
  """The layer cache fed (q, k, v) in `chunks` (1: a decode step): the
  attention outputs of batch row 0, [T, K * G, H]."""
  cache = QuantizedLayerCache.create(spec, B, capacity, K, H, jnp.float32)
  outs, pos = [], 0
  for size in chunks:
    out, cache = _attend(cache, *(jnp.asarray(x[:, pos:pos + size])
                                  for x in (q, k, v)))
    outs.append(np.asarray(out))
    pos += size
  return np.concatenate(outs, axis=1)[0]


def test_equal_allocation_is_one_codebook_for_every_component():
  spec = _spec("equal")
  assert spec.k.component_bits == () and spec.k.width_levels == ()
  assert spec.k.levels == tuple(dict(AFFINE.codebooks)[3])
  assert spec.key_affine is AFFINE  # The basis stays.
  with pytest.raises(ValueError, match="component_allocation='even'.*"
                     "allowed: greedy, equal"):
    CacheSpec(component_allocation="even")


@pytest.mark.parametrize("allocation, affine", [
    ("greedy", AFFINE), ("equal", AFFINE), ("greedy", CHANNELS)],
                         ids=["basis_widths", "basis_equal", "channel_widths"])
def test_decode_matches_the_numpy_oracle(allocation, affine):
  spec = _spec(allocation, affine)
  assert bool(spec.key_affine.rotation) == (affine is AFFINE)
  widths = _widths(spec)
  if allocation == "greedy":
    assert sum(widths) == 3 * H and len(set(widths)) > 3 and 0 in widths
  rng = np.random.default_rng(0)
  q = rng.normal(size=(B, T, K * G, H)).astype(np.float32)
  k = (rng.normal(size=(B, T, K, H)) * 2).astype(np.float32)
  v = rng.normal(size=(B, T, K, H)).astype(np.float32)
  want = _oracle(q[0], k[0], v[0], widths, affine)
  for chunks in ((T,), (1,) * T, (4, 1, 6)):
    got = run_chunks(spec, q, k, v, chunks)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4,
                               err_msg=f"chunks={chunks}")
  # The test has teeth: full-precision keys give another answer.
  fp = _oracle(q[0], k[0], v[0])
  assert np.abs(fp - want).max() > 1e-2
