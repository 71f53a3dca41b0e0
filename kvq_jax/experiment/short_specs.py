"""Compact names for one tensor's cache format, as used in layer overrides.

Grammar: `fp` (full precision) | `FORMAT[_gN | _pcN][_asym][_clipR]` where
FORMAT is int8, int4, int3, int2, fp8_e4m3 or fp8_e5m2; `_gN` groups N
elements along head_dim (per_group), `_pcN` groups N tokens per channel
(per_channel, KIVI keys); neither means per_token; `_clipR` sets clip_ratio
(e.g. `_clip0.9`). Scales are bfloat16. Examples: `int8`, `int4_g32`,
`int4_g32_asym`, `int2_pc32_asym`.
"""

from __future__ import annotations

import re

from kvq_jax.quant import QuantSpec

_PATTERN = re.compile(
    r"^(?P<format>int8|int4|int3|int2|fp8_e4m3|fp8_e5m2)"
    r"(?:_g(?P<group>\d+)|_pc(?P<channel>\d+))?"
    r"(?P<asym>_asym)?(?:_clip(?P<clip>[0-9]*\.?[0-9]+))?$")


def parse_short_spec(text: str) -> QuantSpec | None:
  text = text.strip()
  if text == "fp":
    return None
  match = _PATTERN.match(text)
  if not match:
    raise ValueError(
        f"cache format {text!r} is not understood; allowed: 'fp' or "
        "FORMAT[_gN|_pcN][_asym][_clipR], e.g. int8, int4_g32, "
        "int4_g32_asym, int2_pc32_asym, fp8_e4m3.")
  granularity, group = "per_token", None
  if match["group"]:
    granularity, group = "per_group", int(match["group"])
  elif match["channel"]:
    granularity, group = "per_channel", int(match["channel"])
  try:
    return QuantSpec(
        format=match["format"],
        scheme="asymmetric" if match["asym"] else "symmetric",
        granularity=granularity, group_size=group,
        clip_ratio=float(match["clip"]) if match["clip"] else 1.0)
  except ValueError as e:
    raise ValueError(f"cache format {text!r}: {e}") from e


def short_name(spec: QuantSpec | None) -> str:
  """Inverse of `parse_short_spec` (bfloat16 scales assumed)."""
  if spec is None:
    return "fp"
  name = spec.format
  if spec.granularity == "per_group":
    name += f"_g{spec.group_size}"
  elif spec.granularity == "per_channel":
    name += f"_pc{spec.group_size}"
  if spec.scheme == "asymmetric":
    name += "_asym"
  if spec.clip_ratio != 1.0:
    name += f"_clip{spec.clip_ratio:g}"
  return name


def parse_layer_overrides(text: str) -> tuple:
  """'0,29:fp/fp;5:int8/int4_g32' -> ((0, None, None), (29, ...), (5, ...))."""
  overrides = []
  for item in filter(None, (p.strip() for p in text.split(";"))):
    layers, sep, formats = item.partition(":")
    k_text, slash, v_text = formats.partition("/")
    if not sep or not slash:
      raise ValueError(
          f"cache.layer_overrides item {item!r}: expected "
          "'LAYER[,LAYER...]:K_FORMAT/V_FORMAT', e.g. '0,29:fp/fp'.")
    k, v = parse_short_spec(k_text), parse_short_spec(v_text)
    for layer in layers.split(","):
      if not layer.strip().isdigit():
        raise ValueError(
            f"cache.layer_overrides item {item!r}: layer {layer!r} is not a "
            "non-negative integer.")
      overrides.append((int(layer), k, v))
  return tuple(overrides)
