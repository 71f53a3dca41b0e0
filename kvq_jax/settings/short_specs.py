"""Compact names for one tensor's cache format, as used in layer overrides.

Grammar: `fp` (full precision) | a llama.cpp type (`q8_0`, `q4_0`, `q4_1`,
`q5_0`, `q5_1`: `kvq_jax.quant.ggml_spec`, bit-exact with llama.cpp) |
`FORMAT[_gN | _pcN][_asym | _narrow | _lm | _vq | _st][_se4m3 | _se5m2][_oN][_ggml][_clipR]` where
FORMAT is int8,
int5, int4, int3, int2, int1 (with `_vq` only), fp8_e4m3 or fp8_e5m2; `_gN` groups N elements along
head_dim (per_group), `_pcN` groups N tokens per channel (per_channel, KIVI
keys); neither means per_token; no scheme suffix means symmetric (all 2^bits
levels), `_asym` asymmetric, `_narrow` symmetric_narrow (2^bits - 1 levels),
`_lm` lloyd_max (a norm per group and Lloyd-Max codebook codes; int5..int2),
`_vq` vector (a norm per group and one 8-bit index per 8 // bits elements
into a 256-vector codebook; int4, int2 and int1),
`_st` static (no scale: calibrated key ranges, KVQuant; keys only);
`_se4m3` / `_se5m2` store the scale in 8 bits (float8_e4m3fn / float8_e5m2;
`_lm` and `_vq` only, e.g. `int2_vq_se4m3`: 2 + 8 / 64 bits per element
for a 64-element head vector, against 2 + 16 / 64 with bfloat16); `_oN`
keeps N outliers per vector exactly (dense-and-sparse);
`_ggml` selects rounding='ggml' with float16 scales (otherwise rounding
'kvq' with bfloat16 scales); `_clipR` sets clip_ratio (e.g. `_clip0.9`).
Examples: `int8`, `int4_g32`, `int4_g32_asym`, `int2_pc32_asym`,
`int8_g32_narrow`, `int4_lm`, `int2_vq`, `int4_st_o1`, `q4_0`. `short_name` writes the llama.cpp name for
exactly those specs (so `int4_g32_ggml` comes back as `q4_0`).

A whole cache (`parse_cache_spec`, the short-spec form of a cache kind:
`settings.kinds`, the sweep's `--points`) is `KSPEC[/VSPEC][:OPT...]`: K
and V formats (VSPEC defaults to KSPEC) on top of a base cache spec, with
options `pre` / `post` (key_rope), `hadk`, `hadv`, `had` (both), `rsN`
(randomised Hadamard, rotation seed N; with had/hadk/hadv), `nohad` (no
rotation: clears the base's Hadamard and seed), `noaff` (drops the base's
calibrated key affines), `rN` (residual N tokens), `sN` (sink N tokens),
`fN` (flush_block N: both K and V wait in full precision until N tokens
close, e.g. `int4_g32_asym:f32` to isolate what a 0-31 token window buys).
Example: `int4_pc32_asym/int4_g32_asym:pre:hadv:r128`.
"""

from __future__ import annotations

import dataclasses
import re

from kvq_jax.cache.spec import CacheSpec
from kvq_jax.quant import GGML_TYPES, QuantSpec, ggml_name, ggml_spec

_PATTERN = re.compile(
    r"^(?P<format>int8|int5|int4|int3|int2|int1|fp8_e4m3|fp8_e5m2)"
    r"(?:_g(?P<group>\d+)|_pc(?P<channel>\d+))?"
    r"(?P<scheme>_asym|_narrow|_lm|_vq|_st)?(?:_s(?P<scale>e4m3|e5m2))?"
    r"(?:_o(?P<outliers>\d+))?"
    r"(?P<ggml>_ggml)?"
    r"(?:_clip(?P<clip>[0-9]*\.?[0-9]+))?$")
_SCHEMES = {None: "symmetric", "_asym": "asymmetric",
            "_narrow": "symmetric_narrow", "_lm": "lloyd_max",
            "_vq": "vector", "_st": "static"}
