"""The decode kernel reads signed (full-level symmetric) and narrow scales.

Full-level symmetric groups whose signed max is positive store a negative
scale; the kernel's `(u - offset) * scale` must read it as is, and
symmetric_narrow must use the same scale-only layout. Pallas runs in
interpret mode (CPU); the oracle is the jnp reference.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kvq_jax.kernels.cache_layout import describe_packed
from kvq_jax.kernels.decode_attention import decode_attention
from kvq_jax.kernels.decode_attention import decode_attention_reference
from kvq_jax.kernels.reference import dequantize_cache
from kvq_jax.quant import QuantSpec, dequantize, ggml_spec, quantize


def _inputs(seed, *, batch=2, slots=128, head_dim=64):
  kq, kk, kv = jax.random.split(jax.random.PRNGKey(seed), 3)
  q = jax.random.normal(kq, (batch, 1, 2, head_dim))
  k = jax.random.normal(kk, (batch, 1, slots, head_dim))
  v = jax.random.normal(kv, (batch, 1, slots, head_dim))
  return q, k, v


SPECS = {
    "int4_g32": (QuantSpec("int4", "symmetric", "per_group", 32),) * 2,
    "int8_narrow_tok": (QuantSpec("int8", "symmetric_narrow", "per_token"),) * 2,
    "int2_pc_narrow": (
        QuantSpec("int2", "symmetric_narrow", "per_channel", 32, axis=-2,
                  scale_dtype="float32"),
        QuantSpec("int2", "symmetric", "per_group", 32)),
    "q4_0_q8_0": (ggml_spec("q4_0"), ggml_spec("q8_0")),
}


@pytest.mark.parametrize("name", list(SPECS))
def test_kernel_matches_reference(name):
  k_spec, v_spec = SPECS[name]
  q, k, v = _inputs(0)
  kq, vq = quantize(k, k_spec), quantize(v, v_spec)
  for x, spec in ((kq, k_spec), (vq, v_spec)):
    layout = describe_packed(x, 64, "k", 128)
    assert not isinstance(layout, str) and layout.symmetric
    # The reference's own unpacking agrees with the library exactly.
    np.testing.assert_array_equal(dequantize_cache(x, 64),
                                  dequantize(x, jnp.float32))
    if spec.scheme == "symmetric":
      scales = np.asarray(x.scale, np.float32)
      assert (scales < 0).any() and (scales > 0).any()
  length = jnp.array([100, 37], jnp.int32)
  out = decode_attention(q, kq, vq, length, block_k=32, k_splits=2,
                         interpret=True)
  want = decode_attention_reference(q, kq, vq, length)
  err = np.linalg.norm(np.asarray(out) - np.asarray(want))
  assert err <= 1e-5 * np.linalg.norm(np.asarray(want))
