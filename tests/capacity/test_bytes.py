"""Cache bytes read off the cache leaves == the specs' theoretical bits."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

from kvq_jax.cache.spec import CacheSpec
from kvq_jax.capacity.memory import cache_bytes, theoretical_bits
from kvq_jax.models.config import ModelConfig
from kvq_jax.quant import QuantSpec

# Only shapes matter (eval_shape): a SmolLM2-like head layout, 3 layers.
CONFIG = ModelConfig(vocab_size=97, hidden_size=64, intermediate_size=128,
                     num_layers=3, num_heads=6, num_kv_heads=3, head_dim=64)


def _q(fmt, scheme="symmetric", gran="per_token", group=None,
       scale_dtype="bfloat16"):
  return QuantSpec(fmt, scheme, gran, group, scale_dtype=scale_dtype)


PRESETS = {
    "int8": CacheSpec(k=_q("int8"), v=_q("int8")),
    "int8_f32_scales": CacheSpec(k=_q("int8", scale_dtype="float32"),
                                 v=_q("int8", scale_dtype="float32")),
    "fp8_e4m3": CacheSpec(k=_q("fp8_e4m3"), v=_q("fp8_e4m3")),
    "fp8_e5m2_g32": CacheSpec(k=_q("fp8_e5m2", gran="per_group", group=32),
                              v=_q("fp8_e5m2", gran="per_group", group=32)),
    "int4_g32": CacheSpec(k=_q("int4", gran="per_group", group=32),
                          v=_q("int4", gran="per_group", group=32)),
    "int4_g32_asym": CacheSpec(
        k=_q("int4", "asymmetric", "per_group", 32),
        v=_q("int4", "asymmetric", "per_group", 32)),
    "int3_g32_asym": CacheSpec(
        k=_q("int3", "asymmetric", "per_group", 32),
        v=_q("int3", "asymmetric", "per_group", 32)),
    "int2_g32_asym": CacheSpec(
        k=_q("int2", "asymmetric", "per_group", 32),
        v=_q("int2", "asymmetric", "per_group", 32)),
    "kivi2": CacheSpec(k=_q("int2", "asymmetric", "per_channel", 32),
                       v=_q("int2", "asymmetric", "per_group", 32),
                       residual=128),
    "kivi4_sinks": CacheSpec(k=_q("int4", "asymmetric", "per_channel", 64),
                             v=_q("int4", "asymmetric", "per_group", 64),
                             residual=32, sink=64),
    "k_only_int4": CacheSpec(k=_q("int4", gran="per_group", group=32),
                             v=None),
    "mixed_with_fp_layer": CacheSpec(
        k=_q("int4", gran="per_group", group=32),
        v=_q("int2", "asymmetric", "per_group", 32),
        layer_overrides=((0, None, None), (2, _q("int8"), None))),
}


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("name", list(PRESETS))
def test_bytes_per_token_match_theoretical_bits(name, dtype):
  spec = PRESETS[name]
  measured, fixed = cache_bytes(CONFIG, spec, dtype)
  expected = (theoretical_bits(CONFIG, spec, dtype) * 2 * CONFIG.num_layers
              * CONFIG.num_kv_heads * CONFIG.head_dim / 8)
  assert measured == pytest.approx(expected, rel=1e-9), (measured, expected)
  assert fixed >= 0


def test_dense_bytes_per_token():
  per_token, fixed = cache_bytes(CONFIG, None, jnp.bfloat16)
  assert per_token == 2 * 3 * 3 * 64 * 2 and fixed == 0


def test_fixed_bytes_are_window_and_sinks():
  # kivi2: per-channel K keeps R + F - 1 = 128 + 32 - 1 slots, per-token V
  # (F = 1) keeps R = 128, per layer, in the bfloat16 window dtype.
  _, fixed = cache_bytes(CONFIG, PRESETS["kivi2"], jnp.float32)
  assert fixed == 3 * ((128 + 31) + 128) * 3 * 64 * 2
  _, fixed = cache_bytes(CONFIG, PRESETS["kivi4_sinks"], jnp.bfloat16)
  # K: R + F - 1 + S = 32 + 63 + 64; V (per-group, F = 1): R + S = 32 + 64.
  assert fixed == 3 * ((32 + 63 + 64) + (32 + 64)) * 3 * 64 * 2
