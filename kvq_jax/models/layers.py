"""Building blocks of the decoder: RMSNorm, dense projection, SwiGLU MLP."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

_KERNEL_INIT = nnx.initializers.normal(stddev=0.02)


class RMSNorm(nnx.Module):
  """Hugging Face LlamaRMSNorm: `x * rsqrt(mean(x^2) + eps) * weight`.

  Statistics in float32; the normalised activations are cast back to the
  compute dtype before the weight multiply, as HF does.
  """

  def __init__(self, dim: int, *, eps: float, dtype=jnp.float32,
               param_dtype=jnp.float32):
    self.eps = eps
    self.dtype = dtype
    self.weight = nnx.Param(jnp.ones((dim,), param_dtype))

  def __call__(self, x_BxTxD: jax.Array) -> jax.Array:
    x = x_BxTxD.astype(jnp.float32)
    inv_rms_BxTx1 = jax.lax.rsqrt(
        jnp.mean(jnp.square(x), axis=-1, keepdims=True) + self.eps)
    normed = (x * inv_rms_BxTx1).astype(self.dtype)
    return normed * self.weight[...].astype(self.dtype)


class Dense(nnx.Module):
  """`x @ kernel (+ bias)` with kernel stored [in, out]."""

  def __init__(self, in_features: int, out_features: int, *, use_bias: bool,
               dtype=jnp.float32, param_dtype=jnp.float32, rngs: nnx.Rngs):
    self.dtype = dtype
    self.kernel = nnx.Param(
        _KERNEL_INIT(rngs.params(), (in_features, out_features), param_dtype))
    self.bias = (nnx.Param(jnp.zeros((out_features,), param_dtype))
                 if use_bias else None)

  def __call__(self, x: jax.Array) -> jax.Array:
    y = jnp.einsum("...i,io->...o", x.astype(self.dtype),
                   self.kernel[...].astype(self.dtype))
    if self.bias is not None:
      y = y + self.bias[...].astype(self.dtype)
    return y


class SwiGLU(nnx.Module):
  """down(silu(gate(x)) * up(x))."""

  def __init__(self, dim: int, hidden: int, *, dtype=jnp.float32,
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    kw = dict(use_bias=False, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.gate = Dense(dim, hidden, **kw)
    self.up = Dense(dim, hidden, **kw)
    self.down = Dense(hidden, dim, **kw)

  def __call__(self, x_BxTxD: jax.Array) -> jax.Array:
    return self.down(jax.nn.silu(self.gate(x_BxTxD)) * self.up(x_BxTxD))
