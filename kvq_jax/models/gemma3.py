"""Gemma 3 (text) decoder: the llama skeleton with Gemma's differences.

Checked against transformers' `models/gemma3/modeling_gemma3.py` and
llama.cpp's gemma3 graph:
  * token embeddings times sqrt(hidden_size) (the normaliser cast to the
    compute dtype, as HF does);
  * sandwich norms: x + post_attn_norm(attn(attn_norm(x))), then
    x + post_mlp_norm(mlp(mlp_norm(x)));
  * per-head RMSNorm of q and k over head_dim before RoPE;
  * RMSNorm is x * rsqrt(mean(x^2) + eps) * (1 + w), multiplied in float32;
    the stored weights already hold 1 + w (convert_hf_to_gguf adds 1 to every
    `*norm.weight`, q/k norms included; `loaders/hf.py` does the same), so
    the shared RMSNorm uses them as is;
  * GeGLU MLP: down(gelu_tanh(gate(x)) * up(x));
  * attention logits scaled by 1/sqrt(query_pre_attn_scalar);
  * sliding-window attention on `config.local_layers` with RoPE base
    `config.rope_local_theta`, global attention (base `rope_theta`) on the
    others -- the window itself is applied by the layer's KV cache;
  * tied LM head; optional final-logit soft-capping (None for Gemma 3).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from kvq_jax.cache.base import LayerCache
from kvq_jax.models.attention import Attention
from kvq_jax.models.config import ModelConfig
from kvq_jax.models.decoder import Decoder, layer_rope
from kvq_jax.models.layers import GatedMLP, RMSNorm


def gemma_norm(dim: int, config: ModelConfig, *, dtype,
               param_dtype) -> RMSNorm:
  """Gemma3RMSNorm with the (1 + w) already folded into the weight."""
  return RMSNorm(dim, eps=config.rms_norm_eps, dtype=dtype,
                 param_dtype=param_dtype, weight_in_float32=True)


class Gemma3Block(nnx.Module):
  """Pre- and post-normed attention and GeGLU MLP residual branches."""

  def __init__(self, config: ModelConfig, index: int, *, dtype=jnp.float32,
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    kw = dict(dtype=dtype, param_dtype=param_dtype)
    d = config.hidden_size
    self.attn_norm = gemma_norm(d, config, **kw)
    self.attn = Attention(config, rope=layer_rope(config, index),
                          qk_norm=True, rngs=rngs, **kw)
    self.post_attn_norm = gemma_norm(d, config, **kw)
    self.mlp_norm = gemma_norm(d, config, **kw)
    self.mlp = GatedMLP(d, config.intermediate_size, activation="gelu_tanh",
                        rngs=rngs, **kw)
    self.post_mlp_norm = gemma_norm(d, config, **kw)

  def __call__(self, x_BxTxD: jax.Array, positions_BxT: jax.Array,
               layer_cache: LayerCache) -> tuple[jax.Array, LayerCache]:
    attn_out, new_cache = self.attn(self.attn_norm(x_BxTxD), positions_BxT,
                                    layer_cache)
    x_BxTxD = x_BxTxD + self.post_attn_norm(attn_out)
    x_BxTxD = x_BxTxD + self.post_mlp_norm(self.mlp(self.mlp_norm(x_BxTxD)))
    return x_BxTxD, new_cache


class Gemma3Decoder(Decoder):
  """Gemma 3 text LM, the `Decoder` interface (same attributes and calls)."""

  def __init__(self, config: ModelConfig, *, dtype=jnp.float32,
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    if config.name != "gemma3":
      raise ValueError(f"Gemma3Decoder: config.name={config.name!r}; "
                       "allowed: 'gemma3'.")
    super().__init__(config, dtype=dtype, param_dtype=param_dtype, rngs=rngs)

  def make_block(self, config: ModelConfig, index: int, *, dtype,
                 param_dtype, rngs: nnx.Rngs) -> Gemma3Block:
    return Gemma3Block(config, index, dtype=dtype, param_dtype=param_dtype,
                       rngs=rngs)

  def make_norm(self, dim: int, *, dtype, param_dtype) -> RMSNorm:
    return gemma_norm(dim, self.config, dtype=dtype, param_dtype=param_dtype)

  def embed_scale(self) -> float:
    return float(self.config.hidden_size) ** 0.5
