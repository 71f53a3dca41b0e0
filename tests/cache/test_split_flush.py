"""K and V with different flush blocks (per-channel one, token-local other):
the "mixed" segment, where one tensor is read in full precision and the
other dequantized, in both orientations.

Chunked prefill, uneven chunks and token-by-token decode must agree (they
hold exactly the same tokens in full precision), and the token-local tensor
must really be quantized as written: with it kept in full precision as well
(the same flush block for both), the output differs.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kvq_jax.cache.quantized import QuantizedLayerCache
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.models.rope import Rope
from kvq_jax.quant import QuantSpec

B, K, G, H, T = 2, 1, 2, 8, 27
ROPE = Rope(theta=10000.0, rotary_dim=H)
PC8 = QuantSpec("int2", "asymmetric", "per_channel", 8, scale_dtype="float32")
G8 = QuantSpec("int2", "asymmetric", "per_group", 8, scale_dtype="float32")


def _inputs():
  rng = np.random.default_rng(7)
  normal = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)
  return normal(B, T, K * G, H), normal(B, T, K, H), normal(B, T, K, H)


@jax.jit
def _attend(cache, q, k, v, positions):
  return cache.attend(q, k, v, positions, ROPE)


def _run(spec: CacheSpec, chunks) -> np.ndarray:
  layer = spec.layer(0)
  cache = QuantizedLayerCache.create(layer, B, 32, K, H)
  q, k, v = _inputs()
  outs, pos = [], 0
  for size in chunks:
    positions = cache.length_B[:, None] + jnp.arange(size)[None, :]
    out, cache = _attend(cache, q[:, pos:pos + size], k[:, pos:pos + size],
                         v[:, pos:pos + size], positions)
    outs.append(np.asarray(out))
    pos += size
  return np.concatenate(outs, axis=1)


# Two of the four (tensor, key_rope) pairings, to keep CI inside its
# budget: per-channel K with post-RoPE keys, per-channel V with pre-RoPE.
@pytest.mark.parametrize("k,v,flush,key_rope", [
    (PC8, G8, (8, 1), "post"), (G8, PC8, (1, 8), "pre")],
                         ids=["k_per_channel-post", "v_per_channel-pre"])
def test_mixed_segment_prefill_equals_decode(k, v, flush, key_rope):
  spec = CacheSpec(k=k, v=v, residual=2, block_size=8, key_rope=key_rope,
                   window_dtype="float32")
  layer = spec.layer(0)
  assert (layer.flush_k, layer.flush_v) == flush
  prefill = _run(spec, (T,))
  np.testing.assert_allclose(_run(spec, (1,) * T), prefill, atol=1e-5)
  # Uneven chunks from one new shape (13): a chunk from the empty cache, a
  # decode step, then a mid-stream chunk across two flush boundaries.
  np.testing.assert_allclose(_run(spec, (13, 1, 13)), prefill, atol=1e-5)
  # Holding the token-local tensor in full precision too changes the output.
  both_wait = dataclasses.replace(spec, flush_block=8)
  assert np.abs(_run(both_wait, (T,)) - prefill).max() > 1e-3
