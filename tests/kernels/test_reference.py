"""The pure-jnp decode-attention reference on hand-computed tiny caches."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kvq_jax.kernels.reference import decode_attention_reference
from kvq_jax.kernels.reference import dequantize_cache
from kvq_jax.quant import QuantSpec, QuantizedArray, dequantize, quantize


def _qa(data, scale, zero, spec, head_dim):
  f32 = lambda a: None if a is None else jnp.asarray(a, jnp.float32)
  return QuantizedArray(jnp.asarray(data, jnp.uint8), f32(scale), f32(zero),
                        spec, head_dim, "float32")


def _tiny_cache():
  """B=1, K=1, S=3, H=2; slot 2 is past length 2 and holds huge values."""
  # Keys int8 symmetric per_token: x = (u - 128) * scale.
  #   slot 0: ([129, 128] - 128) * 1.0 = [1, 0]
  #   slot 1: ([128, 130] - 128) * 0.5 = [0, 1]
  #   slot 2: ([255, 255] - 128) * 100 = [12700, 12700]  (masked)
  k = _qa([[[[129, 128], [128, 130], [255, 255]]]],
          [[[[1.0], [0.5], [100.0]]]], None,
          QuantSpec("int8", "symmetric", "per_token", scale_dtype="float32"), 2)
  # Values int8 asymmetric per_token: x = u * scale + zero.
  #   slot 0: [2, 0] * 2 + 0 = [4, 0]
  #   slot 1: [0, 4] * 2 + 0 = [0, 8]
  #   slot 2: [255, 255] * 1000 + 0  (masked)
  v = _qa([[[[2, 0], [0, 4], [255, 255]]]],
          [[[[2.0], [2.0], [1000.0]]]], [[[[0.0], [0.0], [0.0]]]],
          QuantSpec("int8", "asymmetric", "per_token", scale_dtype="float32"),
          2)
  return k, v


def test_reference_hand_computed_softmax():
  k, v = _tiny_cache()
  # q = [sqrt(2) ln 3, 0]; scores / sqrt(H=2) = [ln 3, 0]; softmax = [3/4, 1/4]
  # out = 3/4 [4, 0] + 1/4 [0, 8] = [3, 2]; lse = ln(e^ln3 + e^0) = ln 4.
  q = jnp.array([[[[math.sqrt(2) * math.log(3), 0.0]]]])
  out, lse = decode_attention_reference(q, k, v, jnp.array([2]),
                                        return_lse=True)
  np.testing.assert_allclose(out, [[[[3.0, 2.0]]]], rtol=1e-6)
  np.testing.assert_allclose(lse, [[[math.log(4)]]], rtol=1e-6)


def test_reference_single_slot_and_empty_sequence():
  k, v = _tiny_cache()
  k2 = jax.tree.map(lambda a: jnp.concatenate([a, a]), k)
  v2 = jax.tree.map(lambda a: jnp.concatenate([a, a]), v)
  # Two query heads (G=2) of one KV head. Batch 0 sees only slot 0, so the
  # output is v0 = [4, 0] and lse = q.k0 / sqrt(2). Batch 1 has length 0.
  q = jnp.array([[[[2.0, 5.0], [-1.0, 3.0]]]] * 2)
  out, lse = decode_attention_reference(q, k2, v2, jnp.array([1, 0]),
                                        return_lse=True)
  np.testing.assert_allclose(out[0], [[[4.0, 0.0], [4.0, 0.0]]])
  np.testing.assert_allclose(lse[0], [[2.0 / math.sqrt(2), -1 / math.sqrt(2)]],
                             rtol=1e-6)
  np.testing.assert_array_equal(out[1], np.zeros((1, 2, 2)))
  assert np.all(np.isneginf(np.asarray(lse[1])))


def test_dequantize_int4_per_group_hand_packed():
  # int4 symmetric, group 2 along H=4: codes [9, 7, 8, 10] pack low nibble
  # first into bytes [0x79, 0xA8]; scales [1, 0.5] ->
  # [(9-8)*1, (7-8)*1, (8-8)*0.5, (10-8)*0.5] = [1, -1, 0, 1].
  spec = QuantSpec("int4", "symmetric", "per_group", 2, scale_dtype="float32")
  x = _qa([[[[0x79, 0xA8]]]], [[[[1.0, 0.5]]]], None, spec, 4)
  np.testing.assert_array_equal(dequantize_cache(x, 4), [[[[1, -1, 0, 1]]]])


def test_dense_arrays_match_quantized_path():
  k, v = _tiny_cache()
  q = jnp.array([[[[0.3, -0.7]]]])
  length = jnp.array([2])
  want = decode_attention_reference(q, k, v, length)
  got = decode_attention_reference(q, dequantize_cache(k, 2),
                                   dequantize_cache(v, 2), length)
  np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("spec", [
    QuantSpec("int2", "asymmetric", "per_group", 16),
    QuantSpec("int4", "symmetric", "per_token"),
    QuantSpec("int8", "asymmetric", "per_channel", 4, axis=-2),
])
def test_dequantize_cache_matches_quant_library(spec):
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 2, 8, 32))
  qa = quantize(x, spec)
  np.testing.assert_allclose(dequantize_cache(qa, 32),
                             dequantize(qa, jnp.float32), rtol=1e-6, atol=1e-6)
