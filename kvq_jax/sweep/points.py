"""Explicitly named sweep points: presets or compact cache descriptions.

`--points` is a comma-separated list; each item is a cache kind
(`settings.kinds.resolve_kind`) that quantizes:
  * a preset name (`configs/NAME.py`, e.g. `k8v4`, `kivi2`) or a path to a
    preset file (`.../my_preset.py`): that preset's whole cache spec;
  * `KSPEC[/VSPEC][:OPT...]`: short specs with options
    (`settings.short_specs`, e.g. `int4_g32`, `int2_pc32_asym`,
    `int4_g32_asym_clip0.9`, `int4_g32_asym:f32`) on top of the base
    preset's cache settings.
A bare name that is both a preset and a short spec is the preset.
Example: `int4_g32,k8v4,int4_pc32_asym/int4_g32_asym:pre:hadv:r128`.
"""

from __future__ import annotations

from kvq_jax.cache.spec import CacheSpec
from kvq_jax.capacity.kinds import check_head_dim
from kvq_jax.settings.kinds import resolve_kind
from kvq_jax.sweep.grid import SweepPoint


def parse_point(item: str, base: CacheSpec | None) -> SweepPoint:
  """One `--points` item -> SweepPoint (ValueError naming the item)."""
  item = item.strip()
  if not item:
    raise ValueError("--points: empty item (two commas in a row?).")
  kind = resolve_kind(item, base=base, what="--points item")
  if kind.spec is None:
    raise ValueError(f"--points item {item!r}: the kind has no quantized "
                     "cache (the baseline is always evaluated).")
  name = item.rsplit("/", 1)[-1].removesuffix(".py") if item.endswith(
      ".py") else item  # A preset file: its stem.
  return SweepPoint(name, kind.spec, source="point")


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
