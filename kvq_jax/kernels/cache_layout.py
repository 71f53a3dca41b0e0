"""What a decode kernel needs to know about one packed K or V cache tensor.

The quantized cache stores keys and values heads-major, [B, K, S, H], as a
`kvq_jax.quant.QuantizedArray` (leaves `data`, `scale`, `zero`; static `spec`):

* `data`: uint8 codes packed along the last axis (head_dim). int8: one code
  per byte; int4: element 2i in the low nibble of byte i, 2i+1 in the high
  nibble; int2: element 4i+j in bits 2j..2j+1 of byte i.
* `scale` / `zero` (zero for asymmetric only), either
  - "row" scales, group axis -1: [B, K, S, H/g] (per_token: H/g = 1), or
  - "token-group" scales, group axis -2 (KIVI per-channel keys):
    [B, K, S/gt, H], one scale per channel over gt consecutive tokens.
* symmetric and symmetric_narrow: x = (u - 2^(bits-1)) * scale (the scale is
  signed: negative for symmetric groups whose signed max is positive);
  asymmetric: x = u * scale + zero.

`describe_packed` turns that into a small frozen `PackedLayout`, or a
human-readable reason why the kernel cannot read it. The kernel unpacks a byte
into `parts = 8 / bits` code planes: plane j holds the elements h = parts*i+j,
so no in-kernel interleave is needed (queries and outputs are permuted
outside the kernel instead).
"""

from __future__ import annotations

import dataclasses
from typing import Any

SUPPORTED_FORMATS = ("int8", "int4", "int2")
SUPPORTED_GRANULARITIES = ("per_token", "per_group", "per_channel")
_BITS = {"int8": 8, "int4": 4, "int2": 2}


@dataclasses.dataclass(frozen=True)
class PackedLayout:
  """Static description of one packed [B, K, S, H] cache tensor.

  Attributes:
    bits: bits per code (8, 4 or 2).
    symmetric: scale only (scheme symmetric or symmetric_narrow) vs
      asymmetric (scale and zero).
    scale_axis: -1 ("row" scales [B, K, S, H/g]) or -2 ("token-group" scales
      [B, K, S/gt, H]).
    n_groups: scales per row along head_dim (scale_axis -1), else 1.
    token_group: tokens per scale (scale_axis -2), else 1.
  """

  bits: int
  symmetric: bool
  scale_axis: int
  n_groups: int = 1
  token_group: int = 1

  @property
  def parts(self) -> int:
    """Code planes per byte (8 / bits)."""
    return 8 // self.bits

  @property
  def offset(self) -> int:
    """The symmetric code offset 2^(bits-1)."""
    return 1 << (self.bits - 1)