_SUFFIXES = {v: k or "" for k, v in _SCHEMES.items()}
_FP8_SCALES = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}
_FP8_SUFFIXES = {v: f"_s{k}" for k, v in _FP8_SCALES.items()}
_OPTION = re.compile(r"^(?:(?P<flag>pre|post|hadk|hadv|had|nohad|noaff)|"
                     r"rs(?P<rs>\d+)|"
                     r"r(?P<r>\d+)|"
                     r"s(?P<s>\d+)|f(?P<f>\d+))$")


class UnknownFormat(ValueError):
  """A format name outside the grammar (not merely an invalid spec)."""


def parse_short_spec(text: str) -> QuantSpec | None:
  text = text.strip()
  if text == "fp":
    return None
  if text in GGML_TYPES:
    return ggml_spec(text)
  match = _PATTERN.match(text)
  if not match:
    raise UnknownFormat(
        f"cache format {text!r} is not understood; allowed: 'fp' or "
        "FORMAT[_gN|_pcN][_asym|_narrow|_lm|_vq|_st][_se4m3|_se5m2][_oN]"
        "[_ggml][_clipR] (e.g. "
        "int8, "
        "int4_g32, int4_g32_asym, int2_pc32_asym, int8_g32_narrow, "
        f"fp8_e4m3) or a llama.cpp type: {', '.join(GGML_TYPES)}.")
  granularity, group = "per_token", None
  if match["group"]:
    granularity, group = "per_group", int(match["group"])
  elif match["channel"]:
    granularity, group = "per_channel", int(match["channel"])
  ggml = bool(match["ggml"])
  if ggml and match["scale"]:
    raise ValueError(f"cache format {text!r}: _ggml stores float16 scales; "
                     "allowed: _ggml or _se4m3 / _se5m2, not both.")
  scale_dtype = ("float16" if ggml else _FP8_SCALES.get(match["scale"],
                                                         "bfloat16"))
  try:
    return QuantSpec(
        format=match["format"], scheme=_SCHEMES[match["scheme"]],
        granularity=granularity, group_size=group,
        clip_ratio=float(match["clip"]) if match["clip"] else 1.0,
        outliers=int(match["outliers"] or 0),
        scale_dtype=scale_dtype,
        rounding="ggml" if ggml else "kvq")
  except ValueError as e:
    raise ValueError(f"cache format {text!r}: {e}") from e


def short_name(spec: QuantSpec | None) -> str:
  """Inverse of `parse_short_spec` (kvq rounding: bfloat16 scales assumed,
  8-bit ones written as `_se4m3` / `_se5m2`)."""
  if spec is None:
    return "fp"
  if (llama_cpp := ggml_name(spec)) is not None:
    return llama_cpp
  name = spec.format
  if spec.granularity == "per_group":
    name += f"_g{spec.group_size}"
  elif spec.granularity == "per_channel":
    name += f"_pc{spec.group_size}"
  name += _SUFFIXES[spec.scheme]
  name += _FP8_SUFFIXES.get(spec.scale_dtype, "")
  if spec.outliers:
    name += f"_o{spec.outliers}"
  if spec.rounding == "ggml":
    name += "_ggml"
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


def parse_cache_spec(text: str, base: CacheSpec | None) -> CacheSpec:
  """'KSPEC[/VSPEC][:OPT...]' (module docstring) on top of `base` (None: the
  CacheSpec defaults): K and V for every layer (the base's layer overrides
  and flush block cleared), the options applied. UnknownFormat when K or V
  is outside the grammar; ValueError for anything else wrong."""
  formats, *options = text.split(":")
  k_text, _, v_text = formats.partition("/")
  k = parse_short_spec(k_text)
  v = parse_short_spec(v_text) if v_text else k
  changes = {"k": k, "v": v, "layer_overrides": (), "flush_block": None}
  for option in options:
    match = _OPTION.match(option)
    if not match:
      raise ValueError(
          f"option {option!r} is not understood; allowed: pre, post, hadk, "
          "hadv, had, nohad, noaff, rsN (rotation seed), rN (residual), sN "
          "(sink), fN (flush block).")
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
  return dataclasses.replace(base if base is not None else CacheSpec(),
                             **changes)
