"""Masked GQA attention against a naive repeat-kv numpy reference."""

from __future__ import annotations

import numpy as np
import jax.numpy as jnp
import pytest

from kvq_jax.cache.attention import (attention_mask,
                                     causal_blockwise_attention,
                                     gqa_attention)
from kvq_jax.cache.dense import DenseLayerCache, write_and_attend


def naive_attention(q, k, v, mask):
  """Repeats K/V to N heads, float64 softmax with -inf masking."""
  b, t, n, h = q.shape
  g = n // k.shape[2]
  k = np.repeat(k, g, axis=2).astype(np.float64)
  v = np.repeat(v, g, axis=2).astype(np.float64)
  scores = np.einsum("btnh,bsnh->bnts", q.astype(np.float64), k) / np.sqrt(h)
  scores = np.where(mask[:, None], scores, -np.inf)
  scores -= scores.max(-1, keepdims=True)
  p = np.exp(scores)
  p /= p.sum(-1, keepdims=True)
  return np.einsum("bnts,bsnh->btnh", p, v)


def test_attention_mask_values():
  mask = np.asarray(attention_mask(jnp.asarray([0, 2]), 2, 5))
  np.testing.assert_array_equal(mask[0], [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0]])
  np.testing.assert_array_equal(mask[1], [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0]])


@pytest.mark.parametrize("n,k", [(4, 2), (6, 1), (3, 3)])
def test_gqa_matches_repeat_kv_reference(n, k):
  rng = np.random.default_rng(0)
  b, t, s, h = 2, 3, 7, 8
  q = rng.standard_normal((b, t, n, h)).astype(np.float32)
  kk = rng.standard_normal((b, s, k, h)).astype(np.float32)
  v = rng.standard_normal((b, s, k, h)).astype(np.float32)
  length = np.array([1, 4])
  mask = np.asarray(attention_mask(jnp.asarray(length), t, s))
  out = gqa_attention(jnp.asarray(q), jnp.asarray(kk), jnp.asarray(v),
                      jnp.asarray(mask))
  assert out.shape == (b, t, n, h) and out.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(out),
                             naive_attention(q, kk, v, mask), atol=2e-5)


def test_masked_slots_have_no_influence():
  rng = np.random.default_rng(1)
  q = jnp.asarray(rng.standard_normal((1, 2, 2, 4)), jnp.float32)
  k = rng.standard_normal((1, 6, 1, 4)).astype(np.float32)
  v = rng.standard_normal((1, 6, 1, 4)).astype(np.float32)
  mask = attention_mask(jnp.asarray([1]), 2, 6)  # sees slots <= 1, <= 2
  base = gqa_attention(q, jnp.asarray(k), jnp.asarray(v), mask)
  k[:, 3:], v[:, 3:] = 1e4, np.nan  # garbage beyond the mask
  v = np.nan_to_num(v, nan=1e6)
  out = gqa_attention(q, jnp.asarray(k), jnp.asarray(v), mask)
  np.testing.assert_array_equal(np.asarray(out), np.asarray(base))


def test_gqa_rejects_non_multiple_heads():
  q = jnp.zeros((1, 1, 3, 4))
  kv = jnp.zeros((1, 2, 2, 4))
  with pytest.raises(ValueError, match="N=3"):
    gqa_attention(q, kv, kv, jnp.ones((1, 1, 2), bool))


@pytest.mark.parametrize("b,t,n,kv,h,s,block", [
    (2, 5, 6, 2, 8, 37, 8),   # S not a multiple of the block: overlap.
    (1, 1, 4, 2, 4, 20, 16),  # One decode query.
    (3, 7, 4, 4, 4, 64, 16),  # MHA, several blocks filled.
    (1, 3, 2, 1, 4, 6, 16),   # Block larger than the cache.
])
def test_blockwise_matches_one_shot_softmax(b, t, n, kv, h, s, block):
  rng = np.random.default_rng(s)
  q = jnp.asarray(rng.standard_normal((b, t, n, h)), jnp.float32)
  k = jnp.asarray(rng.standard_normal((b, s, kv, h)), jnp.float32)
  v = rng.standard_normal((b, s, kv, h)).astype(np.float32)
  length = jnp.asarray(rng.integers(0, s - t + 1, b), jnp.int32)
  mask = attention_mask(length, t, s)
  want = naive_attention(np.asarray(q), np.asarray(k), v, np.asarray(mask))
  got = causal_blockwise_attention(q, k, jnp.asarray(v), length, block)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
  # A NaN value row reaches exactly the queries that see it, as one-shot.
  v[0, 2, 0, 0] = np.nan
  one_shot = gqa_attention(q, k, jnp.asarray(v), mask)
  got = causal_blockwise_attention(q, k, jnp.asarray(v), length, block)
  np.testing.assert_array_equal(np.isnan(np.asarray(got)),
                                np.isnan(np.asarray(one_shot)))


def test_blockwise_ignores_slots_past_the_held_tokens():
  rng = np.random.default_rng(3)
  q = jnp.asarray(rng.standard_normal((1, 2, 2, 4)), jnp.float32)
  k = rng.standard_normal((1, 40, 1, 4)).astype(np.float32)
  v = rng.standard_normal((1, 40, 1, 4)).astype(np.float32)
  length = jnp.asarray([5])
  base = causal_blockwise_attention(q, jnp.asarray(k), jnp.asarray(v),
                                    length, 8)
  k[:, 7:], v[:, 7:] = 1e4, np.nan  # Never visible: slot 6 is the last seen.
  out = causal_blockwise_attention(q, jnp.asarray(k), jnp.asarray(v),
                                   length, 8)
  np.testing.assert_array_equal(np.asarray(out), np.asarray(base))


def test_dense_cache_beyond_one_block_reads_blockwise():
  """A dense cache longer than ATTENTION_BLOCK gives the one-shot result."""
  rng = np.random.default_rng(4)
  cache = DenseLayerCache.create(1, 1300, 2, 8)
  for t in (700, 1):  # A long chunk, then a decode step.
    q = jnp.asarray(rng.standard_normal((1, t, 4, 8)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((1, t, 2, 8)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((1, t, 2, 8)), jnp.float32)
    start = cache.length_B
    out, cache = write_and_attend(cache, q, k, v)
    want = gqa_attention(q, cache.k_BxSxKxH, cache.v_BxSxKxH,
                         attention_mask(start, t, 1300))
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=1e-5,
                               atol=1e-5)
