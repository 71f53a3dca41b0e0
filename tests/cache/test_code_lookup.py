"""`cache.code_lookup`: attention read from vector codes, against the
dequantized block and a hand-built case."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from kvq_jax.cache.attention import planar_block_attention
from kvq_jax.cache.code_lookup import (lookup_block_attention, lookup_scores,
                                       lookup_values)
from kvq_jax.quant import QuantizedArray, QuantSpec, dequantize, quantize
from kvq_jax.quant import vector_codebook

B, K, G, T, L, H = 2, 3, 2, 3, 16, 64


def _inputs(seed=0):
  rng = np.random.default_rng(seed)
  k = jnp.asarray(rng.normal(size=(B, K, L, H)), jnp.float32)
  v = jnp.asarray(rng.normal(size=(B, K, L, H)), jnp.float32)
  q = jnp.asarray(rng.normal(size=(B, K, G, T, H)), jnp.float32) / 8
  mask = jnp.asarray(rng.random((B, T, L)) < 0.7)
  return q, k, v, mask


@pytest.mark.parametrize("bits,group", [(1, None), (2, None), (4, 32)])
def test_same_state_as_the_dequantized_block(bits, group):
  spec = (QuantSpec(f"int{bits}", "vector", "per_group", group) if group
          else QuantSpec(f"int{bits}", "vector", "per_token"))
  q, k, v, mask = _inputs(bits)
  kq, vq = quantize(k, spec), quantize(v, spec)
  want = planar_block_attention(q, (dequantize(kq, jnp.float32),),
                                (dequantize(vq, jnp.float32),), mask)
  for got in (lookup_block_attention(q, kq, vq, mask),
              lookup_block_attention(q, (dequantize(kq, jnp.float32),), vq,
                                     mask),
              lookup_block_attention(q, kq, (dequantize(vq, jnp.float32),),
                                     mask)):
    for a, b in zip(want, got):
      np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5,
                                 atol=1e-5)


def test_hand_built_codes():
  """One kv head, one query, head_dim 4 (int2_vq: one index per row), two
  slots with indices 3 and 3 and scales 2 and 0.5, then 3 and 7."""
  spec = QuantSpec("int2", "vector", "per_token")
  table = vector_codebook.centroids(2)
  q = jnp.asarray([1.0, -2.0, 0.5, 3.0]).reshape(1, 1, 1, 1, 4)
  scale = jnp.asarray([2.0, 0.5], jnp.float32).reshape(1, 1, 2, 1)
  for codes in ([3, 3], [3, 7]):
    store = QuantizedArray(
        data=jnp.asarray(codes, jnp.uint8).reshape(1, 1, 2, 1), scale=scale,
        zero=None, spec=spec, last_dim=4, dtype="float32")
    rows = np.asarray(scale).reshape(2, 1) * table[codes]
    np.testing.assert_allclose(
        np.asarray(lookup_scores(q, store)).ravel(),
        rows @ np.asarray(q).ravel(), rtol=1e-6)
    p = jnp.asarray([0.25, 0.75]).reshape(1, 1, 1, 1, 2)
    np.testing.assert_allclose(
        np.asarray(lookup_values(p, store, jnp.zeros((1, 1, 2), bool))).ravel(),
        np.asarray([0.25, 0.75]) @ rows, rtol=1e-6)


def test_a_non_finite_value_scale_gives_nan_only_to_queries_that_see_it():
  spec = QuantSpec("int2", "vector", "per_token")
  q, k, v, mask = _inputs(5)
  vq = quantize(v, spec)
  vq = QuantizedArray(data=vq.data, scale=vq.scale.at[0, 1, 4].set(jnp.inf),
                      zero=None, spec=spec, last_dim=H, dtype=vq.dtype)
  mask = mask.at[0, 0, 4].set(False).at[0, 1, 4].set(True)
  _, _, acc = lookup_block_attention(q, (k,), vq, mask)
  acc = np.asarray(acc)
  assert np.isnan(acc[0, 1, :, 1]).all()      # Sees slot 4.
  assert np.isfinite(acc[0, 1, :, 0]).all()   # Does not.
  assert np.isfinite(acc[1]).all() and np.isfinite(acc[0, 0]).all()
