"""DenseLayerCache: slot writes, post-RoPE keys, lengths, dtypes, capacity."""

from __future__ import annotations

import jax
import numpy as np
import jax.numpy as jnp
import pytest

from kvq_jax.cache import check_capacity, init_dense_cache
from kvq_jax.cache.dense import DenseLayerCache, write_and_attend
from kvq_jax.models.rope import Rope

from tests.models.tiny import TINY

ROPE = Rope(theta=10000.0, rotary_dim=8)


def _random(shape, seed):
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape),
                     jnp.float32)


def test_attend_writes_rotated_keys_at_each_sequence_length():
  cache = DenseLayerCache.create(2, 6, 1, 8)
  cache = cache.replace(length_B=jnp.asarray([0, 3], jnp.int32))
  q, k, v = _random((2, 2, 2, 8), 0), _random((2, 2, 1, 8), 1), _random(
      (2, 2, 1, 8), 2)
  positions = jnp.asarray([[0, 1], [3, 4]])
  out, new = cache.attend(q, k, v, positions, ROPE)
  assert out.shape == (2, 2, 2, 8)
  np.testing.assert_array_equal(np.asarray(new.length_B), [2, 5])
  k_rot = np.asarray(ROPE(k, positions))
  np.testing.assert_allclose(np.asarray(new.k_BxSxKxH)[0, 0:2], k_rot[0])
  np.testing.assert_allclose(np.asarray(new.k_BxSxKxH)[1, 3:5], k_rot[1])
  np.testing.assert_allclose(np.asarray(new.v_BxSxKxH)[1, 3:5],
                             np.asarray(v)[1])
  assert not np.asarray(new.k_BxSxKxH)[0, 2:].any()
  assert not np.asarray(new.v_BxSxKxH)[1, :3].any()


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_low_precision_cache_stores_rounded_values(dtype):
  cache = DenseLayerCache.create(1, 4, 1, 8, dtype=dtype)
  k, v = _random((1, 2, 1, 8), 3), _random((1, 2, 1, 8), 4)
  out, new = cache.attend(_random((1, 2, 2, 8), 5), k, v,
                          jnp.asarray([[0, 1]]), ROPE)
  assert new.k_BxSxKxH.dtype == dtype and out.dtype == jnp.float32
  np.testing.assert_array_equal(
      np.asarray(new.v_BxSxKxH[0, :2]), np.asarray(v[0].astype(dtype)))


def test_init_dense_cache_one_per_layer():
  cache = init_dense_cache(TINY, 3, 10, jnp.bfloat16)
  assert len(cache) == TINY.num_layers
  assert cache[0].k_BxSxKxH.shape == (3, 10, TINY.num_kv_heads, TINY.head_dim)
  assert cache[1].dtype == jnp.bfloat16 and cache[0].capacity == 10
  assert cache[0].length_B.dtype == jnp.int32


@pytest.mark.parametrize("field,kwargs", [
    ("capacity", dict(capacity=0)), ("batch_size", dict(batch_size=-1)),
    ("dtype", dict(dtype=jnp.int8))])
def test_create_rejects_bad_arguments(field, kwargs):
  args = dict(batch_size=1, capacity=4, num_kv_heads=1, head_dim=8)
  args.update(kwargs)
  with pytest.raises(ValueError, match=field):
    DenseLayerCache.create(**args)


def test_check_capacity_overflow():
  cache = init_dense_cache(TINY, 2, 5)
  check_capacity(cache, 5)
  cache[1] = cache[1].replace(length_B=jnp.asarray([0, 3], jnp.int32))
  check_capacity(cache, 2)
  with pytest.raises(ValueError, match="layer 1"):
    check_capacity(cache, 3)


@pytest.mark.skipif(jax.default_backend() != "cpu",
                    reason="XLA:CPU's bfloat16 float normalization")
def test_bf16_decode_step_keeps_no_float32_copy_and_writes_exact_bits():
  """XLA:CPU has no bf16 arithmetic: a bf16 scatter or slice of the cache
  used to become convert(whole buffer) to float32, the op, convert back, so
  a decode step held a float32 copy of the cache in temporaries (and paid
  for three passes over it). Now the step's temporaries are a small fraction
  of that, and what it writes is the bf16 bits of the new token, exactly."""
  b, s, k, h, n = 2, 8192, 2, 64, 4
  step = jax.jit(write_and_attend, donate_argnums=0)
  q = jax.ShapeDtypeStruct((b, 1, n, h), jnp.float32)
  kv = jax.ShapeDtypeStruct((b, 1, k, h), jnp.float32)

  def compiled_step(dtype):
    abstract = jax.eval_shape(
        lambda: DenseLayerCache.create(b, s, k, h, dtype=dtype))
    return step.lower(abstract, q, kv, kv).compile()

  compiled = compiled_step(jnp.bfloat16)
  temp = compiled.memory_analysis().temp_size_in_bytes
  # Measured (jax 0.10.2): 16.9 MiB before, i.e. the float32 cache (16 MiB)
  # plus the step's own; 1.15 MiB after, as much as a float32 cache's step.
  assert temp <= compiled_step(
      jnp.float32).memory_analysis().temp_size_in_bytes
  assert temp < 2 * b * s * k * h * 4 / 4  # A quarter of the float32 cache.

  cache = DenseLayerCache.create(b, s, k, h, dtype=jnp.bfloat16)
  cache = cache.replace(length_B=jnp.asarray([5, s - 1], jnp.int32))
  bits_kv = np.array(jax.lax.bitcast_convert_type(
      _random((2, b, 1, k, h), 6).astype(jnp.bfloat16), jnp.uint16))
  # A NaN with a payload, -inf, the smallest subnormal and -0 in sequence
  # 0's key and value: moved as bits, never converted.
  bits_kv[:, 0, 0, 0, :4] = [0x7FC1, 0xFF80, 0x0001, 0x8000]
  new_k, new_v = (jax.lax.bitcast_convert_type(jnp.asarray(x), jnp.bfloat16)
                  for x in bits_kv)
  out, cache = step(cache, _random((b, 1, n, h), 7), new_k, new_v)
  for stored, want in zip((cache.k_BxSxKxH, cache.v_BxSxKxH), bits_kv):
    stored = np.array(jax.lax.bitcast_convert_type(stored, jnp.uint16))
    np.testing.assert_array_equal(stored[0, 5], want[0, 0])
    np.testing.assert_array_equal(stored[1, s - 1], want[1, 0])
    stored[0, 5], stored[1, s - 1] = 0, 0
    assert not stored.any()  # No other slot was touched.
  np.testing.assert_array_equal(np.asarray(cache.length_B), [6, s])
  # Sequence 0's NaN key/value sit in KV head 0: they reach that head's
  # query heads and no other.
  out = np.asarray(out)
  assert np.isnan(out[0, :, :n // k]).all()
  assert np.isfinite(out[0, :, n // k:]).all() and np.isfinite(out[1]).all()
