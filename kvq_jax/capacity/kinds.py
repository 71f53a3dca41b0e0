"""Cache kinds by name, for a capacity plan: dense dtypes or presets.

A kind is 'bf16' or 'float32' (a dense cache in that dtype) or a preset of
the catalog (`capacity.catalog`; configs/NAME.py): the preset's cache spec,
read through the catalog's `settings_from_config` as a run reads it, then
checked against the target model (head_dim, layer indices) before any byte
is counted.

Two departures from a run, both stated in the kind's `note`:

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
from kvq_jax.capacity.catalog import Catalog
from kvq_jax.models.config import ModelConfig

DENSE_KINDS = {"bf16": "bfloat16", "float32": "float32"}
SERVING_DTYPE = "bfloat16"
DEFAULT_KINDS = ("bf16", "fp8_e4m3", "int8", "q8_0", "q4_0", "kivi4",
                 "kivi2", "int4_g32_asym", "tqmix425")


@dataclasses.dataclass(frozen=True)
class CacheKind:
  """A named cache: its spec (None: dense), full-precision dtype, notes."""

  name: str
  spec: CacheSpec | None
  dtype: str
  note: str = ""


def allowed_kinds(catalog: Catalog) -> list[str]:
  return list(DENSE_KINDS) + [p for p in catalog.presets
                              if p not in DENSE_KINDS]


def resolve_kind(name: str, config: ModelConfig,
                 catalog: Catalog) -> CacheKind:
  """`name` -> CacheKind for `config`; ValueError naming what is allowed."""
  if name in DENSE_KINDS:
    return CacheKind(name, None, DENSE_KINDS[name])
  if name not in catalog.presets:
    raise ValueError(f"--kinds item {name!r} is unknown; allowed: "
                     f"{', '.join(allowed_kinds(catalog))}.")
  preset = catalog.load_preset(name)
  key_stats = preset.cache.get("key_stats", "")
  try:
    try:
      settings = catalog.settings_from_config(preset)
      loaded = True
    except ValueError:
      if not key_stats:
        raise
      preset.cache.key_stats = ""  # Missing or unreadable: a stand-in.
      settings = catalog.settings_from_config(preset)
      loaded = False
  except ValueError as e:
    raise ValueError(f"--kinds item {name!r}: {e}") from e
  spec = settings.cache_spec if settings.quantize else None
  if spec is None:
    return CacheKind(name, None, settings.cache_dtype)
  notes = []
  if key_stats:
    spec, note = _key_stats(spec, config, key_stats, loaded)
    notes.append(note)
  if spec.layer_overrides:
    notes.append("per-layer formats by layer index, as the preset names "
                 "them")
  try:
    _check_head_dim(spec, config)
    spec.check_num_layers(config.num_layers)
  except ValueError as e:
    raise ValueError(f"--kinds item {name!r} does not fit this model "
                     f"(num_layers={config.num_layers}, head_dim="
                     f"{config.head_dim}): {e}") from e
  if not preset.cache.dtype and any(
      spec.layer(i).k is None or spec.layer(i).v is None
      for i in range(config.num_layers)):
    notes.insert(0, f"unquantized layers / tensors in {SERVING_DTYPE}")
  return CacheKind(name, spec, preset.cache.dtype or SERVING_DTYPE,
                   "; ".join(notes))


def _check_head_dim(spec: CacheSpec, config: ModelConfig) -> None:
  """ValueError if a layer's K/V format cannot quantize [.., head_dim]."""
  for i in range(config.num_layers):
    layer = spec.layer(i)
    for name, s in (("k", layer.k), ("v", layer.v)):
      if s is not None:
        tokens = s.group_size if s.granularity == "per_channel" else 1
        try:
          s.validate_shape((1, 1, max(tokens, 2), config.head_dim))
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