def describe_packed(x: Any, head_dim: int, name: str,
                    num_slots: int) -> PackedLayout | str:
  """Returns the layout of packed cache tensor `x`, or why it is unsupported.

  Args:
    x: a QuantizedArray-like object (`data`, `scale`, `zero`, `spec`).
    head_dim: H, the unpacked last dimension.
    name: "k" or "v", used in messages.
    num_slots: S, the cache slots.
  """
  spec = getattr(x, "spec", None)
  if spec is None or not hasattr(x, "data") or not hasattr(x, "scale"):
    return (f"{name} must be a kvq_jax.quant.QuantizedArray (data, scale, "
            f"zero, spec); got {type(x).__name__}.")
  fmt = spec.format
  if fmt not in SUPPORTED_FORMATS:
    return (f"{name}.spec.format={fmt!r} is not supported by the decode "
            "kernel: it unpacks integer codes with shifts and masks, which "
            f"needs a bit width dividing 8; supported: "
            f"{', '.join(SUPPORTED_FORMATS)}.")
  if getattr(spec, "is_codebook", False):
    return (f"{name}.spec.scheme={spec.scheme!r}: the decode kernel turns "
            "codes into values with a scale and an offset; a codebook "
            "lookup is not implemented (use attention_impl='xla').")
  if not getattr(spec, "has_scale", True):
    return (f"{name}.spec.scheme='static': the decode kernel reads a stored "
            "scale per group; a fixed-range format is not implemented (use "
            "attention_impl='xla').")
  if getattr(spec, "outliers", 0):
    return (f"{name}.spec.outliers={spec.outliers}: the decode kernel does "
            "not write sparse outliers back (use attention_impl='xla').")
  gran = spec.granularity
  if gran not in SUPPORTED_GRANULARITIES:
    return (f"{name}.spec.granularity={gran!r} is not supported by the decode "
            "kernel (a per_tensor scale would be a scalar shared by all "
            "blocks: fold it into q or use per_token); supported: "
            f"{', '.join(SUPPORTED_GRANULARITIES)}.")
  bits = _BITS[fmt]
  parts = 8 // bits
  symmetric = not spec.has_zero  # symmetric and symmetric_narrow.
  data, scale = x.data, x.scale
  zero = getattr(x, "zero", None)
  lead = data.shape[:3] if data.ndim == 4 else None
  if data.ndim != 4 or data.shape[-1] * parts != head_dim:
    return (f"{name}.data has shape {tuple(data.shape)}; expected the packed "
            f"heads-major cache [B, K, S, H*bits/8] = [B, K, {num_slots}, "
            f"{head_dim * bits // 8}] for head_dim={head_dim}, {fmt}.")
  if lead[2] != num_slots:
    return (f"{name}.data has {lead[2]} slots, the other cache tensor "
            f"{num_slots}; K and V must have the same [B, K, S].")
  if str(data.dtype) != "uint8":
    return f"{name}.data.dtype={data.dtype}; expected uint8 packed codes."
  if symmetric == (zero is not None):
    return (f"{name}: scheme={spec.scheme!r} but zero is "
            f"{'set' if zero is not None else 'None'}; symmetric caches have "
            "no zero point, asymmetric ones need one.")
  if zero is not None and tuple(zero.shape) != tuple(scale.shape):
    return (f"{name}.zero has shape {tuple(zero.shape)}, scale "
            f"{tuple(scale.shape)}; they must match.")
  if scale.ndim != 4 or tuple(scale.shape[:2]) != tuple(lead[:2]):
    return (f"{name}.scale has shape {tuple(scale.shape)}; expected rank 4 "
            f"with leading [B, K] = {tuple(lead[:2])}.")
  axis = spec.group_axis
  if gran == "per_channel" and axis not in (-2,):
    return (f"{name}.spec: per_channel groups along axis {axis}; the "
            "heads-major cache [B, K, S, H] groups tokens along axis -2 "
            "(QuantSpec(..., axis=-2)).")
  if axis == -1:
    if scale.shape[2] != num_slots:
      return (f"{name}.scale has shape {tuple(scale.shape)}; row scales "
              f"(group axis -1) need [B, K, S={num_slots}, H/g].")
    n_groups = scale.shape[3]
    if n_groups < 1 or head_dim % n_groups:
      return (f"{name}.scale has {n_groups} groups along head_dim "
              f"{head_dim}; expected a divisor of head_dim.")
    group = head_dim // n_groups
    if n_groups > 1 and group % parts:
      return (f"{name}: group size {group} along head_dim is not a multiple "
              f"of the {parts} codes packed per byte ({fmt}); the kernel "
              "needs every byte inside one group.")
    return PackedLayout(bits, symmetric, -1, n_groups=n_groups)
  if axis == -2:
    n_token_groups = scale.shape[2]
    if scale.shape[3] != head_dim or num_slots % n_token_groups:
      return (f"{name}.scale has shape {tuple(scale.shape)}; token-group "
              f"scales (group axis -2) need [B, K, S/gt, H={head_dim}] with "
              f"S={num_slots} a multiple of S/gt.")
    return PackedLayout(bits, symmetric, -2,
                        token_group=num_slots // n_token_groups)
  return (f"{name}.spec.group_axis={axis} is not supported; the kernel reads "
          "scales grouped along head_dim (axis -1) or tokens (axis -2).")
