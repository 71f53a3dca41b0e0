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

FORMATS = ("int8", "int4", "int3", "int2", "fp8_e4m3", "fp8_e5m2")
SCHEMES = ("symmetric", "asymmetric")
GRANULARITIES = ("per_tensor", "per_token", "per_channel", "per_group")
SCALE_DTYPES = ("float32", "bfloat16", "float16")

_BITS = {"int8": 8, "int4": 4, "int3": 3, "int2": 2, "fp8_e4m3": 8,
         "fp8_e5m2": 8}
_FP8_DTYPES = {"fp8_e4m3": jnp.float8_e4m3fn, "fp8_e5m2": jnp.float8_e5m2}


def _allowed(values: Sequence[str]) -> str:
  return ", ".join(values)


@dataclasses.dataclass(frozen=True)
class QuantSpec:
  """How one tensor is quantized.

  Attributes:
    format: storage format, one of `FORMATS`.
    scheme: "symmetric" (scale only) or "asymmetric" (scale and zero point,
      integer formats only).
    granularity: one of `GRANULARITIES` (see the module docstring).
    group_size: per_group: elements per group along `group_axis` (required).
      per_channel: tokens per group along `group_axis` (None: the whole axis).
      Must be None for per_token and per_tensor.
    axis: the (negative) axis a group runs along; None means -1 for
      per_token/per_group and -3 for per_channel. Must be None for per_tensor.
    clip_ratio: in (0, 1]; the group's absmax (or min and max) is multiplied
      by it and values outside the clipped range saturate.
    scale_dtype: dtype of the stored scale (and zero point).
  """

  format: str = "int4"
  scheme: str = "symmetric"
  granularity: str = "per_group"
  group_size: int | None = None
  axis: int | None = None
  clip_ratio: float = 1.0
  scale_dtype: str = "bfloat16"

  def __post_init__(self):
    if self.format not in FORMATS:
      raise ValueError(
          f"QuantSpec.format={self.format!r} is not supported; allowed: "
          f"{_allowed(FORMATS)}.")
    if self.scheme not in SCHEMES:
      raise ValueError(
          f"QuantSpec.scheme={self.scheme!r} is not supported; allowed: "
          f"{_allowed(SCHEMES)}.")
    if self.is_float and self.scheme != "symmetric":
      raise ValueError(
          f"QuantSpec.scheme={self.scheme!r} is not supported for "
          f"format={self.format!r}; fp8 formats allow only: symmetric.")
    if self.granularity not in GRANULARITIES:
      raise ValueError(
          f"QuantSpec.granularity={self.granularity!r} is not supported; "
          f"allowed: {_allowed(GRANULARITIES)}.")
    if self.scale_dtype not in SCALE_DTYPES:
      raise ValueError(
          f"QuantSpec.scale_dtype={self.scale_dtype!r} is not supported; "
          f"allowed: {_allowed(SCALE_DTYPES)}.")
    if (isinstance(self.clip_ratio, bool)
        or not isinstance(self.clip_ratio, (int, float))
        or not 0.0 < self.clip_ratio <= 1.0):
      raise ValueError(
          f"QuantSpec.clip_ratio={self.clip_ratio!r} is out of range; "
          "allowed: a float in (0, 1].")
    self._validate_group_size()
    self._validate_axis()

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
    """Bits of one stored code: 8, 4, 3, 2 (8 for both fp8 formats)."""
    return _BITS[self.format]

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
    """Codes per stored byte: 1, 2, 4 (an int), or Fraction(8, 3) for int3.

    `n // codes_per_byte` is the packed byte count and `n % codes_per_byte == 0`
    the packing condition for every format (Fraction arithmetic is exact).
    """
    value = fractions.Fraction(8, self.bits)
    return int(value) if value.denominator == 1 else value

  @property
  def pack_block(self) -> int:
    """Codes packed together into whole bytes: 1, 2, 8 (int3) or 4."""
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
    if last % self.pack_block:
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
    if self.group_size is not None and length % self.group_size:
      raise ValueError(
          f"QuantSpec.group_size={self.group_size} does not divide the length "
          f"{length} of axis {axis} (shape={shape}); allowed: a divisor of "
          f"{length}.")
