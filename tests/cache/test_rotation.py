"""The randomised Hadamard rotation R = D H and its seeding."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from kvq_jax.cache import hadamard
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.quant import QuantSpec

INT4 = QuantSpec("int4", "lloyd_max", "per_token")


def _x(shape=(3, 5, 64), seed=0):
  return jax.random.normal(jax.random.PRNGKey(seed), shape)


@pytest.mark.parametrize("key", [None, (0, 0), (7, 29)])
def test_unrotate_undoes_rotate(key):
  x = _x()
  np.testing.assert_allclose(np.asarray(hadamard.unrotate(
      hadamard.rotate(x, key), key)), np.asarray(x), atol=2e-6)
  np.testing.assert_allclose(np.asarray(hadamard.rotate(
      hadamard.unrotate(x, key), key)), np.asarray(x), atol=2e-6)


def test_rotation_is_the_explicit_orthogonal_matrix():
  n, key = 16, (3, 1)
  d = hadamard.sign_vector(n, key)
  assert set(np.unique(d)) <= {-1.0, 1.0}
  r = np.diag(d) @ hadamard.hadamard_matrix_np(n)
  np.testing.assert_allclose(r @ r.T, np.eye(n), atol=1e-6)
  x = np.asarray(_x((4, n)))
  np.testing.assert_allclose(np.asarray(hadamard.rotate(x, key)), x @ r,
                             atol=1e-5)
  np.testing.assert_allclose(np.asarray(hadamard.unrotate(x, key)), x @ r.T,
                             atol=1e-5)


def test_signs_are_seeded_per_layer_and_stable():
  a = hadamard.sign_vector(64, (0, 0))
  np.testing.assert_array_equal(a, hadamard.sign_vector(64, (0, 0)))
  assert not np.array_equal(a, hadamard.sign_vector(64, (0, 1)))
  assert not np.array_equal(a, hadamard.sign_vector(64, (1, 0)))
  np.testing.assert_array_equal(hadamard.sign_vector(8, None), np.ones(8))


def test_plain_rotation_is_its_own_inverse():
  x = _x()
  np.testing.assert_allclose(np.asarray(hadamard.rotate(x)),
                             np.asarray(hadamard.unrotate(x)), atol=1e-6)


def test_rotated_coordinates_of_an_outlier_vector_spread_out():
  """One huge channel: after D H every coordinate carries |x| / sqrt(n)."""
  x = np.zeros((64,), np.float32)
  x[5] = 8.0
  y = np.asarray(hadamard.rotate(x, (0, 0)))
  np.testing.assert_allclose(np.abs(y), 1.0, atol=1e-6)


def test_cache_spec_passes_seed_and_layer():
  spec = CacheSpec(k=INT4, v=INT4, hadamard_k=True, hadamard_v=True,
                   rotation_seed=11)
  assert spec.layer(0).rotation_key == (11, 0)
  assert spec.layer(4).rotation_key == (11, 4)
  plain = dataclasses.replace(spec, rotation_seed=None)
  assert plain.layer(3).rotation_key is None


@pytest.mark.parametrize("kwargs,match", [
    (dict(rotation_seed=1), "rotates nothing"),
    (dict(rotation_seed=-2, hadamard_k=True), "rotation_seed"),
    (dict(rotation_seed=True, hadamard_k=True), "rotation_seed"),
])
def test_rotation_seed_validation(kwargs, match):
  with pytest.raises(ValueError, match=match):
    CacheSpec(k=INT4, v=INT4, **kwargs)
