"""`QuantSpec`: what to quantize to and how to group it (frozen, hashable).

A spec is static configuration: it goes into `jit` as a static argument and
into pytrees as aux data, so it must be hashable and is validated once, on
construction (`__post_init__`). Checks that need the tensor shape (group size
dividing the axis, packing divisibility, axis range) live in `validate_shape`,
which `quantize` calls at trace time.

Granularities, for a KV tensor laid out [B, T, K, H] (tokens T at axis -3,
head_dim H at axis -1):

* per_tensor:  one scale for the whole tensor.
* per_token:   one scale per vector along `group_axis` (default -1: one scale
               per (b, t, k) over its H elements).
* per_group:   `group_size` consecutive elements along `group_axis` (default
               -1) share a scale.
* per_channel: KIVI-style; every (b, k, h) channel gets its own scale over
               `group_size` consecutive tokens along `group_axis` (default -3),
               or over the whole token axis when `group_size` is None.
"""

from __future__ import annotations

import dataclasses
import fractions
from typing import Sequence

import jax.numpy as jnp
import numpy as np

FORMATS = ("int8", "int5", "int4", "int3", "int2", "int1", "fp8_e4m3",
           "fp8_e5m2")
# symmetric: all 2^b codes, the scale set by the signed value of largest
#   magnitude (llama.cpp q4_0's rule); fp8 uses its own symmetric rule.
# symmetric_narrow: 2^b - 1 codes, scale = absmax / (2^(b-1) - 1) (q8_0's
#   rule); integer formats only.
# asymmetric: scale and zero point from the group's min and max (q4_1's);
#   integer formats only.
# lloyd_max: one scale per group (a least-squares norm) and codes into the
#   Lloyd-Max codebook of a rotated unit vector's coordinates
#   (`kvq_jax.quant.codebook`); int5/int4/int3/int2, groups along the last
#   axis (per_token or per_group), meant for Hadamard-rotated tensors.
# vector: one scale per group (a least-squares norm) and one 8-bit index per
#   8 // bits consecutive elements into a 256-entry codebook in R^(8 // bits)
#   (`kvq_jax.quant.vector_codebook`: k-means of a Gaussian); int4 (pairs),
#   int2 (quadruples) and int1 (octets; int1 exists for this scheme only),
#   groups along the last axis, for Hadamard-rotated tensors like lloyd_max.
# static: no stored scale; 2^b fixed levels: uniform mid-rise over [-r, r]
#   (r = clip_ratio), or `levels` (a calibrated codebook, KVQuant's nuq),
#   for tensors already normalised by calibrated per-channel ranges
#   (KVQuant's keys: `kvq_jax.cache.key_affine` in range mode); integer
#   formats, per_token.
# See `kvq_jax.quant.quantize` for the arithmetic.
SCHEMES = ("symmetric", "symmetric_narrow", "asymmetric", "lloyd_max",
           "static", "vector")
LLOYD_MAX_FORMATS = ("int5", "int4", "int3", "int2")
VECTOR_FORMATS = ("int4", "int2", "int1")
GRANULARITIES = ("per_tensor", "per_token", "per_channel", "per_group")
SCALE_DTYPES = ("float32", "bfloat16", "float16", "float8_e4m3fn",
                "float8_e5m2")
# 8-bit scales: for the codebook schemes only (lloyd_max, vector), whose
# least-squares scale is rounded to nearest and has no zero point: a
# relative step of 2^-3 (e4m3fn; normal from 2^-6, max 448) or 2^-2 (e5m2;
# normal from 2^-14, max 57344), against 2^-7 for bfloat16.
FP8_SCALE_DTYPES = ("float8_e4m3fn", "float8_e5m2")
# kvq: the project's rounding (scale rounded up into scale_dtype, codes from
#   the stored scale, round half to even).
# ggml: llama.cpp's (gguf-py's) arithmetic: scale and zero in float32, codes
#   from its float32 reciprocal, then scale and zero rounded to nearest.
ROUNDINGS = ("kvq", "ggml")

