"""`start_B`: the decode kernel and the reference mask slots < start_b.

The quantized cache keeps its sink tokens in a separate buffer, so the
storage segment a decode step reads is [start_b, length_b). The oracle here
is float64 numpy over `kvq_jax.quant.dequantize` (the quant library's own
unpacking, independent of the kernel's byte layout). `TestStartMask` runs
compiled and skips on CPU; `TestStartMaskInterpret` runs the interpreter.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kvq_jax.kernels.decode_attention import (decode_attention,
                                              decode_attention_dense,
                                              decode_attention_supported)
from kvq_jax.kernels.dispatch import quantized_decode_attention
from kvq_jax.kernels.reference import decode_attention_reference
from kvq_jax.quant import QuantSpec, dequantize, quantize
from tests.kernels.kernel_case import KernelCase

INT4_ASYM = QuantSpec("int4", "asymmetric", "per_group", 32)
INT8_TOKEN = QuantSpec("int8", "symmetric", "per_token")
KIVI_K = QuantSpec("int2", "asymmetric", "per_channel", 32, axis=-2,
                   scale_dtype="float32")


def _inputs(seed, *, batch, slots=128, kv_heads=2, g=2, head_dim=32):
  kq, kk, kv = jax.random.split(jax.random.PRNGKey(seed), 3)
  q = 2.0 * jax.random.normal(kq, (batch, kv_heads, g, head_dim))
  k = jax.random.normal(kk, (batch, kv_heads, slots, head_dim))
  v = jax.random.normal(kv, (batch, kv_heads, slots, head_dim))
  return q, k, v


def _oracle(q, k, v, start, length):
  """float64 (out [B, K, G, H], lse [B, K, G]) over slots [start, length)."""
  def f64(x):
    x = dequantize(x, jnp.float32) if hasattr(x, "data") else x
    return np.asarray(x, np.float64)
  q, k, v = np.asarray(q, np.float64), f64(k), f64(v)
  scores = np.einsum("bkgh,bksh->bkgs", q, k) / np.sqrt(q.shape[-1])
  slots = np.arange(k.shape[2])
  valid = ((slots >= np.asarray(start)[:, None])
           & (slots < np.asarray(length)[:, None]))[:, None, None]
  scores = np.where(valid, scores, -np.inf)
  m = np.max(scores, -1, keepdims=True)
  m = np.where(np.isfinite(m), m, 0.0)
  p = np.where(valid, np.exp(scores - m), 0.0)
  l = p.sum(-1, keepdims=True)
  out = np.einsum("bkgs,bksh->bkgh", p / np.where(l > 0, l, 1.0), v)
  lse = np.where(l > 0, m + np.log(np.where(l > 0, l, 1.0)), -np.inf)
  return out, lse[..., 0]


class TestStartMask(KernelCase):
  TOLERANCE = {True: 2e-5, False: 2e-3}

  def _check(self, q, k, v, starts, lengths, dense=False, **kw):
    start = jnp.array(starts, jnp.int32)
    length = jnp.array(lengths, jnp.int32)
    kernel = decode_attention_dense if dense else decode_attention
    out, lse = kernel(q, k, v, length, start_B=start, return_lse=True,
                      interpret=self.INTERPRET, **kw)
    want, want_lse = _oracle(q, k, v, starts, lengths)
    ref, ref_lse = decode_attention_reference(q, k, v, length,
                                              return_lse=True, start_B=start)
    for got, got_lse in ((out, lse), (ref, ref_lse)):
      assert np.all(np.isfinite(np.asarray(got)))
      np.testing.assert_allclose(got, want, rtol=self.tol, atol=self.tol)
      np.testing.assert_array_equal(np.isneginf(got_lse), np.isneginf(want_lse))
      finite = np.isfinite(want_lse)
      np.testing.assert_allclose(np.asarray(got_lse)[finite], want_lse[finite],
                                 rtol=self.tol, atol=self.tol)
    return out, lse

  def test_ragged_starts_skip_blocks_across_splits(self):
    # block_k 16, 4 splits of 32 slots. Rows: start 0 (plain length mask);
    # start inside split 1, end inside split 2 (skips 2 whole blocks); one
    # slot; start == length (empty); start > length (empty).
    q, k, v = _inputs(0, batch=5)
    kq, vq = quantize(k, INT4_ASYM), quantize(v, INT4_ASYM)
    out, lse = self._check(q, kq, vq, (0, 40, 99, 64, 120), (37, 90, 100, 64,
                                                             50),
                           block_k=16, k_splits=4)
    np.testing.assert_array_equal(out[3:], 0.0)
    assert np.all(np.isneginf(np.asarray(lse[3:])))
    # Masking the prefix changes the result (the test can fail).
    plain = decode_attention_reference(q, kq, vq, jnp.array([37, 90, 100, 64,
                                                             50]))
    assert np.abs(np.asarray(plain[1]) - np.asarray(out[1])).max() > 1e-2

  def test_per_channel_keys_start_inside_a_token_group(self):
    # Token groups of 32 span two blocks of 16; starts at a group boundary
    # (the cache's sink count) and inside a group.
    q, k, v = _inputs(1, batch=3)
    self._check(q, quantize(k, KIVI_K), quantize(v, INT8_TOKEN),
                (32, 40, 5), (128, 77, 6), block_k=16, k_splits=2)

  def test_dense_variant(self):
    q, k, v = _inputs(2, batch=2)
    self._check(q, k, v, (17, 0), (100, 3), dense=True, block_k=32)


class TestStartMaskInterpret(TestStartMask):
  INTERPRET = True


def test_dispatch_passes_start_to_both_implementations():
  q, k, v = _inputs(3, batch=2, slots=64)
  kq, vq = quantize(k, INT4_ASYM), quantize(v, INT4_ASYM)
  start, length = jnp.array([8, 20]), jnp.array([50, 21])
  outs = [quantized_decode_attention(q, kq, vq, length, start_B=start,
                                     implementation=impl, interpret=True,
                                     block_k=16)
          for impl in ("pallas", "xla")]
  want, _ = _oracle(q, kq, vq, start, length)
  for out in outs:
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)


def test_bad_start_shape_is_reported():
  q, k, v = _inputs(4, batch=2, slots=64)
  kq, vq = quantize(k, INT4_ASYM), quantize(v, INT4_ASYM)
  reason = decode_attention_supported(q, kq, vq, jnp.array([3, 4]),
                                      start_B=jnp.array([0, 1, 2]))
  assert "start_B has shape (3,)" in reason
  with pytest.raises(ValueError, match="start_B has shape"):
    decode_attention(q, kq, vq, jnp.array([3, 4]),
                     start_B=jnp.zeros((2, 1), jnp.int32), interpret=True)
