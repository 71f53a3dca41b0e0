"""The loader parameter layout <-> decoder modules, plus random weights.

The layout itself (nested dict of numpy float32 leaves, kernels [in, out],
Q/K in HF rotate_half order, Gemma norm weights holding 1 + w) is defined in
`loaders/param_layout.py`; `param_shapes` is its `expected_shapes`. The
decoder class is chosen by `config.name` (`decoder_class`).
"""

from __future__ import annotations

from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from kvq_jax.loaders import param_layout
from kvq_jax.models.config import ModelConfig
from kvq_jax.models.decoder import Decoder
from kvq_jax.models.gemma3 import Gemma3Decoder

Params = dict[str, Any]

# config.name -> decoder class.
DECODER_CLASSES: dict[str, type[Decoder]] = {
    "llama": Decoder, "qwen2": Decoder, "gemma3": Gemma3Decoder}

# Layer key of the layout -> attribute path inside a block.
_LAYER_MODULES = {
    "attn_norm": "attn_norm", "post_attn_norm": "post_attn_norm",
    "mlp_norm": "mlp_norm", "post_mlp_norm": "post_mlp_norm",
    "q_norm": "attn.q_norm", "k_norm": "attn.k_norm",
    "q": "attn.q", "k": "attn.k", "v": "attn.v", "o": "attn.o",
    "gate": "mlp.gate", "up": "mlp.up", "down": "mlp.down",
}


def decoder_class(config: ModelConfig) -> type[Decoder]:
  """The decoder module class of `config.name`."""
  if config.name not in DECODER_CLASSES:
    raise ValueError(f"config.name={config.name!r}: no decoder; allowed: "
                     f"{sorted(DECODER_CLASSES)}.")
  return DECODER_CLASSES[config.name]


def param_shapes(config: ModelConfig) -> Params:
  """The expected layout with shape tuples in place of arrays."""
  return param_layout.expected_shapes(config)


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


def _attribute(module: Any, path: str) -> Any:
  for name in path.split("."):
    module = getattr(module, name, None)
    if module is None:
      break
  return module


def _variables(model: Decoder) -> Iterator[tuple[str, nnx.Param]]:
  """(dict path, Param) pairs in the loader layout, driven by the layout of
  `model.config` (so the module tree and the layout cannot drift apart)."""
  shapes = param_shapes(model.config)
  yield "embed", model.embed
  if "lm_head" in shapes:
    yield "lm_head", model.lm_head
  yield "final_norm", model.final_norm.weight
  for i, (block, layer_shapes) in enumerate(zip(model.layers,
                                                shapes["layers"])):
    for key, shape in layer_shapes.items():
      module = _attribute(block, _LAYER_MODULES[key])
      if module is None:
        raise ValueError(
            f"{type(model).__name__} layer {i} has no module "
            f"{_LAYER_MODULES[key]!r} for the layout key {key!r}.")
      if not isinstance(shape, dict):
        yield f"layers.{i}.{key}", module.weight
        continue
      for leaf in shape:
        yield f"layers.{i}.{key}.{leaf}", getattr(module, leaf)


def _lookup(params: Params, path: str):
  node = params
  for key in path.split("."):
    try:
      node = node[int(key)] if isinstance(node, (list, tuple)) else node[key]
    except (KeyError, IndexError, TypeError) as e:
      raise ValueError(f"params['{path}']: missing ({key!r} not found).") from e
  return node


def _drop(params: Params, path: str) -> None:
  """Replaces the leaf at `path` by None (its array can be freed)."""
  *parents, last = path.split(".")
  node = params
  for key in parents:
    node = node[int(key)] if isinstance(node, (list, tuple)) else node[key]
  if isinstance(node, list):
    node[int(last)] = None
  else:
    node[last] = None


def load_params(model: Decoder, params: Params,
                consume: bool = False) -> Decoder:
  """Copies the loader dict into `model` in place (cast to its param dtype).

  `consume` drops each numpy leaf from `params` once it is on the device, so
  a caller that owns the dict never holds the model twice (a 1.5B model's
  float32 weights are 6.2 GB).
  """
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
    if consume:
      del value
      _drop(params, path)
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
                        dtype=jnp.float32, param_dtype=jnp.float32,
                        consume: bool = False) -> Decoder:
  """The decoder of `config.name` holding `params` (no random initialisation
  is materialised); `consume` as in `load_params`."""
  cls = decoder_class(config)
  model = nnx.eval_shape(lambda: cls(
      config, dtype=dtype, param_dtype=param_dtype, rngs=nnx.Rngs(0)))
  return load_params(model, params, consume)
