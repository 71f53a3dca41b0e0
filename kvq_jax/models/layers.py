"""Building blocks of the decoders: RMSNorm, dense projection, gated MLP."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

_KERNEL_INIT = nnx.initializers.normal(stddev=0.02)


class RMSNorm(nnx.Module):
  """`x * rsqrt(mean(x^2) + eps) * weight` over the last axis.

  Statistics in float32. By default the normalised activations are cast back
  to the compute dtype before the weight multiply (Hugging Face
  LlamaRMSNorm); with `weight_in_float32` the multiply happens in float32
  and only the product is cast (Gemma3RMSNorm). Gemma's `(1 + w)` is not
  special-cased: the stored weight already is `1 + w` (llama.cpp's GGUF
  convention, which the Hugging Face loader reproduces).
  """

  def __init__(self, dim: int, *, eps: float, dtype=jnp.float32,
               param_dtype=jnp.float32, weight_in_float32: bool = False):
    self.eps = eps
    self.dtype = dtype
    self.weight_in_float32 = weight_in_float32
    self.weight = nnx.Param(jnp.ones((dim,), param_dtype))

  def __call__(self, x_BxTxD: jax.Array) -> jax.Array:
    x = x_BxTxD.astype(jnp.float32)
    inv_rms_BxTx1 = jax.lax.rsqrt(
        jnp.mean(jnp.square(x), axis=-1, keepdims=True) + self.eps)
    if self.weight_in_float32:
      return (x * inv_rms_BxTx1 * self.weight[...].astype(jnp.float32)
              ).astype(self.dtype)
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


# Gate activations of `GatedMLP`. 'gelu_tanh' is the tanh approximation
# (PyTorch's gelu(approximate='tanh'), HF's 'gelu_pytorch_tanh').
ACTIVATIONS = {
    "silu": jax.nn.silu,
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
}


class GatedMLP(nnx.Module):
  """down(act(gate(x)) * up(x)): SwiGLU with 'silu', GeGLU with 'gelu_tanh'."""

  def __init__(self, dim: int, hidden: int, *, activation: str = "silu",
               dtype=jnp.float32, param_dtype=jnp.float32, rngs: nnx.Rngs):
    if activation not in ACTIVATIONS:
      raise ValueError(f"GatedMLP.activation={activation!r}: allowed are "
                       f"{sorted(ACTIVATIONS)}.")
    kw = dict(use_bias=False, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.activation = activation
    self.gate = Dense(dim, hidden, **kw)
    self.up = Dense(dim, hidden, **kw)
    self.down = Dense(hidden, dim, **kw)

  def __call__(self, x_BxTxD: jax.Array) -> jax.Array:
    act = ACTIVATIONS[self.activation]
    return self.down(act(self.gate(x_BxTxD)) * self.up(x_BxTxD))
