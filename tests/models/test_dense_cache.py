"""DenseLayerCache: slot writes, post-RoPE keys, lengths, dtypes, capacity."""

from __future__ import annotations

import numpy as np
import jax.numpy as jnp
import pytest

from kvq_jax.cache import check_capacity, init_dense_cache
from kvq_jax.cache.dense import DenseLayerCache
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
