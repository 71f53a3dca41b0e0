"""Per-channel (KIVI) keys with a full-precision window, against a numpy oracle.

Spec: K int2 asymmetric per_channel over groups of g=4 tokens (post-RoPE), V
int2 asymmetric per_group of 4 along head_dim, residual R=4, flush_block F=4,
sink S in {0, 4}. After n tokens the tokens [S, Q(n)) are in quantized
storage, Q(n) = S + F * floor(max(0, n - S - R) / F), the rest full precision;
query token i sees the full-precision copy of token j <= i if j < S or
j >= Q(i + 1), else the dequantized one.

The oracle below works that visibility out by hand (table HAND_Q_END), builds
each query's keys/values from a full-precision copy and a copy whose closed
4-token groups were quantized on their own, and does the softmax in float64
numpy. The single shared primitive is `kvq_jax.quant.quantize/dequantize`,
called on exactly one group tensor [K, g, H] (or one token's head_dim for V)
at a time; float32 scales and clip_ratio 1.0 keep it free of the rounding
rules that are still moving.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kvq_jax.cache.quantized import QuantizedLayerCache
from kvq_jax.cache.spec import CacheSpec, LayerSpec
from kvq_jax.models.rope import Rope
from kvq_jax.quant import QuantSpec, dequantize, quantize

B, K, G, H = 1, 1, 2, 8
GROUP = F = R = 4
T = 13
CAPACITY = 16
THETA = 10000.0
ROPE = Rope(theta=THETA, rotary_dim=H)
RTOL = ATOL = 1e-5

K_SPEC = QuantSpec("int2", "asymmetric", "per_channel", GROUP,
                   scale_dtype="float32", clip_ratio=1.0)
V_SPEC = QuantSpec("int2", "asymmetric", "per_group", 4,
                   scale_dtype="float32", clip_ratio=1.0)

# Q(i + 1) for query token i, worked out by hand from the formula above:
#   S=0: Q(n) = 4 * floor(max(0, n - 4) / 4): 0 for n <= 7, 4 for 8 <= n <= 11,
#        8 for n = 12, 13.
#   S=4: Q(n) = 4 + 4 * floor(max(0, n - 8) / 4): 4 for n <= 11, 8 for n >= 12.
HAND_Q_END = {
    0: [0] * 7 + [4] * 4 + [8] * 2,
    4: [4] * 11 + [8] * 2,
}


def _cache_spec(sink: int):
  """The LayerSpec under test.

  Where the spec has a `window_dtype` (dtype of the full-precision window and
  sinks), it is set to float32 so that the oracle is exact; without the field
  those regions are stored in the cache's dtype (float32 here).
  """
  names = lambda cls: {f.name for f in dataclasses.fields(cls)}  # noqa: E731
  extra = {"window_dtype": "float32"} if "window_dtype" in names(
      CacheSpec) else {}
  layer = CacheSpec(k=K_SPEC, v=V_SPEC, residual=R, flush_block=F, sink=sink,
                    key_rope="post", block_size=8, **extra).layer(0)
  if "window_dtype" in names(LayerSpec):
    layer = dataclasses.replace(layer, window_dtype="float32")
  return layer


def _inputs():
  rng = np.random.default_rng(7)
  normal = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
  # Per-channel offsets, as real keys have (KIVI's motivation).
  k = normal(B, T, K, H) + np.linspace(-2.0, 2.0, H, dtype=np.float32)
  return normal(B, T, K * G, H), k, normal(B, T, K, H)


def _numpy_rope(x_TxKxH: np.ndarray) -> np.ndarray:
  """HF rotate_half RoPE at positions 0..T-1, float64."""
  half = H // 2
  inv = 1.0 / THETA ** (np.arange(0, H, 2, dtype=np.float64) / H)
  ang = np.arange(x_TxKxH.shape[0])[:, None, None] * inv  # [T, 1, H/2]
  x1, x2 = x_TxKxH[..., :half], x_TxKxH[..., half:]
  return np.concatenate([x1 * np.cos(ang) - x2 * np.sin(ang),
                         x2 * np.cos(ang) + x1 * np.sin(ang)], axis=-1)


def _dequantized_copies(k_rot_TxKxH: np.ndarray, v_TxKxH: np.ndarray,
                        sink: int):
  """Each closed key group [s, s + 4) (s >= sink) quantized on its own."""
  k_deq = np.full_like(k_rot_TxKxH, np.nan)
  for start in range(sink, T - GROUP + 1, GROUP):
    group_KxgxH = jnp.asarray(k_rot_TxKxH[start:start + GROUP].swapaxes(0, 1))
    back = dequantize(quantize(group_KxgxH, dataclasses.replace(K_SPEC,
                                                                axis=-2)),
                      jnp.float32)
    k_deq[start:start + GROUP] = np.asarray(back).swapaxes(0, 1)
  v_deq = np.asarray(dequantize(quantize(jnp.asarray(v_TxKxH), V_SPEC),
                                jnp.float32))
  return k_deq, v_deq


def _oracle(q, k_rot, v, k_deq, v_deq, q_end_T, sink):
  """Attention outputs [T, N, H] (float64) given Q(i + 1) per query."""
  out = np.zeros((T, K * G, H))
  for i in range(T):
    j = np.arange(i + 1)
    quantized = ((j >= sink) & (j < q_end_T[i]))[:, None, None]
    keys = np.where(quantized, k_deq[:i + 1], k_rot[:i + 1]).astype(np.float64)
    vals = np.where(quantized, v_deq[:i + 1], v[:i + 1]).astype(np.float64)
    for head in range(K * G):
      scores = keys[:, head // G] @ q[i, head].astype(np.float64) / np.sqrt(H)
      p = np.exp(scores - scores.max())
      out[i, head] = (p / p.sum()) @ vals[:, head // G]
  return out


@jax.jit
def _attend(cache, q, k, v):
  positions = cache.length_B[:, None] + jnp.arange(q.shape[1])[None, :]
  return cache.attend(q, k, v, positions, ROPE)


def _run(spec, q, k, v, chunks):
  cache = QuantizedLayerCache.create(spec, B, CAPACITY, K, H, jnp.float32)
  outs, pos = [], 0
  for size in chunks:
    out, cache = _attend(cache, *(jnp.asarray(x[:, pos:pos + size])
                                  for x in (q, k, v)))
    outs.append(np.asarray(out))
    pos += size
  assert np.asarray(cache.length_B).tolist() == [T]
  assert cache.window_k.dtype == cache.sink_k.dtype == jnp.float32
  return np.concatenate(outs, axis=1)[0]


@pytest.mark.parametrize("sink", [0, 4])
def test_kivi_window_matches_the_numpy_oracle(sink):
  spec = _cache_spec(sink)
  assert spec.k.granularity == "per_channel" and spec.k.axis == -2
  assert spec.window == R + F - 1
  q, k, v = _inputs()
  positions = jnp.arange(T)[None]
  k_rot = np.asarray(ROPE(jnp.asarray(k), positions))[0]  # [T, K, H] f32
  np.testing.assert_allclose(k_rot, _numpy_rope(k[0].astype(np.float64)),
                             rtol=0, atol=1e-5)
  k_deq, v_deq = _dequantized_copies(k_rot, v[0], sink)
  q_end = HAND_Q_END[sink]
  want = _oracle(q[0], k_rot, v[0], k_deq, v_deq, q_end, sink)

  # One prefill chunk, token-by-token decode and uneven chunks all agree
  # with the oracle (and so with each other).
  for chunks in ((T,), (1,) * T, (5, 3, 5)):
    got = _run(spec, q, k, v, chunks)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL,
                               err_msg=f"chunks={chunks}")

  # The test has teeth: queries that mix dequantized and full-precision
  # tokens exist, and there the result is far from both an all-full-precision
  # cache and a cache without the window (every closed group quantized as
  # soon as it closes).
  mixed = [i for i in range(T) if q_end[i] > sink]
  assert mixed == list(range(7 if sink == 0 else 11, T))
  all_fp = _oracle(q[0], k_rot, v[0], k_deq, v_deq, [0] * T, sink)
  no_window = _oracle(q[0], k_rot, v[0], k_deq, v_deq,
                      [max(sink, (i + 1) // GROUP * GROUP) for i in range(T)],
                      sink)
  for other in (all_fp, no_window):
    gap = np.abs(other - want)[mixed].max(axis=(1, 2))
    assert (gap > 100 * ATOL).all(), gap
  # Before any group is flushed, every query is exactly full precision.
  first = q_end.index(next(e for e in q_end if e > sink))
  np.testing.assert_allclose(got[:first], all_fp[:first], rtol=RTOL,
                             atol=ATOL)
