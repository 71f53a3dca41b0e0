"""The constants a candidate format adds per layer, in bits per element.

The allocator's stored and window bits leave out what a format keeps
besides its tokens. These are the same arrays `capacity.memory` charges:
per layer, a calibrated format's own constants (static levels, a width per
component and a codebook per width, the key affine's shift, scale and
basis), charged at the table's context as
8 * bytes / (context * kv_heads * head_dim) per K or V tensor of a layer
(`constant_bits`); and a format's fixed codebook (Lloyd-Max or vector codes
of N(0, 1) data), one copy per model whichever layers use it, so it is
charged once on the mean over the 2L tensors (`fixed_table_bits`).
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Sequence

import ml_collections

from kvq_jax.cache.spec import CacheSpec
from kvq_jax.calibration import auto_key_stats
from kvq_jax.models.config import ModelConfig
from kvq_jax.quant import constant_arrays, has_fixed_table, table_id
from kvq_jax.settings.experiment_settings import settings_from_config
from kvq_jax.settings.short_specs import parse_short_spec, short_name

ConstantBits = dict[tuple[str, int, str], float]  # (tensor, layer, format)


def constant_bits(spec: CacheSpec, config: ModelConfig, context: int,
                  k_formats: Sequence[str], v_formats: Sequence[str]
                  ) -> ConstantBits:
  """{(tensor 'K'|'V', layer, canonical short name): bits per element} of
  each candidate as `spec` resolves it in that layer (module docstring);
  full precision costs no constant."""
  if context < 1:
    raise ValueError(f"constant_bits: context={context!r}; allowed: a "
                     "positive number of tokens.")
  elements = context * config.num_kv_heads * config.head_dim
  out = {}
  for tensor, formats in (("K", k_formats), ("V", v_formats)):
    for name in formats:
      fmt = parse_short_spec(name)
      canonical = short_name(fmt)
      field = tensor.lower()
      single = dataclasses.replace(spec, layer_overrides=(), **{field: fmt})
      for layer in range(config.num_layers):
        resolved = single.layer(layer)
        q = getattr(resolved, field)
        arrays = constant_arrays(q, config.head_dim)
        nbytes = 0 if has_fixed_table(q) else sum(a.nbytes for a in arrays)
        if tensor == "K" and q is not None and resolved.key_affine:
          nbytes += sum(a.nbytes for a in resolved.key_affine.arrays())
        out[(tensor, layer, canonical)] = 8 * nbytes / elements
  return out


def fixed_table_bits(config: ModelConfig, context: int,
                     formats: Sequence[str]) -> dict[str, tuple[str, float]]:
  """{canonical short name: (table id, bits on the mean over the 2L
  tensors)} of the formats with a fixed codebook; formats sharing a table
  (int2_vq and int2_g32_vq) share its id."""
  elements = 2 * config.num_layers * context * config.num_kv_heads * (
      config.head_dim)
  out = {}
  for name in formats:
    fmt = parse_short_spec(name)
    if not has_fixed_table(fmt):
      continue
    (table,) = constant_arrays(fmt, config.head_dim)
    out[short_name(fmt)] = (table_id(table), 8 * table.nbytes / elements)
  return out


def table_constant_bits(meta: dict, config: ModelConfig,
                        k_formats: Sequence[str], v_formats: Sequence[str]
                        ) -> tuple[ConstantBits, dict[str, tuple[str, float]]]:
  """(`constant_bits`, `fixed_table_bits`) for a sensitivity table: its
  preset's cache spec as the table's run resolved it (key statistics for
  its model and text, from the asset cache or built), at its
  full-precision slots' context."""
  preset = ml_collections.ConfigDict(meta["config"])
  data = meta.get("eval_data")
  data = data if data and pathlib.Path(data).is_file() else None
  with auto_key_stats.run_context(meta["model"], data):
    spec = settings_from_config(preset).cache_spec
  context = meta["full_precision_slots"]["context"]
  return (constant_bits(spec, config, context, k_formats, v_formats),
          fixed_table_bits(config, context, list(k_formats) + list(v_formats)))
