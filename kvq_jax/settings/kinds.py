"""A cache kind by name: the one resolver every tool names caches through.

`resolve_kind(name)` takes, in this order:

* a dense dtype name (`models.dtypes.DENSE_NAMES`: bf16 / bfloat16,
  fp16 / float16, f32 / fp32 / float32): a full-precision cache in that
  dtype;
* a preset (`configs/NAME.py`, or a path to a preset file ending in .py):
  its cache spec (None when it does not quantize) and cache dtype, exactly
  what `experiments.run --config=NAME` decodes with; a preset whose key
  statistics are missing fails with the preset's own message (it names
  the calibration command);
* a short spec `KSPEC[/VSPEC][:OPT...]` (`settings.short_specs`, e.g.
  `int2_pc32_asym`, `int8/int4_g32:r128`) on top of a base cache spec (the
  sweep's base preset; by default the CacheSpec defaults), in the base
  preset's (configs/base.py) cache dtype.

A name that is both a preset and a short spec is the preset.

With `model`, the kind is priced on that model as a server would hold it
(the capacity plan: `capacity.kinds.for_model`): key statistics that do
not load, or belong to another model, are stood in for at the model's
shape, a quantized kind's full-precision parts are charged in the preset's
own `cache.dtype` or `capacity.kinds.SERVING_DTYPE`, and a kind whose
formats do not fit the model's head_dim or layers is refused.
"""

from __future__ import annotations

import dataclasses

from kvq_jax.cache.spec import CacheSpec
from kvq_jax.capacity.kinds import SERVING_DTYPE, for_model
from kvq_jax.models.config import ModelConfig
from kvq_jax.models.dtypes import DENSE_NAMES, dense_dtype_name
from kvq_jax.settings.experiment_settings import settings_from_config
from kvq_jax.settings.presets import (available_presets, is_preset,
                                      load_preset)
from kvq_jax.settings.short_specs import UnknownFormat, parse_cache_spec


@dataclasses.dataclass(frozen=True)
class Kind:
  """A named cache.

  Attributes:
    name: the name as given (stripped).
    spec: the quantized cache's spec; None for a dense cache.
    dtype: the full-precision dtype's name: a dense cache's storage, what a
      quantized cache quantizes from and keeps its windows in.
    note: how a kind priced on a model departs from the preset ('' if it
      does not; `resolve_kind(..., model=...)`).
  """

  name: str
  spec: CacheSpec | None
  dtype: str
  note: str = ""


def _preset_names() -> list[str]:
  return [p for p in available_presets() if p not in DENSE_NAMES]


def _is_preset(name: str) -> bool:
  return name not in DENSE_NAMES and is_preset(name)


def resolve_kind(name: str, *, base: CacheSpec | None = None,
                 model: ModelConfig | None = None,
                 what: str = "cache kind") -> Kind:
  """`name` -> Kind (module docstring); ValueError starting with
  `what` and the name, listing what is allowed for an unknown name.

  `base`: what a short spec's options apply on top of (presets and dense
  names ignore it). `model`: price the kind on that model.
  """
  name = name.strip()
  dtype = dense_dtype_name(name)
  if dtype is not None:
    return Kind(name, None, dtype)
  if _is_preset(name):
    return _preset_kind(name, model, what)
  try:
    spec = parse_cache_spec(name, base)
  except UnknownFormat as e:
    raise ValueError(
        f"{what} {name!r} is unknown; allowed: {', '.join(DENSE_NAMES)} "
        f"(dense), a preset ({', '.join(_preset_names())}) or a preset file "
        f"(.py), or a short spec KSPEC[/VSPEC][:OPT...] ({e})") from e
  except ValueError as e:
    raise ValueError(f"{what} {name!r}: {e}") from e
  if model is None:
    return Kind(name, spec, settings_from_config(
        load_preset("base")).cache_dtype)
  return _on_model(name, spec, model, what, dtype="")


def _preset_kind(name: str, model: ModelConfig | None, what: str) -> Kind:
  try:
    preset = load_preset(name)
    key_stats = preset.cache.get("key_stats", "")
    try:
      settings = settings_from_config(preset)
      loaded = True
    except ValueError:
      if model is None or not key_stats:
        raise
      preset.cache.key_stats = ""  # Missing or unreadable: a stand-in.
      settings = settings_from_config(preset)
      loaded = False
  except (FileNotFoundError, ValueError) as e:
    raise ValueError(f"{what} {name!r}: {e}") from e
  spec = settings.cache_spec if settings.quantize else None
  if model is None or spec is None:
    return Kind(name, spec, settings.cache_dtype)
  return _on_model(name, spec, model, what, dtype=preset.cache.dtype,
                   key_stats=key_stats, loaded=loaded)


def _on_model(name: str, spec: CacheSpec, model: ModelConfig, what: str, *,
              dtype: str, key_stats: str = "", loaded: bool = True) -> Kind:
  try:
    spec, note = for_model(spec, model, key_stats=key_stats, loaded=loaded,
                           dtype=dtype)
  except ValueError as e:
    raise ValueError(f"{what} {name!r} {e}") from e
  return Kind(name, spec, dtype or SERVING_DTYPE, note)