_INT_FORMATS = ("int8", "int5", "int4", "int3", "int2")
_BITS = {"int8": 8, "int5": 5, "int4": 4, "int3": 3, "int2": 2, "int1": 1,
         "fp8_e4m3": 8, "fp8_e5m2": 8}
_FP8_DTYPES = {"fp8_e4m3": jnp.float8_e4m3fn, "fp8_e5m2": jnp.float8_e5m2}


def _allowed(values: Sequence[str]) -> str:
  return ", ".join(values)


@dataclasses.dataclass(frozen=True)
class QuantSpec:
  """How one tensor is quantized.

  Attributes:
    format: storage format, one of `FORMATS`.
    scheme: one of `SCHEMES`: "symmetric" (scale only, all 2^bits codes; the
      stored scale is signed), "symmetric_narrow" (scale only, 2^bits - 1
      codes, positive scale; integer formats only), "asymmetric" (scale and
      zero point; integer formats only) or "lloyd_max" (scale only; codes
      index the Lloyd-Max codebook of `kvq_jax.quant.codebook` for the
      group's element count; int5..int2, per_token or per_group along the
      last axis, rounding kvq, clip_ratio 1) or "static" (no scale at all:
      uniform codes over the fixed range [-clip_ratio, clip_ratio]; integer
      formats, per_token, rounding kvq), or over `levels` when given, or
      "vector" (scale only; one uint8 index per 8 // bits elements into
      `kvq_jax.quant.vector_codebook`'s table; int4, int2 and int1,
      otherwise as lloyd_max).
    granularity: one of `GRANULARITIES` (see the module docstring).
    group_size: per_group: elements per group along `group_axis` (required).
      per_channel: tokens per group along `group_axis` (None: the whole axis).
      Must be None for per_token and per_tensor.
    axis: the (negative) axis a group runs along; None means -1 for
      per_token/per_group and -3 for per_channel. Must be None for per_tensor.
    clip_ratio: r in (0, 1]; values outside the clipped range saturate.
      symmetric: the group's signed max m becomes r * m; symmetric_narrow and
      fp8: its absmax becomes r * absmax; asymmetric: its range [lo, hi]
      shrinks around the centre c = (lo + hi) / 2 to [c - r * w, c + r * w],
      w = (hi - lo) / 2.
    scale_dtype: dtype of the stored scale (and zero point); the 8-bit
      `FP8_SCALE_DTYPES` for schemes lloyd_max and vector only.
    rounding: one of `ROUNDINGS`. "kvq" (default): the project's rule. "ggml":
      llama.cpp's arithmetic, so that quantize -> dequantize reproduces
      gguf-py's Q8_0 (int8 symmetric_narrow), Q4_0 / Q5_0 (int4 / int5
      symmetric) and Q4_1 / Q5_1 (int4 / int5 asymmetric), per_group of 32
      along the last axis, element for element. Requires an integer format,
      scale_dtype float16 (ggml stores half-precision scales) and clip_ratio
      1 (ggml does not clip); other group sizes and granularities use the
      same per-group arithmetic. Non-finite inputs follow the project's
      policy in both roundings (`kvq_jax.quant.quantize`).
    outliers: n >= 0 values of largest magnitude per vector (along the last
      axis) kept exactly, in scale_dtype, with their uint8 index
      (dense-and-sparse, KVQuant); the rest is quantized with the range they
      leave. Groups along the last axis only (per_token, per_group), rounding
      kvq, integer formats, n < the vector length (checked per shape), last
      axis <= 256 (uint8 indices).
    levels: scheme static only: () for the uniform levels, or the 2^bits
      strictly increasing reconstruction values of a calibrated codebook
      (float32; codes go to the nearest, ties to the lower).
    component_bits: scheme static only: () (every element `bits` bits), or
      one width in 0..8 per element of the last axis (transform coding:
      `kvq_jax.quant.component_codes`); the codes of a vector are packed
      into ceil(sum / 8) bytes. `format` stays the nominal budget (the
      allocation's mean width) and `levels` must be ().
    width_levels: with component_bits: ((width, 2^width increasing levels),
      ...) calibrated codebooks of the widths in use; a width without one
      uses the uniform static levels over [-clip_ratio, clip_ratio].
  """

  format: str = "int4"
  scheme: str = "symmetric"
  granularity: str = "per_group"
  group_size: int | None = None
  axis: int | None = None
  clip_ratio: float = 1.0
  scale_dtype: str = "bfloat16"
  rounding: str = "kvq"
  outliers: int = 0
  levels: tuple[float, ...] = ()
  component_bits: tuple[int, ...] = ()
  width_levels: tuple = ()

  def __post_init__(self):
    if not isinstance(self.levels, (tuple, list)):
      raise ValueError(
          f"QuantSpec.levels={self.levels!r}: allowed: () or a sequence of "
          "2^bits floats.")
    object.__setattr__(self, "levels", tuple(self.levels))  # JSON gives lists.
    if self.format not in FORMATS:
      raise ValueError(
          f"QuantSpec.format={self.format!r} is not supported; allowed: "
          f"{_allowed(FORMATS)}.")
    if self.scheme not in SCHEMES:
      raise ValueError(
          f"QuantSpec.scheme={self.scheme!r} is not supported; allowed: "
          f"{_allowed(SCHEMES)}.")
    if self.format == "int1" and self.scheme != "vector":
      raise ValueError(
          f"QuantSpec.scheme={self.scheme!r} is not supported for "
          "format='int1'; int1 allows only: vector (one 8-bit index per 8 "
          "elements).")
    if self.is_float and self.scheme != "symmetric":
      raise ValueError(
          f"QuantSpec.scheme={self.scheme!r} is not supported for "
          f"format={self.format!r}; fp8 formats allow only: symmetric.")
    if self.rounding not in ROUNDINGS:
      raise ValueError(
          f"QuantSpec.rounding={self.rounding!r} is not supported; allowed: "
          f"{_allowed(ROUNDINGS)}.")
    if self.granularity not in GRANULARITIES:
      raise ValueError(
          f"QuantSpec.granularity={self.granularity!r} is not supported; "
          f"allowed: {_allowed(GRANULARITIES)}.")
    if self.scale_dtype not in SCALE_DTYPES:
      raise ValueError(
          f"QuantSpec.scale_dtype={self.scale_dtype!r} is not supported; "
          f"allowed: {_allowed(SCALE_DTYPES)}.")
    if self.scale_dtype in FP8_SCALE_DTYPES and (
        self.scheme not in ("lloyd_max", "vector") or self.outliers):
      raise ValueError(
          f"QuantSpec.scale_dtype={self.scale_dtype!r} with scheme="
          f"{self.scheme!r}, outliers={self.outliers!r}; an 8-bit scale is "
          "allowed for scheme lloyd_max or vector without outliers (their "
          "scale is rounded to nearest; other schemes round it up and keep "
          "outliers and zeros in scale_dtype).")
    if (isinstance(self.clip_ratio, bool)
        or not isinstance(self.clip_ratio, (int, float))
        or not 0.0 < self.clip_ratio <= 1.0):
      raise ValueError(
          f"QuantSpec.clip_ratio={self.clip_ratio!r} is out of range; "
          "allowed: a float in (0, 1].")
    if self.rounding == "ggml":
      self._validate_ggml()
    self._validate_group_size()
    self._validate_axis()
    if self.scheme in ("lloyd_max", "vector"):
      self._validate_lloyd_max()
    if self.scheme == "static":
      self._validate_static()
    self._validate_outliers()
    self._validate_components()
    if self.levels and self.scheme != "static":
      raise ValueError(
          f"QuantSpec.levels is set for scheme={self.scheme!r}; allowed: "
          "scheme='static' only (other schemes compute their levels).")

  def _validate_static(self):
    problems = []
    if self.format not in _INT_FORMATS:
      problems.append(f"format={self.format!r} (allowed: "
                      f"{_allowed(_INT_FORMATS)})")
    if self.granularity != "per_token":
      problems.append(f"granularity={self.granularity!r} (allowed: "
                      "per_token; the range is fixed, nothing is grouped)")
    if self.rounding != "kvq":
      problems.append(f"rounding={self.rounding!r} (allowed: kvq)")
    if problems:
      raise ValueError(
          "QuantSpec.scheme='static' does not support "
          + "; ".join(problems) + ".")
    if self.levels:
      levels = np.asarray(self.levels, np.float32)
      if (levels.shape != (2 ** self.bits,) or not np.all(np.isfinite(levels))
          or not np.all(np.diff(levels) > 0)):
        raise ValueError(
            f"QuantSpec.levels has {levels.size} values for format="
            f"{self.format!r}; allowed: () or {2 ** self.bits} finite, "
            "strictly increasing values.")
      object.__setattr__(self, "levels", tuple(levels.tolist()))

  def _validate_components(self):
    widths = self.component_bits
    if not isinstance(widths, (tuple, list)) or not isinstance(
        self.width_levels, (tuple, list)):
      raise ValueError(
          "QuantSpec.component_bits / width_levels: allowed: tuples.")
    if not widths:
      if self.width_levels:
        raise ValueError("QuantSpec.width_levels is set without "
                         "component_bits; allowed: () there.")
      object.__setattr__(self, "component_bits", ())  # JSON gives lists.
      object.__setattr__(self, "width_levels", ())
      return
    if (any(isinstance(w, bool) or not isinstance(w, (int, np.integer))
            or not 0 <= w <= 8 for w in widths)):
      raise ValueError(
          f"QuantSpec.component_bits={tuple(widths)}: allowed: one integer "
          "width in 0..8 per component.")
    if self.scheme != "static" or self.levels:
      raise ValueError(
          f"QuantSpec.component_bits needs scheme='static' without levels "
          f"(got scheme={self.scheme!r}, {len(self.levels)} levels); the "
          "codebooks of its widths go in width_levels.")
    object.__setattr__(self, "component_bits", tuple(int(w) for w in widths))
    books = []
    for entry in self.width_levels:
      width, levels = int(entry[0]), np.asarray(entry[1], np.float32)
      if (width not in self.component_bits or width == 0
          or levels.shape != (2 ** width,) or not np.all(np.isfinite(levels))
          or not np.all(np.diff(levels) > 0)):
        raise ValueError(
            f"QuantSpec.width_levels entry for width {width}: allowed: a "
            "width in use (> 0) with 2^width finite, strictly increasing "
            "levels.")
      books.append((width, tuple(levels.tolist())))
    if len({w for w, _ in books}) != len(books):
      raise ValueError("QuantSpec.width_levels names a width twice.")
    object.__setattr__(self, "width_levels", tuple(sorted(books)))

  def _validate_outliers(self):
    n = self.outliers
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
      raise ValueError(
          f"QuantSpec.outliers={n!r}: allowed: an integer >= 0 (values kept "
          "exactly per vector).")
    if not n:
      return
    problems = []
    if self.granularity not in ("per_token", "per_group") or self.axis not in (
        None, -1):
      problems.append(f"granularity={self.granularity!r}, axis={self.axis!r} "
                      "(allowed: per_token or per_group along the last axis)")
    if self.is_float:
      problems.append(f"format={self.format!r} (allowed: "
                      f"{_allowed(_INT_FORMATS)})")
    if self.rounding != "kvq":
      problems.append(f"rounding={self.rounding!r} (allowed: kvq)")
    if problems:
      raise ValueError(
          f"QuantSpec.outliers={n} does not support " + "; ".join(problems)
          + ".")

  def _validate_lloyd_max(self):
    """Checks a codebook scheme: lloyd_max or vector."""
    allowed = (VECTOR_FORMATS if self.scheme == "vector"
               else LLOYD_MAX_FORMATS)
    problems = []
    if self.format not in allowed:
      problems.append(f"format={self.format!r} (allowed: "
                      f"{_allowed(allowed)})")
    if self.granularity not in ("per_token", "per_group"):
      problems.append(f"granularity={self.granularity!r} (allowed: "
                      "per_token, per_group)")
    if self.axis not in (None, -1):
      problems.append(f"axis={self.axis!r} (allowed: None or -1: the "
                      "codebook is for the elements of one vector)")
    if self.rounding != "kvq":
      problems.append(f"rounding={self.rounding!r} (allowed: kvq)")
    if self.clip_ratio != 1.0:
      problems.append(f"clip_ratio={self.clip_ratio!r} (allowed: 1.0; the "
                      "codebook's outer cells already bound the range)")
    if (self.scheme == "vector" and self.granularity == "per_group"
        and self.group_size and self.format in VECTOR_FORMATS
        and self.group_size % (8 // self.bits)):
      problems.append(f"group_size={self.group_size} (allowed: a multiple "
                      f"of {8 // self.bits}, the elements of one index)")
    if problems:
      raise ValueError(
          f"QuantSpec.scheme={self.scheme!r} does not support "
          + "; ".join(problems) + ".")

  def _validate_ggml(self):
    if self.is_float:
      raise ValueError(
          f"QuantSpec.rounding='ggml' is not supported for format="
          f"{self.format!r}: ggml's arithmetic is for integer codes; allowed: "
          f"{_allowed([f for f in FORMATS if f.startswith('int')])}.")
    if self.scale_dtype != "float16":
      raise ValueError(
          f"QuantSpec.rounding='ggml' needs scale_dtype='float16' (ggml "
          f"stores its scales and minima as float16), got "
          f"{self.scale_dtype!r}; allowed: float16.")
    if self.clip_ratio != 1.0:
      raise ValueError(
          f"QuantSpec.rounding='ggml' needs clip_ratio=1.0 (ggml does not "
          f"clip), got {self.clip_ratio!r}; allowed: 1.0.")

  def _validate_group_size(self):
    gs = self.group_size
    if gs is not None and (isinstance(gs, bool) or not isinstance(gs, int)):
      raise ValueError(
          f"QuantSpec.group_size={gs!r} must be an int or None.")
    if self.granularity in ("per_token", "per_tensor"):
      if gs is not None:
        raise ValueError(
            f"QuantSpec.group_size={gs!r} is set but granularity="
            f"{self.granularity!r} has one group per "
            f"{'vector' if self.granularity == 'per_token' else 'tensor'}; "
            "allowed: None.")
    elif self.granularity == "per_group":
      if gs is None or gs < 1:
        raise ValueError(
            f"QuantSpec.group_size={gs!r} is invalid for granularity="
            "'per_group'; allowed: a positive int (elements per group).")
    elif self.granularity == "per_channel":
      if gs is not None and gs < 2:
        raise ValueError(
            f"QuantSpec.group_size={gs!r} is invalid for granularity="
            "'per_channel'; allowed: None (whole token axis) or an int >= 2 "
            "(tokens per group).")

  def _validate_axis(self):
    axis = self.axis
    if axis is None:
      return
    if self.granularity == "per_tensor":
      raise ValueError(
          f"QuantSpec.axis={axis!r} is set but granularity='per_tensor' has "
          "no group axis; allowed: None.")
    if isinstance(axis, bool) or not isinstance(axis, int) or axis >= 0:
      raise ValueError(
          f"QuantSpec.axis={axis!r} is not supported; allowed: None or a "
          "negative int (counted from the end, so it survives vmap).")

  # Derived properties.

  @property
  def bits(self) -> int:
    """Bits of one stored code: 8, 5, 4, 3, 2 (8 for both fp8 formats)."""
    return _BITS[self.format]

  @property
  def has_zero(self) -> bool:
    """Whether a zero point is stored (scheme asymmetric)."""
    return self.scheme == "asymmetric"

  @property
  def has_scale(self) -> bool:
    """Whether a scale is stored (every scheme but static)."""
    return self.scheme != "static"

  @property
  def is_codebook(self) -> bool:
    """Codes index a codebook: Lloyd-Max levels (scheme lloyd_max) or
    vectors (scheme vector)."""
    return self.scheme in ("lloyd_max", "vector")

  @property
  def is_vector(self) -> bool:
    """One index codes `vector_dim` elements (scheme vector)."""
    return self.scheme == "vector"

  @property
  def vector_dim(self) -> int:
    """Elements per stored index: 8 // bits for scheme vector, else 1."""
    return 8 // self.bits if self.is_vector else 1

  @property
  def is_float(self) -> bool:
    return self.format.startswith("fp8")

  @property
  def fp8_dtype(self):
    """The jnp fp8 dtype of `data` (fp8 formats only)."""
    if not self.is_float:
      raise ValueError(
          f"QuantSpec.format={self.format!r} is not an fp8 format; "
          f"fp8_dtype exists for: {_allowed(tuple(_FP8_DTYPES))}.")
    return _FP8_DTYPES[self.format]

  @property
  def codes_per_byte(self) -> int | fractions.Fraction:
    """Codes per stored byte: 1, 2, 4 (an int), or Fraction(8, bits) for
    int3 and int5.

    `n // codes_per_byte` is the packed byte count and `n % codes_per_byte == 0`
    the packing condition for every format (Fraction arithmetic is exact).
    """
    value = fractions.Fraction(8, self.bits)
    return int(value) if value.denominator == 1 else value

  @property
  def pack_block(self) -> int:
    """Codes packed together into whole bytes: 1, 2, 4, or 8 (int3, int5)."""
    return 8 // self.bits if 8 % self.bits == 0 else 8

  @property
  def scale_jnp_dtype(self):
    return jnp.dtype(self.scale_dtype)

  @property
  def group_axis(self) -> int:
    """The resolved (negative) group axis; -1 for per_tensor (unused there)."""
    if self.axis is not None:
      return self.axis
    return -3 if self.granularity == "per_channel" else -1

  def packed_dim(self, last_dim: int) -> int:
    """Length of the packed last axis of `data` for `last_dim` codes."""
    if self.component_bits:
      return -(-sum(self.component_bits) // 8)
    return last_dim * self.bits // 8

  def elements_per_group(self, axis_len: int) -> int:
    """Elements sharing one scale when the group axis has length `axis_len`.

    For per_tensor, `axis_len` is taken as the whole element count.
    """
    if self.granularity == "per_group" or (
        self.granularity == "per_channel" and self.group_size is not None):
      return self.group_size
    return axis_len

  def validate_shape(self, shape: Sequence[int]) -> None:
    """Raises ValueError if a tensor of `shape` cannot use this spec."""
    shape = tuple(shape)
    if not shape:
      raise ValueError(
          f"QuantSpec: cannot quantize a rank-0 tensor (shape={shape}); "
          "allowed: rank >= 1.")
    last = shape[-1]
    if self.component_bits and len(self.component_bits) != last:
      raise ValueError(
          f"QuantSpec.component_bits has {len(self.component_bits)} widths "
          f"for vectors of {last} elements (shape={shape}); allowed: one "
          "width per element of the last axis.")
    if not self.component_bits and last % self.pack_block:
      raise ValueError(
          f"QuantSpec.format={self.format!r} packs {self.pack_block} codes "
          f"together along the last axis, but its length is {last} "
          f"(shape={shape}); allowed: a multiple of {self.pack_block}.")
    if self.granularity == "per_tensor":
      return
    axis = self.group_axis
    if -axis > len(shape):
      raise ValueError(
          f"QuantSpec.axis={axis} is out of range for a rank-{len(shape)} "
          f"tensor (shape={shape}); allowed: -{len(shape)}..-1.")
    length = shape[axis]
    if self.granularity == "per_channel" and length < 2:
      raise ValueError(
          f"QuantSpec.granularity='per_channel' groups along axis {axis} "
          f"(tokens), which has length {length} (shape={shape}); allowed: "
          "length >= 2. Quantize single tokens per_token instead.")
    if self.outliers and not self.outliers < last <= 256:
      raise ValueError(
          f"QuantSpec.outliers={self.outliers} for vectors of {last} elements "
          f"(shape={shape}); allowed: fewer outliers than elements and at most "
          "256 elements (uint8 indices).")
    if self.group_size is not None and length % self.group_size:
      raise ValueError(
          f"QuantSpec.group_size={self.group_size} does not divide the length "
          f"{length} of axis {axis} (shape={shape}); allowed: a divisor of "
          f"{length}.")
