"""A decode step's XLA temporaries do not grow with the cache's capacity.

The storage loop reads only the filled blocks; nothing it computes from the
whole buffer may be hoisted out of it (`cache.attention.per_iteration`).
Before that barrier, XLA converted every bfloat16 scale of the whole
allocation to float32 once per step, before the loop, and the write of the
new token's bfloat16 scale converted the whole scale leaf to float32 and
back (now a select on its uint16 view, `cache.quantized_store._put_rows`): an
int8 step at 64k slots held 0.9 MiB more temporaries than at 4k.
Not covered: a KIVI layout (per-channel K committed under `lax.cond`, one
group at a time) still copies its V scales and zeros once per step (XLA's
copy insertion around the conditional): 0.4 MiB more at 64k than at 4k.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from kvq_jax.cache.quantized import QuantizedLayerCache
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.models.rope import Rope
from kvq_jax.quant import QuantSpec

B, K, N, H = 1, 2, 4, 64
ROPE = Rope(theta=10000.0, rotary_dim=H)
SPECS = {
    "q4_0_style": CacheSpec(k=QuantSpec("int4", "symmetric", "per_group", 32),
                            v=QuantSpec("int4", "symmetric", "per_group", 32)),
    "int8": CacheSpec(k=QuantSpec("int8", "symmetric", "per_token"),
                      v=QuantSpec("int8", "symmetric", "per_token")),
    # Token-local with a residual window: one row committed per step.
    "int4_g32_asym_r8": CacheSpec(
        k=QuantSpec("int4", "asymmetric", "per_group", 32),
        v=QuantSpec("int4", "asymmetric", "per_group", 32), residual=8),
}


def step_temp_bytes(spec: CacheSpec, capacity: int) -> int:
  cache = QuantizedLayerCache.create(spec.layer(0), B, capacity, K, H)
  q = jnp.zeros((B, 1, N, H), jnp.float32)
  kv = jnp.zeros((B, 1, K, H), jnp.float32)
  pos = jnp.zeros((B, 1), jnp.int32)
  step = jax.jit(lambda c, q, k, v, p: c.attend(q, k, v, p, ROPE),
                 donate_argnums=0)
  compiled = step.lower(cache, q, kv, kv, pos).compile()
  return compiled.memory_analysis().temp_size_in_bytes


@pytest.mark.parametrize("name", list(SPECS))
def test_temporaries_do_not_grow_with_capacity(name):
  small = step_temp_bytes(SPECS[name], 4096)
  large = step_temp_bytes(SPECS[name], 65536)
  # 16x the slots: the scales alone would add 2 * 60k * K * 2 * 4 bytes.
  assert large <= small + 64 * 1024, (small, large)
