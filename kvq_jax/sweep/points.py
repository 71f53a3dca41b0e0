"""Explicitly named sweep points: presets or compact cache descriptions.

`--points` is a comma-separated list; each item is one of
  * a preset name (`configs/NAME.py`, e.g. `k8v4`, `kivi2`) or a path to a
    preset file (`.../my_preset.py`): that preset's whole cache spec;
  * `KSPEC[/VSPEC][:OPT...]`: short specs (`kvq_jax.settings.short_specs`,
    e.g. `int4_g32`, `int2_pc32_asym`, `int4_g32_asym_clip0.9`; VSPEC
    defaults to KSPEC) on top of the base preset's cache settings, with
    options `pre` / `post` (key_rope), `hadk`, `hadv`, `had` (both),
    `rsN` (randomised Hadamard, rotation seed N; with had/hadk/hadv),
    `nohad` (no rotation: clears the base's Hadamard and seed), `noaff`
    (drops the base preset's calibrated key affines), `rN`
    (residual N tokens), `sN` (sink N tokens), `fN` (flush_block N: both K
    and V wait in full precision until N tokens close, e.g.
    `int4_g32_asym:f32` to isolate what a 0-31 token window buys).
A bare name that is both a preset and a short spec is the preset.
Example: `int4_g32,k8v4,int4_pc32_asym/int4_g32_asym:pre:hadv:r128`.
"""

from __future__ import annotations

import dataclasses
import re


from kvq_jax.cache.spec import CacheSpec
from kvq_jax.settings.experiment_settings import settings_from_config
from kvq_jax.settings.presets import CONFIG_DIR, load_preset
from kvq_jax.settings.short_specs import parse_short_spec
from kvq_jax.sweep.grid import SweepPoint, check_head_dim

_OPTION = re.compile(r"^(?:(?P<flag>pre|post|hadk|hadv|had|nohad|noaff)|"
                     r"rs(?P<rs>\d+)|"
                     r"r(?P<r>\d+)|"
                     r"s(?P<s>\d+)|f(?P<f>\d+))$")


def _preset_spec(name_or_path: str) -> CacheSpec | None:
  settings = settings_from_config(load_preset(name_or_path))
  return settings.cache_spec if settings.quantize else None


def _is_preset(item: str) -> bool:
  if item.endswith(".py"):
    return True
  return ":" not in item and "/" not in item and (
      CONFIG_DIR / f"{item}.py").is_file()


def parse_point(item: str, base: CacheSpec | None) -> SweepPoint:
  """One `--points` item -> SweepPoint (ValueError naming the item)."""
  item = item.strip()
  if not item:
    raise ValueError("--points: empty item (two commas in a row?).")
  if _is_preset(item):
    spec = _preset_spec(item)
    if spec is None:
      raise ValueError(f"--points item {item!r}: the preset has no quantized "
                       "cache (the baseline is always evaluated).")
    name = item.rsplit("/", 1)[-1].removesuffix(".py")
    return SweepPoint(name, spec, source="point")
  formats, *options = item.split(":")
  k_text, _, v_text = formats.partition("/")
  try:
    k = parse_short_spec(k_text)
    v = parse_short_spec(v_text) if v_text else k
  except ValueError as e:
    raise ValueError(f"--points item {item!r}: {e}") from e
  changes = {"k": k, "v": v, "layer_overrides": (), "flush_block": None}
  for option in options:
    match = _OPTION.match(option)
    if not match:
      raise ValueError(
          f"--points item {item!r}: option {option!r} is not understood; "
          "allowed: pre, post, hadk, hadv, had, nohad, noaff, rsN (rotation "
          "seed), rN "
          "(residual), sN (sink), fN (flush block).")
    flag = match["flag"]
    if flag in ("pre", "post"):
      changes["key_rope"] = flag
    elif flag == "hadk":
      changes["hadamard_k"] = True
    elif flag == "hadv":
      changes["hadamard_v"] = True
    elif flag == "had":
      changes["hadamard_k"] = changes["hadamard_v"] = True
    elif flag == "nohad":
      changes["hadamard_k"] = changes["hadamard_v"] = False
      changes["rotation_seed"] = None
    elif flag == "noaff":
      changes["key_affines"] = ()
    elif match["rs"]:
      changes["rotation_seed"] = int(match["rs"])
    elif match["r"]:
      changes["residual"] = int(match["r"])
    elif match["f"]:
      changes["flush_block"] = int(match["f"])
    else:
      changes["sink"] = int(match["s"])
  try:
    spec = dataclasses.replace(base if base is not None else CacheSpec(),
                               **changes)
  except ValueError as e:
    raise ValueError(f"--points item {item!r}: {e}") from e
  return SweepPoint(item, spec, source="point")


def parse_points(text: str | list[str] | None, base: CacheSpec | None, *,
                 head_dim: int | None, num_layers: int | None
                 ) -> list[SweepPoint]:
  """Every item of `--points` (a comma-separated string or a list).

  `head_dim` and `num_layers` None: the model is not known yet (checking
  `--points` before it loads); every item is parsed, and the check of its
  spec against the model's shape (`check_head_dim`) is left to a later call
  that knows them.
  """
  if not text:
    return []
  items = text.split(",") if isinstance(text, str) else list(text)
  points = []
  for item in items:
    point = parse_point(item, base)
    if head_dim is not None:
      try:
        check_head_dim(point.spec, head_dim, num_layers)
      except ValueError as e:
        raise ValueError(f"--points item {item!r}: {e}") from e
    points.append(point)
  return points
