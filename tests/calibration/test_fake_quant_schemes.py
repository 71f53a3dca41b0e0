"""fake_quant follows the library's schemes and clipping rules.

Full-level symmetric (signed scale from the group's signed max),
symmetric_narrow (absmax / qmax) and asymmetric clipping around the group's
centre, each against quantize -> dequantize with float32 scales.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kvq_jax.calibration.fake_quant import fake_quant
from kvq_jax.quant import QuantSpec, dequantize, quantize


def _x():
  x = jax.random.normal(jax.random.PRNGKey(3), (2, 3, 16, 32)) * 2.0
  return x.at[0, 0, :, 5].set(-9.0)  # Some groups' largest value negative.


@pytest.mark.parametrize("spec", [
    QuantSpec("int4", "symmetric", "per_group", 16),
    QuantSpec("int5", "symmetric", "per_token"),
    QuantSpec("int4", "symmetric_narrow", "per_group", 16),
    QuantSpec("int8", "symmetric_narrow", "per_channel", 8, axis=-2),
    QuantSpec("int3", "asymmetric", "per_group", 8),
    QuantSpec("int4", "asymmetric", "per_channel", 8, axis=-2),
], ids=lambda s: f"{s.format}-{s.scheme}-{s.granularity}")
@pytest.mark.parametrize("clip", [1.0, 0.7])
def test_fake_quant_matches_the_library(spec, clip):
  spec = QuantSpec(spec.format, spec.scheme, spec.granularity,
                   spec.group_size, axis=spec.axis, clip_ratio=clip,
                   scale_dtype="float32")
  x = _x()
  want = dequantize(quantize(x, spec), jnp.float32)
  got = fake_quant(x, spec, jnp.float32(clip))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_asymmetric_clip_keeps_the_centre():
  # One group [0, 10]: clip 0.5 keeps [2.5, 7.5] around the centre 5, so
  # 0 and 10 saturate at 2.5 and 7.5 (not at 0 and 5, as scaling would).
  spec = QuantSpec("int8", "asymmetric", "per_token", scale_dtype="float32")
  x = jnp.linspace(0.0, 10.0, 8)[None]
  out = np.asarray(fake_quant(x, spec, jnp.float32(0.5)))
  np.testing.assert_allclose(out[0, [0, -1]], [2.5, 7.5], rtol=1e-6)


def test_clip_gradient_is_finite_for_signed_scales():
  spec = QuantSpec("int4", "symmetric", "per_group", 16)
  x = _x()
  loss = lambda c: jnp.sum((fake_quant(x, spec, c) - x) ** 2)  # noqa: E731
  grad = jax.grad(loss)(jnp.float32(0.8))
  assert np.isfinite(float(grad)) and float(grad) != 0.0
