"""The parameter tree shared by every loader and the decoder.

```
{'embed': [V, D], 'lm_head': [D, V] (only if not tie_embeddings),
 'final_norm': [D],
 'layers': [{'attn_norm': [D],
             'q': {'kernel': [D, N*H], 'bias': [N*H] (if attention_bias)},
             'k': {'kernel': [D, K*H], 'bias': [K*H]},
             'v': {'kernel': [D, K*H], 'bias': [K*H]},
             'o': {'kernel': [N*H, D]},
             'mlp_norm': [D],
             'gate': {'kernel': [D, F]}, 'up': {'kernel': [D, F]},
             'down': {'kernel': [F, D]}}, ...]}
```
Gemma 3 (`config.name == 'gemma3'`) layers add 'q_norm': [H], 'k_norm': [H]
(per-head RMSNorm of q / k), 'post_attn_norm': [D] and 'post_mlp_norm': [D];
every Gemma norm weight holds 1 + w (llama.cpp's GGUF convention; see
`models/gemma3.py`).
Kernels are [in, out] (y = x @ kernel); leaves are numpy float32.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable, Mapping

import numpy as np

from kvq_jax.models.config import ModelConfig

Params = dict[str, Any]


def expected_shapes(config: ModelConfig) -> Params:
  """The tree of leaf shapes `config` implies (same structure as params)."""
  d, f, v = config.hidden_size, config.intermediate_size, config.vocab_size
  q_out = config.num_heads * config.head_dim
  kv_out = config.num_kv_heads * config.head_dim

  def linear(d_in: int, d_out: int, bias: bool = False) -> dict[str, tuple]:
    out = {"kernel": (d_in, d_out)}
    if bias:
      out["bias"] = (d_out,)
    return out

  bias = config.attention_bias
  layer = {
      "attn_norm": (d,),
      "q": linear(d, q_out, bias),
      "k": linear(d, kv_out, bias),
      "v": linear(d, kv_out, bias),
      "o": linear(q_out, d),
      "mlp_norm": (d,),
      "gate": linear(d, f),
      "up": linear(d, f),
      "down": linear(f, d),
  }
  if config.name == "gemma3":
    h = config.head_dim
    layer.update({"q_norm": (h,), "k_norm": (h,), "post_attn_norm": (d,),
                  "post_mlp_norm": (d,)})
  shapes: Params = {"embed": (v, d), "final_norm": (d,),
                    "layers": [copy.deepcopy(layer)
                               for _ in range(config.num_layers)]}
  if not config.tie_embeddings:
    shapes["lm_head"] = (d, v)
  return shapes


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
  """{'layers/0/q/kernel': leaf, ...}: a params tree's leaves by path."""
  if isinstance(tree, dict):
    out = {}
    for key, value in tree.items():
      out.update(flatten(value, f"{prefix}{key}/"))
    return out
  if isinstance(tree, list):
    out = {}
    for i, value in enumerate(tree):
      out.update(flatten(value, f"{prefix}{i}/"))
    return out
  return {prefix.rstrip("/"): tree}


def check_params(params: Params, config: ModelConfig, source: str) -> None:
  """Raises ValueError naming `source` and the leaf if params break the layout."""
  want = flatten(expected_shapes(config))
  got = flatten(params)
  missing = sorted(set(want) - set(got))
  extra = sorted(set(got) - set(want))
  if missing or extra:
    raise ValueError(
        f"{source}: parameter tree does not match the config; missing "
        f"{missing[:5]}, unexpected {extra[:5]}.")
  for name, shape in want.items():
    leaf = got[name]
    if not isinstance(leaf, np.ndarray) or leaf.dtype != np.float32:
      raise ValueError(f"{source}: param {name!r} must be a numpy float32 "
                       f"array, got {type(leaf).__name__} "
                       f"{getattr(leaf, 'dtype', None)}.")
    if tuple(leaf.shape) != tuple(shape):
      raise ValueError(f"{source}: param {name!r} has shape "
                       f"{tuple(leaf.shape)}, expected {tuple(shape)}.")


@dataclasses.dataclass(frozen=True)
class SourceNames:
  """Where a checkpoint format keeps each leaf of the layout.

  `layer` maps a layer key to the source name after `layer_prefix` (with
  `{i}` the layer index): the full tensor name for vectors (norms), the base
  name for linears (`.weight` / `.bias` are appended).
  """

  layer_prefix: str
  layer: Mapping[str, str]
  embed: str
  final_norm: str
  lm_head: str


# read(name, shape) -> float32 array in the source's [out, in] order.
Reader = Callable[[str, tuple[int, ...]], np.ndarray]
# fix_rows(layer_key, array) -> array: row transform of q/k weights and biases.
RowFix = Callable[[str, np.ndarray], np.ndarray]


def assemble_params(config: ModelConfig, read: Reader, names: SourceNames,
                    fix_rows: RowFix | None = None) -> Params:
  """Builds the loader layout by reading every leaf `expected_shapes` lists.

  Linear weights are read as [out, in] and transposed to [in, out];
  `fix_rows` (e.g. GGUF's RoPE un-permutation) sees weights and biases first.
  """
  fix = fix_rows or (lambda key, array: array)
  shapes = expected_shapes(config)

  def leaf(key: str, source: str, shape):
    if not isinstance(shape, dict):
      return read(source, tuple(shape))
    d_in, d_out = shape["kernel"]
    out = {"kernel": np.ascontiguousarray(
        fix(key, read(f"{source}.weight", (d_out, d_in))).T)}
    if "bias" in shape:
      out["bias"] = fix(key, read(f"{source}.bias", (d_out,)))
    return out

  layers = []
  for i, layer_shapes in enumerate(shapes["layers"]):
    prefix = names.layer_prefix.format(i=i)
    layers.append({key: leaf(key, f"{prefix}.{names.layer[key]}", shape)
                   for key, shape in layer_shapes.items()})
  params: Params = {"embed": read(names.embed, tuple(shapes["embed"])),
                    "final_norm": read(names.final_norm,
                                       tuple(shapes["final_norm"])),
                    "layers": layers}
  if "lm_head" in shapes:
    d, v = shapes["lm_head"]
    params["lm_head"] = np.ascontiguousarray(read(names.lm_head, (v, d)).T)
  return params
