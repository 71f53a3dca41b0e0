"""Residual window, flush blocks and sinks of QuantizedLayerCache.

Spec: sink S=2, residual R=3, flush F=4, int8 per-token keys and values,
pre-RoPE keys (so the buffers hold the raw keys). After n tokens the
quantized storage holds [S, Q(n)) with Q(n) = S + F * floor((n - S - R) / F)
(0 when negative), the window holds [Q(n), n) exactly, the sinks [0, S).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kvq_jax.cache.quantized import QuantizedLayerCache, committed_end
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.models.rope import Rope
from kvq_jax.quant import QuantSpec, dequantize, quantize

B, K, G, H = 1, 2, 2, 16
S, R, F = 2, 3, 4
TOTAL = 21
ROPE = Rope(theta=10000.0, rotary_dim=H)
INT8 = QuantSpec("int8", "symmetric", "per_token")
SPEC = CacheSpec(k=INT8, v=INT8, sink=S, residual=R, flush_block=F,
                 key_rope="pre", block_size=8,
                 window_dtype="float32").layer(0)

# Q(n) by hand: 2 until n - 5 reaches a multiple of 4.
HAND_Q = {0: 2, 1: 2, 2: 2, 5: 2, 6: 2, 8: 2, 9: 6, 12: 6, 13: 10, 16: 10,
          17: 14, 20: 14, 21: 18}


def _tokens():
  rng = np.random.default_rng(1)
  normal = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)
  return normal(B, TOTAL, K * G, H), normal(B, TOTAL, K, H), normal(
      B, TOTAL, K, H)


@functools.partial(jax.jit, static_argnames="size")
def _attend(cache, q, k, v, *, size):
  del size  # Shapes already differ; kept for readability of call sites.
  positions = cache.length_B[:, None] + jnp.arange(q.shape[1])[None, :]
  return cache.attend(q, k, v, positions, ROPE)


def test_committed_end_by_hand():
  for n, q in HAND_Q.items():
    assert int(committed_end(jnp.int32(n), SPEC)) == q, n
  assert SPEC.window == R + F - 1 == 6


def test_window_sinks_and_storage_hold_the_right_tokens():
  q, k, v = _tokens()
  k_np, v_np = np.asarray(k[0]).swapaxes(0, 1), np.asarray(v[0]).swapaxes(
      0, 1)  # [K, T, H]
  cache = QuantizedLayerCache.create(SPEC, B, 32, K, H)
  for n in range(1, TOTAL + 1):
    _, cache = _attend(cache, q[:, n - 1:n], k[:, n - 1:n], v[:, n - 1:n],
                       size=1)
    qn = HAND_Q.get(n, int(committed_end(jnp.int32(n), SPEC)))
    held = n - max(qn, S) if n > S else 0
    # Window: exactly the tokens [Q(n), n), in order, full precision.
    np.testing.assert_array_equal(np.asarray(cache.window_k[0, :, :held]),
                                  k_np[:, n - held:n])
    np.testing.assert_array_equal(np.asarray(cache.window_v[0, :, :held]),
                                  v_np[:, n - held:n])
    # Sinks: the first min(n, S) tokens, bit-exact.
    m = min(n, S)
    np.testing.assert_array_equal(np.asarray(cache.sink_k[0, :, :m]),
                                  k_np[:, :m])
    np.testing.assert_array_equal(np.asarray(cache.sink_v[0, :, :m]),
                                  v_np[:, :m])
    # Storage: [S, Q(n)) quantized, nothing else written.
    stored_k = np.asarray(dequantize(cache.k_store, jnp.float32))[0]
    expected_k = np.asarray(dequantize(quantize(jnp.asarray(k_np), SPEC.k),
                                       jnp.float32))
    end = max(qn, S)
    np.testing.assert_array_equal(stored_k[:, S:end], expected_k[:, S:end])
    assert not stored_k[:, :S].any() and not stored_k[:, end:].any(), n
  np.testing.assert_array_equal(np.asarray(cache.length_B), [TOTAL])


def test_attention_reads_exactly_what_decode_held():
  """Query i sees sinks and [Q(i + 1), i] exact, [S, Q(i + 1)) dequantized."""
  q, k, v = _tokens()
  cache = QuantizedLayerCache.create(SPEC, B, 32, K, H)
  out, _ = _attend(cache, q, k, v, size=TOTAL)  # One chunk of 21 tokens.
  pos = jnp.arange(TOTAL)[None]
  deq = lambda x: dequantize(quantize(jnp.swapaxes(x, 1, 2), SPEC.k),
                             jnp.float32).swapaxes(1, 2)
  # RoPE is per position, so rotating all keys once is the same as rotating
  # each query's visible prefix (and avoids one eager compile per prefix).
  k_q = np.asarray(ROPE(deq(k), pos))[0]  # [T, K, H]
  k_x = np.asarray(ROPE(k, pos))[0]
  v_q, v_x = np.asarray(deq(v))[0], np.asarray(v)[0]
  expected = np.zeros((TOTAL, K * G, H), np.float32)
  for i in range(TOTAL):
    q_end = int(committed_end(jnp.int32(i + 1), SPEC))
    quantized = (np.arange(i + 1) >= S) & (np.arange(i + 1) < q_end)
    keys = np.where(quantized[:, None, None], k_q[:i + 1], k_x[:i + 1])
    vals = np.where(quantized[:, None, None], v_q[:i + 1], v_x[:i + 1])
    for head in range(K * G):
      kv = head // G
      scores = keys[:, kv] @ np.asarray(q)[0, i, head] / np.sqrt(H)
      p = np.exp(scores - scores.max())
      expected[i, head] = (p / p.sum()) @ vals[:, kv]
  np.testing.assert_allclose(np.asarray(out)[0], expected, atol=2e-5, rtol=0)
