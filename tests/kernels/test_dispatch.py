"""Implementation choice and fallback of `quantized_decode_attention`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kvq_jax.kernels.dispatch import quantized_decode_attention
from kvq_jax.kernels.reference import decode_attention_reference
from kvq_jax.quant import QuantSpec, quantize

ON_CPU = jax.default_backend() == "cpu"


def _cache(spec=QuantSpec("int4", "symmetric", "per_group", 32)):
  kq, kk, kv = jax.random.split(jax.random.PRNGKey(0), 3)
  q = jax.random.normal(kq, (1, 1, 2, 64))
  k = quantize(jax.random.normal(kk, (1, 1, 32, 64)), spec)
  v = quantize(jax.random.normal(kv, (1, 1, 32, 64)), spec)
  return q, k, v, jnp.array([20])


@pytest.mark.skipif(not ON_CPU, reason="CPU-only behaviour.")
def test_explicit_pallas_on_cpu_without_interpret_raises():
  q, k, v, length = _cache()
  with pytest.raises(ValueError, match="only with interpret=True"):
    quantized_decode_attention(q, k, v, length, implementation="pallas")


@pytest.mark.skipif(not ON_CPU, reason="CPU-only behaviour.")
def test_tuple_falls_back_to_xla_with_warning():
  q, k, v, length = _cache()
  with pytest.warns(UserWarning, match="'pallas' is unavailable.*interpret"):
    out = quantized_decode_attention(q, k, v, length,
                                     implementation=("pallas", "xla"))
  np.testing.assert_allclose(out, decode_attention_reference(q, k, v, length))


def test_unsupported_format_explicit_raises_and_tuple_falls_back():
  q, k, v, length = _cache(QuantSpec("fp8_e4m3", "symmetric", "per_token"))
  with pytest.raises(ValueError, match="fp8_e4m3"):
    quantized_decode_attention(q, k, v, length, implementation="pallas",
                               interpret=True)
  with pytest.warns(UserWarning, match="fp8_e4m3"):
    out = quantized_decode_attention(q, k, v, length, interpret=True)
  np.testing.assert_allclose(out, decode_attention_reference(q, k, v, length))


def test_pallas_interpret_and_xla_agree_with_lse():
  q, k, v, length = _cache()
  out, lse = quantized_decode_attention(q, k, v, length,
                                        implementation="pallas",
                                        interpret=True, block_k=16,
                                        return_lse=True)
  want, want_lse = quantized_decode_attention(q, k, v, length,
                                              implementation="xla",
                                              return_lse=True)
  np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(lse, want_lse, rtol=1e-5, atol=1e-5)


def test_bad_implementation_name_raises():
  q, k, v, length = _cache()
  with pytest.raises(ValueError, match="implementation='triton'"):
    quantized_decode_attention(q, k, v, length, implementation="triton")
  with pytest.raises(ValueError, match="implementation=\\(\\)"):
    quantized_decode_attention(q, k, v, length, implementation=())
