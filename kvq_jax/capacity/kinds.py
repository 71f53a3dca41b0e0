"""A quantized cache priced on a model: what a capacity plan charges.

The cache kind comes by name from `settings.kinds.resolve_kind`; with a
model, that resolver hands its spec here, which checks it against the
target model (head_dim, layer indices) before any byte is counted and
makes two departures from a run, both stated in the returned note:

* Full-precision dtype: a research preset computes in float32 on CPU; a
  server keeps unquantized layers and tensors in bfloat16. A quantized
  preset's full-precision parts are charged in its `cache.dtype` when it
  sets one, else in SERVING_DTYPE. (Residual, flush and sink windows use
  the spec's own `window_dtype` either way.)
* Calibrated key statistics (`cache.key_stats`) belong to one model. When
  the directory loads and holds one affine per layer of the target's
  shape, they are used as they are. Otherwise (missing, or another model's)
  a stand-in of the target's shape takes their place: identity shift and
  scale, with the loaded statistics' mode, rotation and codebook widths, or
  mode 'range' for static keys and 'std' otherwise when nothing loads. The
  per-layer constants are so charged at their real size; such a kind
  prices memory only and cannot run on that model.
"""

from __future__ import annotations

import dataclasses

from kvq_jax.cache.key_affine import KeyAffine
from kvq_jax.cache.key_stats_recipe import recipe_shape
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.models.config import ModelConfig

SERVING_DTYPE = "bfloat16"


def for_model(spec: CacheSpec, config: ModelConfig, *, key_stats: str = "",
              loaded: bool = True, dtype: str = "") -> tuple[CacheSpec, str]:
  """(`spec` priced on `config`, a note of how; '' if as the preset).

  `key_stats`: the preset's `cache.key_stats` ('' for none), `loaded`:
  whether they loaded; `dtype`: the preset's own `cache.dtype` ('' for
  none: SERVING_DTYPE). ValueError 'does not fit this model (...)' when a
  layer's format cannot quantize the model's head_dim or the per-layer
  formats name layers it does not have.
  """
  notes = []
  if key_stats:
    spec, note = _key_stats(spec, config, key_stats, loaded)
    notes.append(note)
  if spec.layer_overrides:
    notes.append("per-layer formats by layer index, as the preset names "
                 "them")
  try:
    check_head_dim(spec, config.head_dim, config.num_layers)
    spec.check_num_layers(config.num_layers)
  except ValueError as e:
    raise ValueError(f"does not fit this model (num_layers="
                     f"{config.num_layers}, head_dim={config.head_dim}): "
                     f"{e}") from e
  if not dtype and any(
      spec.layer(i).k is None or spec.layer(i).v is None
      for i in range(config.num_layers)):
    notes.insert(0, f"unquantized layers / tensors in {SERVING_DTYPE}")
  return spec, "; ".join(notes)


def check_head_dim(spec: CacheSpec, head_dim: int, num_layers: int) -> None:
  """Raises ValueError if a layer's K/V spec cannot quantize [.., head_dim]."""
  for i in range(num_layers):
    layer = spec.layer(i)
    for name, s in (("k", layer.k), ("v", layer.v)):
      if s is not None:
        try:
          # Heads-major cache layout [B, K, S, H]; tokens are a whole group.
          tokens = s.group_size if s.granularity == "per_channel" else 1
          s.validate_shape((1, 1, max(tokens, 2), head_dim))
        except ValueError as e:
          raise ValueError(f"layer {i} {name}: {e}") from e


def _key_stats(spec: CacheSpec, config: ModelConfig, path: str,
               loaded: bool) -> tuple[CacheSpec, str]:
  """The preset's key statistics, or a stand-in (module docstring)."""
  k, h = config.num_kv_heads, config.head_dim
  affines = spec.key_affines if loaded else ()
  if (len(affines) == config.num_layers
      and all(a.shape == (k, h) for a in affines)):
    return spec, f"key stats from {path}"
  specs = [spec.k, spec.v] + [s for _, ko, vo in spec.layer_overrides
                              for s in (ko, vo)]
  static = any(s is not None and not s.has_scale for s in specs)
  if affines:
    mode, rotated = affines[0].mode, bool(affines[0].rotation)
    bits = [b for b, _ in affines[0].codebooks]
    where = (f"calibrated for {len(affines)} layers of shape "
             f"{affines[0].shape}")
  else:
    mode, rotated, bits = ("range" if static else "std"), False, []
    mode, rotated = recipe_shape(path) or (mode, rotated)
    where = "not loaded"
  stand_in = KeyAffine.stand_in(k, h, mode, rotated, bits)
  spec = dataclasses.replace(spec,
                             key_affines=(stand_in,) * config.num_layers)
  return spec, (f"key stats {path} {where}: stand-in of this model's shape "
                f"({mode} mode{', rotated' if rotated else ''}), memory "
                "only")
