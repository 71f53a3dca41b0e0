"""Calibrated pre-RoPE key shift/scale: validation, exactness, accounting."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kvq_jax.cache.dense import DenseLayerCache
from kvq_jax.cache.key_affine import KeyAffine
from kvq_jax.cache.quantized import QuantizedLayerCache
from kvq_jax.cache.spec import CacheSpec, LayerSpec
from kvq_jax.capacity import memory
from kvq_jax.models.rope import Rope
from kvq_jax.quant import QuantSpec, codebook

from tests.models.tiny import TINY

B, K, G, H = 2, 2, 2, 16
ROPE = Rope(theta=10000.0, rotary_dim=H)
LM4 = QuantSpec("int4", "lloyd_max", "per_token")


def _affine(seed=0, k=K, h=H):
  rng = np.random.default_rng(seed)
  return KeyAffine.from_arrays(rng.normal(0, 3, (k, h)),
                               np.exp(rng.normal(0, 1, (k, h))))


def test_normalize_denormalize_round_trip():
  affine = _affine()
  x = jax.random.normal(jax.random.PRNGKey(0), (B, K, 7, H)) * 5
  y = affine.normalize(x)
  shift, scale = affine.arrays()
  np.testing.assert_allclose(np.asarray(y), (np.asarray(x) - shift[:, None])
                             / scale[:, None], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(affine.denormalize(y)),
                             np.asarray(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shift,scale,match", [
    (np.zeros((2, 4)), np.zeros((2, 4)), "scale"),
    (np.zeros((2, 4)), np.ones((2, 3)), "same shape"),
    (np.full((2, 4), np.nan), np.ones((2, 4)), "finite"),
])
def test_invalid_affines(shift, scale, match):
  with pytest.raises(ValueError, match=match):
    KeyAffine.from_arrays(shift, scale)


def test_cache_spec_rules():
  affines = (_affine(0), _affine(1))
  with pytest.raises(ValueError, match="key_rope='pre'"):
    CacheSpec(k=LM4, v=LM4, key_affines=affines)
  spec = CacheSpec(k=LM4, v=LM4, key_rope="pre", key_affines=affines)
  assert spec.layer(1).key_affine == affines[1]
  with pytest.raises(ValueError, match="one per layer"):
    spec.check_num_layers(3)
  v_only = CacheSpec(k=None, v=LM4, key_rope="pre", key_affines=affines)
  assert v_only.layer(0).key_affine is None
  with pytest.raises(ValueError, match="another model"):
    QuantizedLayerCache.create(spec.layer(0), B, 16, K + 1, H)


def _inputs(total):
  rng = np.random.default_rng(0)
  normal = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)
  return (normal(B, total, K * G, H), normal(B, total, K, H) * 4 + 2,
          normal(B, total, K, H))


@jax.jit
def _run(cache, q, k, v):
  outs = []
  for start, size in ((0, 9), (9, 1), (10, 6)):
    positions = cache.length_B[:, None] + jnp.arange(size)[None, :]
    out, cache = cache.attend(q[:, start:start + size],
                              k[:, start:start + size],
                              v[:, start:start + size], positions, ROPE)
    outs.append(out)
  return jnp.concatenate(outs, axis=1)


def test_full_precision_tokens_with_affine_and_random_rotation_equal_dense():
  """Sinks + residual window hold every token: the affine and the seeded
  rotation must be undone exactly on the way back (float32 precision)."""
  q, k, v = _inputs(16)
  dense = _run(DenseLayerCache.create(B, 32, K, H), q, k, v)
  spec = LayerSpec(k=LM4, v=LM4, sink=4, residual=16, key_rope="pre",
                   hadamard_k=True, hadamard_v=True, rotation_key=(5, 0),
                   key_affine=_affine(), block_size=16,
                   window_dtype="float32")
  out = _run(QuantizedLayerCache.create(spec, B, 32, K, H), q, k, v)
  np.testing.assert_allclose(np.asarray(out), np.asarray(dense), atol=2e-5)


@jax.jit
def _prefill(cache, q, k, v):
  """One chunk: a third of `_run`'s program (the chunking is not the point
  where this is used)."""
  positions = jnp.broadcast_to(jnp.arange(q.shape[1]), q.shape[:2])
  return cache.attend(q, k, v, positions, ROPE)[0]


def test_quantized_error_shrinks_with_the_calibrated_shift():
  """Keys with a large common offset: removing it before per-token
  quantization gives a much closer attention output."""
  q, k, v = _inputs(16)
  k = k + 20.0
  dense = np.asarray(_prefill(DenseLayerCache.create(B, 32, K, H), q, k, v))
  mean = np.asarray(k).reshape(-1, K, H).mean(0)
  errors = {}
  for name, affine in (("none", None), ("shift", KeyAffine.from_arrays(
      mean, np.ones((K, H))))):
    spec = LayerSpec(k=LM4, v=None, key_rope="pre", hadamard_k=True,
                     rotation_key=(0, 0), key_affine=affine, block_size=16)
    out = np.asarray(_prefill(QuantizedLayerCache.create(spec, B, 32, K, H),
                              q, k, v))
    errors[name] = np.linalg.norm(out - dense) / np.linalg.norm(dense)
  assert errors["shift"] < 0.5 * errors["none"]


def test_constants_are_charged_per_layer():
  config = dataclasses.replace(TINY, num_layers=2)
  affines = (_affine(0), _affine(1))
  spec = CacheSpec(k=LM4, v=LM4, key_rope="pre", hadamard_k=True,
                   hadamard_v=True, rotation_seed=0, key_affines=affines)
  plain = dataclasses.replace(spec, key_affines=())
  n = 64
  with_aff = memory.effective_bytes(config, spec, jnp.float32, n)
  without = memory.effective_bytes(config, plain, jnp.float32, n)
  # Per layer: shift + scale, float32 [K, H] each.
  assert with_aff - without == config.num_layers * 2 * K * H * 4
  # Per token: codes + bf16 scale. K and V share one fixed 16-entry float32
  # Lloyd-Max codebook, stored once per model.
  per_token = config.num_layers * 2 * K * (H * 4 // 8 + 2)
  codebooks = codebook.centroids(4, H).nbytes
  assert without == per_token * n + codebooks


def test_float16_storage_rounds_once_and_halves_the_charge():
  """storage='float16': shift and scale rounded to nearest float16 once,
  read and written with the rounded values, charged 2 bytes a value."""
  config = dataclasses.replace(TINY, num_layers=2)
  wide = (_affine(0), _affine(1))
  half = tuple(dataclasses.replace(a, storage="float16") for a in wide)
  for w, h in zip(wide, half):
    for a32, a16 in zip(w.arrays(), h.arrays()):
      assert a16.dtype == np.float16
      np.testing.assert_array_equal(a16, a32.astype(np.float16))
    x = jax.random.normal(jax.random.PRNGKey(1), (B, K, 5, H)) * 5
    shift, scale = (a.astype(np.float64) for a in h.arrays())
    np.testing.assert_allclose(np.asarray(h.normalize(x)),
                               (np.asarray(x) - shift[:, None])
                               / scale[:, None], rtol=1e-5, atol=1e-5)
  spec = CacheSpec(k=LM4, v=LM4, key_rope="pre", key_affines=wide)
  spec16 = dataclasses.replace(spec, key_affines=half)
  saved = (memory.effective_bytes(config, spec, jnp.float32, 64)
           - memory.effective_bytes(config, spec16, jnp.float32, 64))
  assert saved == config.num_layers * 2 * K * H * (4 - 2)
  # Beyond float16's range (a shift of 1e5 overflows, a scale of 1e-9
  # flushes to 0): refused, not stored wrong.
  for shift, scale in ((1e5, 1.0), (0.0, 1e-9)):
    with pytest.raises(ValueError, match="in storage float16"):
      KeyAffine(shift=np.full((K, H), shift), scale=np.full((K, H), scale),
                storage="float16")
  with pytest.raises(ValueError, match="storage='float64'"):
    dataclasses.replace(wide[0], storage="float64")


def _rotation(seed=0, k=K, h=H):
  rng = np.random.default_rng(seed)
  return np.stack([np.linalg.qr(rng.standard_normal((h, h)))[0]
                   for _ in range(k)])


def test_rotated_affine_round_trip():
  """normalize = R (x - shift) / scale; denormalize undoes it to float
  precision."""
  plain, rot = _affine(), _rotation()
  affine = KeyAffine.from_arrays(*plain.arrays(), rotation_KxHxH=rot)
  x = np.asarray(jax.random.normal(jax.random.PRNGKey(1), (B, K, 7, H))) * 5
  shift, scale, stored = affine.arrays()
  np.testing.assert_allclose(stored, rot, rtol=1e-6, atol=1e-7)
  want = np.einsum("kch,bkth->bktc", rot, x - shift[:, None]) / scale[:, None]
  y = affine.normalize(jnp.asarray(x))
  np.testing.assert_allclose(np.asarray(y), want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(affine.denormalize(y)), x,
                             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rotation, match", [
    (np.ones((K, H, H)), "orthogonal"),
    (np.eye(H)[None].repeat(K + 1, 0), "shape"),
])
def test_invalid_rotations(rotation, match):
  with pytest.raises(ValueError, match=match):
    KeyAffine.from_arrays(*_affine().arrays(), rotation_KxHxH=rotation)


def test_full_precision_tokens_with_a_rotated_affine_equal_dense():
  q, k, v = _inputs(16)
  dense = _run(DenseLayerCache.create(B, 32, K, H), q, k, v)
  affine = KeyAffine.from_arrays(*_affine().arrays(),
                                 rotation_KxHxH=_rotation(2))
  spec = LayerSpec(k=LM4, v=LM4, sink=4, residual=16, key_rope="pre",
                   key_affine=affine, block_size=16, window_dtype="float32")
  out = _run(QuantizedLayerCache.create(spec, B, 32, K, H), q, k, v)
  np.testing.assert_allclose(np.asarray(out), np.asarray(dense), atol=3e-5)


def test_rotations_are_charged_per_layer():
  config = dataclasses.replace(TINY, num_layers=2)
  plain = (_affine(0), _affine(1))
  rotated = tuple(KeyAffine.from_arrays(*a.arrays(), rotation_KxHxH=_rotation(
      i)) for i, a in enumerate(plain))
  spec = CacheSpec(k=LM4, v=LM4, key_rope="pre", key_affines=plain)
  with_rot = memory.effective_bytes(
      config, dataclasses.replace(spec, key_affines=rotated), jnp.float32, 64)
  without = memory.effective_bytes(config, spec, jnp.float32, 64)
  # Per layer: R, float32 [K, H, H].
  assert with_rot - without == config.num_layers * K * H * H * 4
