"""Pallas decode kernel vs the jnp reference on the same packed cache.

Both paths dequantize identically, so they differ only by float summation
order: the bound is relative L2 error <= 1e-5 in interpret mode (f32 dots)
and <= 1e-3 compiled (TF32 / bf16-pass dots on accelerators).
`TestDecodeAttention` runs compiled and skips on CPU;
`TestDecodeAttentionInterpret` runs the Pallas interpreter (CI, CPU).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kvq_jax.kernels.decode_attention import decode_attention
from kvq_jax.kernels.decode_attention import decode_attention_dense
from kvq_jax.kernels.decode_attention import decode_attention_reference
from kvq_jax.kernels.decode_attention import decode_attention_supported
from kvq_jax.quant import QuantSpec, quantize
from tests.kernels.kernel_case import KernelCase

LENGTHS = (37, 200, 1)  # Ragged, not multiples of the block.


def _spec(fmt, scheme, granularity, *, keys=False):
  if granularity == "per_token":
    return QuantSpec(fmt, scheme, "per_token")
  if granularity == "per_group":
    return QuantSpec(fmt, scheme, "per_group", 32)
  # KIVI: per-channel keys over 32-token groups, per_group values.
  if keys:
    return QuantSpec(fmt, scheme, "per_channel", 32, axis=-2,
                     scale_dtype="float32")
  return QuantSpec(fmt, scheme, "per_group", 32)


def _inputs(seed, *, batch=3, kv_heads=1, g=3, slots=256, head_dim=64):
  kq, kk, kv = jax.random.split(jax.random.PRNGKey(seed), 3)
  q = jax.random.normal(kq, (batch, kv_heads, g, head_dim))
  k = jax.random.normal(kk, (batch, kv_heads, slots, head_dim))
  v = jax.random.normal(kv, (batch, kv_heads, slots, head_dim))
  return q, k, v


def _rel_l2(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


# Pruned product: every format at per_group g32, per_token and per-channel
# keys on a rotation of formats/schemes (more in the mixed test). The scheme
# only adds the zero-point term (`_load_plane`), whatever the bits and scale
# layout, so each (format, scheme) pair runs once over all granularities:
# int8 sym/asym, int4 sym/asym and int2 sym/asym all appear below.
FORMAT_CASES = [
    ("int8", "asymmetric", "per_group"), ("int4", "symmetric", "per_group"),
    ("int2", "asymmetric", "per_group"),
    ("int8", "symmetric", "per_token"), ("int4", "asymmetric", "per_token"),
    ("int2", "symmetric", "per_token"),
    ("int8", "asymmetric", "per_channel"),
    ("int4", "symmetric", "per_channel")]


class TestDecodeAttention(KernelCase):
  """See `KernelCase`."""

  def _check(self, q, k, v, lengths, **kw):
    length = jnp.array(lengths, jnp.int32)
    out, lse = decode_attention(q, k, v, length, interpret=self.INTERPRET,
                                return_lse=True, **kw)
    want, want_lse = decode_attention_reference(q, k, v, length,
                                                return_lse=True)
    assert out.shape == q.shape and out.dtype == jnp.float32
    assert np.all(np.isfinite(np.asarray(out)))
    assert _rel_l2(out, want) <= self.tol
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(want_lse))
    finite = np.isfinite(np.asarray(want_lse))
    np.testing.assert_allclose(np.asarray(lse)[finite],
                               np.asarray(want_lse)[finite],
                               rtol=self.tol, atol=self.tol)
    return out, lse

  @pytest.mark.parametrize("fmt,scheme,granularity", FORMAT_CASES)
  def test_formats(self, fmt, scheme, granularity):
    q, k, v = _inputs(0)
    kq = quantize(k, _spec(fmt, scheme, granularity, keys=True))
    vq = quantize(v, _spec(fmt, scheme, granularity))
    self._check(q, kq, vq, LENGTHS, block_k=64, k_splits=2)

  @pytest.mark.parametrize("g", [1, 3, 8])
  def test_gqa_ratios(self, g):
    q, k, v = _inputs(1, batch=2, kv_heads=2, g=g, slots=128)
    spec = _spec("int4", "asymmetric", "per_group")
    self._check(q, quantize(k, spec), quantize(v, spec), (100, 5),
                block_k=32)

  def test_empty_sequence_gives_zeros_and_neg_inf_lse(self):
    q, k, v = _inputs(2, batch=3, slots=128)
    spec = _spec("int8", "symmetric", "per_token")
    out, lse = self._check(q, quantize(k, spec), quantize(v, spec),
                           (0, 128, 65), block_k=32, k_splits=4)
    np.testing.assert_array_equal(out[0], 0.0)
    assert np.all(np.isneginf(np.asarray(lse[0])))
    assert np.all(np.isfinite(np.asarray(lse[1:])))

  def test_mixed_formats_small_head_dim_and_block_inside_token_group(self):
    # int2 per-channel keys (token group 32 spans two blocks of 16) with int8
    # per-token values, head_dim 32.
    q, k, v = _inputs(3, batch=2, slots=128, head_dim=32)
    kq = quantize(k, _spec("int2", "asymmetric", "per_channel", keys=True))
    vq = quantize(v, _spec("int8", "symmetric", "per_token"))
    self._check(q, kq, vq, (77, 128), block_k=16, k_splits=2)

  def test_dense_variant(self):
    q, k, v = _inputs(4, batch=2, slots=128)
    k, v = k.astype(jnp.bfloat16), v.astype(jnp.bfloat16)
    length = jnp.array([90, 3], jnp.int32)
    out = decode_attention_dense(q, k, v, length, block_k=32,
                                 interpret=self.INTERPRET)
    want = decode_attention_reference(q, k, v, length)
    assert _rel_l2(out, want) <= self.tol


class TestDecodeAttentionInterpret(TestDecodeAttention):
  INTERPRET = True


# Validation runs no kernel: it is plain trace-time checking.


def _quantized(spec, slots=128, head_dim=64):
  _, k, _ = _inputs(5, batch=1, slots=slots, head_dim=head_dim)
  return quantize(k, spec)


@pytest.mark.parametrize("spec,match", [
    (QuantSpec("fp8_e4m3", "symmetric", "per_token"), "fp8_e4m3.*int8, int4"),
    (QuantSpec("int3", "symmetric", "per_token"), "int3"),
    (QuantSpec("int8", "symmetric", "per_tensor"), "per_tensor"),
])
def test_unsupported_formats_raise(spec, match):
  q = jnp.zeros((1, 1, 2, 64))
  x = _quantized(spec)
  with pytest.raises(ValueError, match=match):
    decode_attention(q, x, x, jnp.array([3]), interpret=True)


def test_untileable_shapes_raise():
  q = jnp.zeros((1, 1, 2, 64))
  x = _quantized(_spec("int4", "symmetric", "per_token"), slots=96)
  assert "power of two" in decode_attention_supported(
      q, x, x, jnp.array([3]), block_k=48)
  with pytest.raises(ValueError, match="S=96 is not a multiple of block_k=64"):
    decode_attention(q, x, x, jnp.array([3]), block_k=64, interpret=True)
  with pytest.raises(ValueError, match="k_splits=5"):
    decode_attention(q, x, x, jnp.array([3]), block_k=32, k_splits=5,
                     interpret=True)


def test_block_not_multiple_of_token_group_raises():
  q = jnp.zeros((1, 1, 2, 64))
  k = _quantized(QuantSpec("int4", "symmetric", "per_channel", 48, axis=-2),
                 slots=192)
  v = _quantized(_spec("int4", "symmetric", "per_token"), slots=192)
  with pytest.raises(ValueError, match="token group 48"):
    decode_attention(q, k, v, jnp.array([3]), block_k=64, interpret=True)


def test_shape_mismatch_raises():
  x = _quantized(_spec("int8", "symmetric", "per_token"))
  with pytest.raises(ValueError, match="q has shape"):
    decode_attention(jnp.zeros((1, 2, 2, 64)), x, x, jnp.array([3]),
                     interpret=True)
  with pytest.raises(ValueError, match="length_B"):
    decode_attention(jnp.zeros((1, 1, 2, 64)), x, x, jnp.array([3, 4]),
                     interpret=True)
