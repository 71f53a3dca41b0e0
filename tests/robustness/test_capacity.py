"""Writing past the cache capacity is an error, never wrap-around or clamping.

The guard is `cache.base.check_capacity`, which `Runtime.prefill`/`decode`
run eagerly before every jitted step. Inside `jit` nothing checks: an
overflowing write is *clamped* by `lax.dynamic_update_slice` (dense cache:
it overwrites the last slot) or lands in the allocation's block rounding
beyond capacity (quantized cache; dropped only past the allocation), so the in-jit behaviour is
documented here by tests that demonstrate the silent corruption -- calling
`attend` under your own `jit` bypasses the guard, and must call
`check_capacity` itself.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kvq_jax.cache.base import check_capacity
from kvq_jax.cache.factory import init_cache
from kvq_jax.quant import dequantize
from tests.robustness import tiny

CAPACITY = 8


@pytest.mark.parametrize("spec", [None, tiny.INT4], ids=["dense", "int4"])
def test_prefill_and_decode_past_capacity_raise(spec):
  rt = tiny.runtime()
  cache = init_cache(tiny.CONFIG, 1, CAPACITY, spec)
  with pytest.raises(ValueError, match=r"KV cache overflow at layer 0: 0 "
                     r"tokens stored \+ 9 new > capacity 8"):
    rt.prefill(jnp.zeros((1, CAPACITY + 1), jnp.int32), cache)
  # The failed call raised before jit: `cache` was not donated, still usable
  # (decode steps: the one program this test compiles).
  for t in range(CAPACITY):  # The last one fills it.
    logits, cache = rt.decode(jnp.full((1,), t, jnp.int32), cache)
  assert int(cache[0].length_B[0]) == CAPACITY
  with pytest.raises(ValueError, match=r"8 tokens stored \+ 1 new > capacity "
                     r"8.*init_cache\(\.\.\., capacity=N\)"):
    rt.decode(jnp.zeros((1,), jnp.int32), cache)
  with pytest.raises(ValueError, match=r"8 tokens stored \+ 2 new"):
    rt.prefill(jnp.zeros((1, 2), jnp.int32), cache)


def test_check_capacity_uses_the_longest_sequence():
  cache = init_cache(tiny.CONFIG, 2, CAPACITY, tiny.INT4)
  cache = [layer.replace(length_B=jnp.asarray([2, 7], jnp.int32))
           for layer in cache]
  check_capacity(cache, 1)
  with pytest.raises(ValueError, match=r"7 tokens stored \+ 2 new > "
                     r"capacity 8"):
    check_capacity(cache, 2)


@pytest.mark.parametrize("spec", [None, tiny.INT4], ids=["dense", "int4"])
def test_in_jit_overflow_is_not_detected(spec):
  """Documents that check_capacity is the only guard: an overflowing
  `attend` under a user's jit returns without error and does not store the
  token where it belongs: the dense write is clamped onto the last slot
  (overwriting token 7), the quantized one goes to a slot of the block
  rounding beyond capacity; length_B advances past capacity either way."""
  layer = init_cache(tiny.CONFIG, 1, CAPACITY, spec)[0]
  layer = layer.replace(length_B=jnp.asarray([CAPACITY], jnp.int32))
  rope = tiny.runtime().model.layers[0].attn.rope
  h = tiny.CONFIG.head_dim
  q = jnp.ones((1, 1, tiny.CONFIG.num_heads, h))
  kv = jnp.full((1, 1, tiny.CONFIG.num_kv_heads, h), 7.0)
  attend = jax.jit(lambda c, q, k, v: c.attend(
      q, k, v, jnp.full((1, 1), CAPACITY, jnp.int32), rope))
  _, new = attend(layer, q, kv, kv)
  assert int(new.length_B[0]) == CAPACITY + 1  # > capacity, no error.
  with pytest.raises(ValueError, match="overflow"):
    check_capacity([new], 0)  # ... which the eager guard does report.
  if spec is None:  # Clamped: the value landed in the last slot instead.
    np.testing.assert_array_equal(new.v_BxSxKxH[0, CAPACITY - 1], 7.0)
  else:  # Stored past capacity: the allocation is rounded up to block_size
    # (16), so slot 8 exists and the codes land there unchecked.
    assert new.allocated_slots == 16
    # 7.0 in every element is exact at int4 (one code per group, any rule).
    stored = np.asarray(dequantize(new.v_store, jnp.float32))[0, :, CAPACITY]
    np.testing.assert_array_equal(stored, 7.0)
