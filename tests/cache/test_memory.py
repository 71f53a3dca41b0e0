"""A decode step over a long quantized cache never materializes the cache.

The storage is read block by block, so XLA's temporaries of one decode step
stay far below the size of a dense bfloat16 cache of the same capacity.
"""

from __future__ import annotations

import jax.numpy as jnp
import pytest

from kvq_jax.bench.decode_bench import decode_step_memory
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.models.config import ModelConfig
from kvq_jax.models.params import decoder_from_params, random_params
from kvq_jax.models.runtime import Runtime
from kvq_jax.quant import QuantSpec

CONFIG = ModelConfig(vocab_size=97, hidden_size=64, intermediate_size=128,
                     num_layers=2, num_heads=4, num_kv_heads=2, head_dim=64)
CAPACITY = 8192
INT4_G32 = QuantSpec("int4", "symmetric", "per_group", 32)


@pytest.fixture(scope="module", name="runtime")
def _runtime():
  return Runtime(decoder_from_params(CONFIG, random_params(CONFIG)))


def test_int4_decode_step_temporaries_are_small(runtime):
  spec = CacheSpec(k=INT4_G32, v=INT4_G32)
  temp, bf16 = decode_step_memory(runtime, spec, 1, CAPACITY)
  # K+V, layers, slots, kv heads, head_dim, bf16; plus the int32 lengths.
  assert bf16 == 2 * 2 * CAPACITY * 2 * 64 * 2 + 2 * 4
  assert temp < 0.25 * bf16, (temp, bf16)


def test_kivi_decode_step_temporaries_are_small(runtime):
  spec = CacheSpec(k=QuantSpec("int2", "asymmetric", "per_channel", 32),
                   v=QuantSpec("int2", "asymmetric", "per_group", 32),
                   residual=128)
  temp, bf16 = decode_step_memory(runtime, spec, 1, CAPACITY)
  assert temp < 0.25 * bf16, (temp, bf16)
