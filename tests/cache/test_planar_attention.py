"""Bit-plane reads equal dequantize-then-attend."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from kvq_jax.cache import quantized_keys, quantized_store
from kvq_jax.cache.attention import block_attention, planar_block_attention
from kvq_jax.cache.quantized import QuantizedLayerCache
from kvq_jax.cache.quantized_store import read_planes, read_value_planes
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.models.rope import Rope
from kvq_jax.quant import QuantSpec, dequantize, quantize
from tests.cache.block_states import assert_state_equals_with_nan_value_row

B, K, G, T, L, H = 2, 2, 3, 2, 40, 16
Q4_0 = QuantSpec("int4", "symmetric", "per_group", 8, rounding="ggml",
                 scale_dtype="float16")
INT2_ASYM = QuantSpec("int2", "asymmetric", "per_group", 8)
KIVI_K = QuantSpec("int2", "asymmetric", "per_channel", 8, axis=-2)


def _qkv(seed):
  rng = np.random.default_rng(seed)
  normal = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)
  mask = jnp.asarray(rng.random((B, T, L)) < 0.6)
  mask = mask.at[1, 0, 30].set(False).at[1, 1, 30].set(True)
  return normal(B, K, G, T, H), normal(B, K, L, H), normal(B, K, L, H), mask


@pytest.mark.parametrize("kspec,vspec", [(Q4_0, Q4_0), (KIVI_K, INT2_ASYM)])
def test_equals_block_attention_on_dequantized_blocks(kspec, vspec):
  q, k, v, mask = _qkv(0)
  ks, vs = quantize(k, kspec), quantize(v, vspec)
  # A non-finite value row (its scale NaN): only its viewers get NaN.
  vs = dataclasses.replace(vs, scale=vs.scale.at[1, 0, 30, 0].set(jnp.nan))
  # A non-finite key row of sequence 0, head 1: NaN scores, as dequantized.
  ks = dataclasses.replace(ks, scale=ks.scale.at[0, 1, 1].set(jnp.nan))
  want = block_attention(q, dequantize(ks, jnp.float32),
                         dequantize(vs, jnp.float32), mask)
  v_planes, v_bad = read_value_planes(vs, vspec)
  got = planar_block_attention(q, read_planes(ks, kspec), v_planes, mask,
                               v_bad)
  assert_state_equals_with_nan_value_row(got, want)
  acc = np.asarray(got[2])
  assert np.isfinite(acc[0, 0]).all()
  assert np.isnan(acc[0, 1]).any()


def test_nonfinite_rows_found_in_the_planes_without_v_bad():
  q, k, v, mask = _qkv(1)
  v = v.at[1, 0, 30, 5].set(jnp.inf)
  want = block_attention(q, k, v, mask)
  got = planar_block_attention(q, (k[..., 0::2], k[..., 1::2]),
                               (v[..., 0::2], v[..., 1::2]), mask)
  for w, g in zip(want, got):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5,
                               atol=1e-5)
  assert np.isnan(np.asarray(got[2])[1, 0, :, 1]).all()


@pytest.mark.parametrize("key_rope", ["post", "pre"])
def test_cache_decode_matches_the_dequantized_path(monkeypatch, key_rope):
  """A KIVI-style cache (per-channel int2 keys, int2 values, a residual) of
  150 tokens (three 64-slot blocks), then a decode step read as bit planes
  and as interleaved dequantized blocks. Pre-RoPE keys turn plane by plane
  (RoPE over 8 of the 16 dims: 8 pass through)."""
  spec = CacheSpec(k=KIVI_K, v=INT2_ASYM, residual=4, block_size=64,
                   key_rope=key_rope).layer(0)
  rope = Rope(theta=10000.0, rotary_dim=8 if key_rope == "pre" else H)
  rng = np.random.default_rng(2)
  n = 150
  normal = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)
  prefill = (normal(1, n, K * G, H), normal(1, n, K, H), normal(1, n, K, H),
             jnp.arange(n)[None])
  step = (normal(1, 1, K * G, H), normal(1, 1, K, H), normal(1, 1, K, H),
          jnp.full((1, 1), n))
  _, cache = QuantizedLayerCache.create(spec, 1, 256, K, H).attend(
      *prefill, rope)
  planar, _ = cache.attend(*step, rope)
  if key_rope == "pre":  # The keys are read as 4 turned planes.
    assert len(quantized_keys.pre_rope_key_planes(
        spec, cache.k_store, rope, *rope.cos_sin(jnp.arange(256)))) == 4
  for module in (quantized_keys, quantized_store):
    monkeypatch.setattr(module, "plane_count", lambda s: 0)
  dequantized, _ = cache.attend(*step, rope)
  np.testing.assert_allclose(np.asarray(planar), np.asarray(dequantized),
                             rtol=1e-5, atol=1e-5)
