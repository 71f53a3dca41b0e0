"""Vector-quantized values (issue 34, method 3) in the real cache against a
numpy oracle.

Spec: K full precision, V `int2_vq` (one float32 least-squares scale per
head vector, one 8-bit index per 4 elements into the shipped 256 x 4
table), and again `int4_vq` (pairs) and `int1_vq` (octets). The oracle normalises every value
vector to norm sqrt(H) in float64, picks each group's nearest codeword,
takes the least-squares scale, and attends in float64 with RoPE'd keys. It
shares no code with the cache: the codebook table is its only input.

Every case runs with both reads of the codes (`code_read`): "dequantize"
(the block reconstructed, then attended) and "lookup"
(`kvq_jax/cache/code_lookup.py`: q . centroid tables and a histogram of
the weights over the centroids), and once with vector keys too (post-RoPE,
read by lookup).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from kvq_jax.cache.spec import CacheSpec
from kvq_jax.quant import QuantSpec, vector_codebook

# The same attention oracle (float64, RoPE'd full-precision keys when no
# key widths are given) and cache call as the transform-key test.
from tests.cache.test_transform_keys_oracle import (B, G, H, K, T,
                                                    _numpy_rope, _oracle,
                                                    run_chunks)


def _oracle_values(v_TxKxH, bits, scale_dtype=None):
  table = vector_codebook.centroids(bits).astype(np.float64)
  c = table.shape[1]
  v = v_TxKxH.astype(np.float64)
  y = v * np.sqrt(H) / np.linalg.norm(v, axis=-1, keepdims=True)
  groups = y.reshape(-1, c)
  dist = ((groups[:, None, :] - table[None]) ** 2).sum(-1)
  cu = table[dist.argmin(1)].reshape(v.shape)
  scale = (v * cu).sum(-1, keepdims=True) / (cu * cu).sum(-1, keepdims=True)
  if scale_dtype is not None:  # Stored in 8 bits, rounded to nearest.
    scale = scale.astype(np.float32).astype(
        getattr(ml_dtypes, scale_dtype)).astype(np.float64)
  return cu * scale


def _vq(bits, scale_dtype="float32"):
  return QuantSpec(f"int{bits}", "vector", "per_token",
                   scale_dtype=scale_dtype)


@pytest.mark.parametrize("code_read", ["dequantize", "lookup"])
@pytest.mark.parametrize("scale_dtype", ["float8_e4m3fn", "float8_e5m2"])
def test_eight_bit_scales_match_the_oracle(scale_dtype, code_read):
  """int2_vq with its scale stored in 8 bits (`_se4m3`, `_se5m2`): the
  oracle rounds its float64 least-squares scale through float32 to the
  nearest 8-bit value (ml_dtypes); the cache decodes that exactly."""
  spec = CacheSpec(k=None, v=_vq(2, scale_dtype), block_size=8,
                   window_dtype="float32", code_read=code_read).layer(0)
  rng = np.random.default_rng(7)
  q = rng.normal(size=(B, T, K * G, H)).astype(np.float32)
  k = rng.normal(size=(B, T, K, H)).astype(np.float32)
  v = rng.normal(size=(B, T, K, H)).astype(np.float32)
  want = _oracle(q[0], k[0], _oracle_values(v[0], 2, scale_dtype))
  for chunks in ((T,), (1,) * T, (4, 1, 6)):
    got = run_chunks(spec, q, k, v, chunks)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4,
                               err_msg=f"chunks={chunks}")
  # The rounding of the scale is visible: float32 scales answer otherwise.
  assert np.abs(_oracle(q[0], k[0], _oracle_values(v[0], 2)) - want).max(
      ) > 1e-4


@pytest.mark.parametrize("code_read", ["dequantize", "lookup"])
@pytest.mark.parametrize("bits", [1, 2, 4])
def test_decode_matches_the_numpy_oracle(bits, code_read):
  spec = CacheSpec(k=None, v=_vq(bits), block_size=8, window_dtype="float32",
                   code_read=code_read).layer(0)
  rng = np.random.default_rng(bits)
  q = rng.normal(size=(B, T, K * G, H)).astype(np.float32)
  k = rng.normal(size=(B, T, K, H)).astype(np.float32)
  v = rng.normal(size=(B, T, K, H)).astype(np.float32)
  v_hat = _oracle_values(v[0], bits)
  want = _oracle(q[0], k[0], v_hat)
  for chunks in ((T,), (1,) * T, (4, 1, 6)):
    got = run_chunks(spec, q, k, v, chunks)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4,
                               err_msg=f"chunks={chunks}")
  # The test has teeth: full-precision values give another answer.
  assert np.abs(_oracle(q[0], k[0], v[0]) - want).max() > 1e-2


@pytest.mark.parametrize("bits", [2, 4])
def test_lookup_of_vector_keys_and_values_matches_the_oracle(bits):
  """Post-RoPE int{2,4}_vq keys and values, both read by lookup: the oracle
  codes the RoPE'd keys as it codes values, then attends with them as
  stored (no second rotation)."""
  spec = CacheSpec(k=_vq(bits), v=_vq(bits), block_size=8,
                   window_dtype="float32", code_read="lookup").layer(0)
  assert spec.looks_up("k") and spec.looks_up("v")
  rng = np.random.default_rng(10 + bits)
  q = rng.normal(size=(B, T, K * G, H)).astype(np.float32)
  k = rng.normal(size=(B, T, K, H)).astype(np.float32)
  v = rng.normal(size=(B, T, K, H)).astype(np.float32)
  k_hat = _oracle_values(_numpy_rope(k[0].astype(np.float64)), bits)
  v_hat = _oracle_values(v[0], bits)
  want = np.zeros((T, K * G, H))
  for i in range(T):
    for head in range(K * G):
      s = k_hat[:i + 1, head // G] @ q[0, i, head].astype(np.float64)
      p = np.exp((s - s.max()) / np.sqrt(H))
      want[i, head] = (p / p.sum()) @ v_hat[:i + 1, head // G]
  for chunks in ((T,), (1,) * T, (4, 1, 6)):
    got = run_chunks(spec, q, k, v, chunks)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4,
                               err_msg=f"chunks={chunks}")
  # Teeth: full-precision keys give another answer.
  assert np.abs(_oracle(q[0], k[0], v_hat) - want).max() > 1e-2


def test_lookup_refuses_what_it_cannot_read():
  with pytest.raises(ValueError, match="no k or v here is scheme='vector'"):
    CacheSpec(k=QuantSpec("int4", "symmetric", "per_token"), v=None,
              code_read="lookup")
  with pytest.raises(ValueError, match="pre-RoPE vector keys"):
    CacheSpec(k=_vq(2), v=_vq(2), key_rope="pre", code_read="lookup")
  with pytest.raises(ValueError, match="allowed: dequantize, lookup"):
    CacheSpec(k=None, v=_vq(2), code_read="gather")
