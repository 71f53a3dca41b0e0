"""Scales folded out of the dots equal dequantize-then-attend."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from kvq_jax.cache import quantized
from kvq_jax.cache.attention import block_attention
from kvq_jax.cache.folded_attention import (folded_block_attention,
                                            folds_scales)
from kvq_jax.cache.quantized import QuantizedLayerCache
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.models.rope import Rope
from kvq_jax.quant import QuantSpec, dequantize, quantize
from tests.cache.block_states import assert_state_equals_with_nan_value_row

B, K, G, T, L, H = 2, 2, 3, 2, 40, 16
INT8 = QuantSpec("int8", "symmetric", "per_token", axis=None)


def test_which_formats_fold():
  assert folds_scales(INT8)
  assert folds_scales(QuantSpec("int4", "symmetric", "per_token"))
  assert not folds_scales(None)
  assert not folds_scales(QuantSpec("int4", "symmetric", "per_group", 8))
  assert not folds_scales(QuantSpec("int8", "asymmetric", "per_token"))
  assert not folds_scales(QuantSpec("int8", "symmetric", "per_token",
                                    outliers=1))
  assert not folds_scales(QuantSpec("int4", "lloyd_max", "per_token"))
  assert not folds_scales(QuantSpec("fp8_e4m3", "symmetric", "per_token"))


@pytest.mark.parametrize("bits", [8, 4])
def test_equals_block_attention_on_dequantized_blocks(bits):
  rng = np.random.default_rng(bits)
  spec = QuantSpec(f"int{bits}", "symmetric", "per_token", axis=None)
  q = jnp.asarray(rng.standard_normal((B, K, G, T, H)), jnp.float32)
  k = jnp.asarray(rng.standard_normal((B, K, L, H)), jnp.float32)
  v = jnp.asarray(rng.standard_normal((B, K, L, H)), jnp.float32)
  mask = jnp.asarray(rng.random((B, T, L)) < 0.6)
  mask = mask.at[1, 0, 30].set(False).at[1, 1, 30].set(True)
  ks, vs = quantize(k, spec), quantize(v, spec)
  # A non-finite value row (its scale NaN): only its viewers get NaN.
  vs = dataclasses.replace(vs, scale=vs.scale.at[1, 0, 30].set(jnp.nan))
  want = block_attention(q, dequantize(ks, jnp.float32),
                         dequantize(vs, jnp.float32), mask)
  got = folded_block_attention(q, ks, vs, mask)
  assert_state_equals_with_nan_value_row(got, want)
  acc = np.asarray(got[2])
  assert np.isfinite(acc[0]).all()


def test_int8_cache_decode_matches_the_dequantized_path(monkeypatch):
  """A cache of 300 tokens (two 256-slot blocks), then one decode step
  read both ways."""
  spec = CacheSpec(k=INT8, v=INT8, hadamard_v=True).layer(0)
  rope = Rope(theta=10000.0, rotary_dim=H)
  rng = np.random.default_rng(0)
  n, heads = 300, 2 * G
  ids = lambda t: jnp.asarray(rng.standard_normal((1, t, heads, H)),
                              jnp.float32)
  kv = lambda t: jnp.asarray(rng.standard_normal((1, t, K, H)), jnp.float32)
  prefill = (ids(n), kv(n), kv(n), jnp.arange(n)[None])
  step = (ids(1), kv(1), kv(1), jnp.full((1, 1), n))

  _, cache = QuantizedLayerCache.create(spec, 1, 512, K, H).attend(
      *prefill, rope)
  folded, _ = cache.attend(*step, rope)
  monkeypatch.setattr(quantized, "folds_scales", lambda s: False)
  dequantized, _ = cache.attend(*step, rope)
  np.testing.assert_allclose(np.asarray(folded), np.asarray(dequantized),
                             rtol=1e-5, atol=1e-5)
