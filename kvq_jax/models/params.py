"""The loader parameter layout <-> Decoder, plus random weights of any shape.

Layout (numpy float32, kernels [in, out], Q/K in HF rotate_half convention):

  {'embed': [V, D], 'lm_head': [D, V] (untied only), 'final_norm': [D],
   'layers': [{'attn_norm': [D],
               'q': {'kernel': [D, N*H], 'bias': [N*H] (attention_bias)},
               'k': {...[D, K*H]}, 'v': {...[D, K*H]},
               'o': {'kernel': [N*H, D]}, 'mlp_norm': [D],
               'gate': {'kernel': [D, F]}, 'up': {'kernel': [D, F]},
               'down': {'kernel': [F, D]}}, ...]}
"""

from __future__ import annotations

from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from kvq_jax.models.config import ModelConfig
from kvq_jax.models.decoder import Decoder

Params = dict[str, Any]


def param_shapes(config: ModelConfig) -> Params:
  """The expected layout with shape tuples in place of arrays."""
  d, f, v = config.hidden_size, config.intermediate_size, config.vocab_size
  nh = config.num_heads * config.head_dim
  kh = config.num_kv_heads * config.head_dim

  def proj(i, o, bias):
    return {"kernel": (i, o), **({"bias": (o,)} if bias else {})}

  bias = config.attention_bias
  layer = {"attn_norm": (d,), "q": proj(d, nh, bias), "k": proj(d, kh, bias),
           "v": proj(d, kh, bias), "o": proj(nh, d, False), "mlp_norm": (d,),
           "gate": proj(d, f, False), "up": proj(d, f, False),
           "down": proj(f, d, False)}
  shapes = {"embed": (v, d), "final_norm": (d,),
            "layers": [layer for _ in range(config.num_layers)]}
  if not config.tie_embeddings:
    shapes["lm_head"] = (d, v)
  return shapes


def random_params(config: ModelConfig, seed: int = 0,
                  scale: float = 0.02) -> Params:
  """Random float32 weights in the loader layout (norm weights near 1)."""
  rng = np.random.default_rng(seed)

  def fill(path: str, shape):
    if isinstance(shape, dict):
      return {k: fill(f"{path}.{k}", s) for k, s in shape.items()}
    if isinstance(shape, list):
      return [fill(f"{path}[{i}]", s) for i, s in enumerate(shape)]
    if path.endswith("norm"):
      return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    return (scale * rng.standard_normal(shape)).astype(np.float32)

  return fill("", param_shapes(config))


def _variables(model: Decoder) -> Iterator[tuple[str, nnx.Param]]:
  """(dict path, Param) pairs in the loader layout."""
  yield "embed", model.embed
  if model.lm_head is not None:
    yield "lm_head", model.lm_head
  yield "final_norm", model.final_norm.weight
  for i, block in enumerate(model.layers):
    p = f"layers.{i}."
    yield p + "attn_norm", block.attn_norm.weight
    yield p + "mlp_norm", block.mlp_norm.weight
    for name in ("q", "k", "v", "o"):
      dense = getattr(block.attn, name)
      yield p + f"{name}.kernel", dense.kernel
      if dense.bias is not None:
        yield p + f"{name}.bias", dense.bias
    for name in ("gate", "up", "down"):
      yield p + f"{name}.kernel", getattr(block.mlp, name).kernel


def _lookup(params: Params, path: str):
  node = params
  for key in path.split("."):
    try:
      node = node[int(key)] if isinstance(node, (list, tuple)) else node[key]
    except (KeyError, IndexError, TypeError) as e:
      raise ValueError(f"params['{path}']: missing ({key!r} not found).") from e
  return node


def load_params(model: Decoder, params: Params) -> Decoder:
  """Copies the loader dict into `model` in place (cast to its param dtype)."""
  num_layers = len(params.get("layers", []))
  if num_layers != model.config.num_layers:
    raise ValueError(
        f"params['layers'] has {num_layers} entries; config.num_layers="
        f"{model.config.num_layers}.")
  for path, variable in _variables(model):
    value = np.asarray(_lookup(params, path))
    if value.shape != variable.shape:
      raise ValueError(
          f"params['{path}'] has shape {value.shape}; the config expects "
          f"{variable.shape}.")
    variable.set_value(jnp.asarray(value, dtype=model.param_dtype))
  return model


def params_dict(model: Decoder) -> Params:
  """The model's weights as a numpy float32 dict in the loader layout."""
  out: Params = {"layers": [{} for _ in range(model.config.num_layers)]}
  for path, variable in _variables(model):
    node, keys = out, path.split(".")
    for key in keys[:-1]:
      node = node[int(key)] if key.isdigit() else node.setdefault(key, {})
    node[keys[-1]] = np.asarray(jax.device_get(variable[...]), np.float32)
  return out


def decoder_from_params(config: ModelConfig, params: Params, *,
                        dtype=jnp.float32,
                        param_dtype=jnp.float32) -> Decoder:
  """A Decoder holding `params` (no random initialisation is materialised)."""
  model = nnx.eval_shape(lambda: Decoder(
      config, dtype=dtype, param_dtype=param_dtype, rngs=nnx.Rngs(0)))
  return load_params(model, params)
