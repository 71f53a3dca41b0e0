"""Presets that load learned clip ratios: overrides text and file writer.

A calibrated preset is a config file beside its ratios directory:

    from configs import base
    from kvq_jax.calibration.preset import clip_layer_overrides
    from kvq_jax.calibration.store import load_clip_ratios

    def get_config():
      c = base.get_config()
      c.cache.k.bits = 2          # ... the base preset's fields ...
      c.cache.layer_overrides = clip_layer_overrides(
          load_clip_ratios(pathlib.Path(__file__).parent / 'clip_ratios'))
      return c

so `experiments.run --config=WORKDIR/calibrated.py` evaluates it.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib

import ml_collections

from configs import base as base_config
from kvq_jax.calibration.store import ClipRatios
from kvq_jax.settings.short_specs import parse_short_spec, short_name

RATIO_DECIMALS = 4


def _clipped(name: str, ratio: float) -> str:
  spec = parse_short_spec(name)
  if spec is None:
    return "fp"
  r = round(float(ratio), RATIO_DECIMALS)
  return short_name(dataclasses.replace(spec, clip_ratio=min(r, 1.0)))


def clip_layer_overrides(ratios: ClipRatios) -> str:
  """`cache.layer_overrides` text: every layer's K/V spec with `_clipR`."""
  return ";".join(
      f"{i}:{_clipped(ks, rk)}/{_clipped(vs, rv)}"
      for i, (ks, vs, rk, rv) in enumerate(zip(
          ratios.k_specs, ratios.v_specs, ratios.k_L, ratios.v_L)))


def _assignments(config: ml_collections.ConfigDict,
                 default: ml_collections.ConfigDict, prefix: str) -> list[str]:
  lines = []
  for key in config.keys():
    value, ref = config[key], default.get(key)
    if isinstance(value, ml_collections.ConfigDict):
      lines += _assignments(value, ref, f"{prefix}.{key}")
    elif value != ref:
      lines.append(f"  {prefix}.{key} = {value!r}")
  return lines


def write_preset(path: str | os.PathLike, config: ml_collections.ConfigDict,
                 ratios_dir: str, doc: str) -> pathlib.Path:
  """Writes a preset: `config`'s differences from configs/base.py, then the
  learned per-layer overrides loaded from `ratios_dir` (relative to the
  preset file's directory, or absolute)."""
  resolved = config.copy_and_resolve_references()
  resolved.cache.layer_overrides = ""
  lines = _assignments(resolved, base_config.get_config(), "c")
  body = "\n".join(lines)
  text = f'''"""{doc}"""

from __future__ import annotations

import pathlib

from configs import base
from kvq_jax.calibration.preset import clip_layer_overrides
from kvq_jax.calibration.store import load_clip_ratios

RATIOS = pathlib.Path(__file__).parent / {ratios_dir!r}


def get_config():
  c = base.get_config()
{body}
  c.cache.layer_overrides = clip_layer_overrides(load_clip_ratios(RATIOS))
  return c
'''
  out = pathlib.Path(path)
  out.write_text(text, encoding="utf-8")
  return out
