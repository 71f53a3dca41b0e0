"""llama.cpp's block types as `QuantSpec`s: the peer-exact formats.

`ggml_spec(name)` is the spec whose `quantize` -> `dequantize` gives, element
for element, gguf-py's `quants.quantize(x, GGMLQuantizationType.NAME)` ->
`quants.dequantize(...)` for a float32 `x` whose last axis holds ggml's rows
(blocks of 32 consecutive elements; see `kvq_jax.quant.quantize` for the
arithmetic and its exceptions: non-finite inputs, float32 denormals, scales
beyond float16's range). The bytes differ (ggml interleaves scale and codes
per block, and splits q5 codes into nibbles and fifth bits); the values and
the bits per element do not:

  name   format  scheme            bits/element
  q8_0   int8    symmetric_narrow  8.5   (float16 d)
  q4_0   int4    symmetric         4.5   (float16 d)
  q4_1   int4    asymmetric        5.0   (float16 d and m)
  q5_0   int5    symmetric         5.5   (float16 d)
  q5_1   int5    asymmetric        6.0   (float16 d and m)
"""

from __future__ import annotations

import dataclasses

from kvq_jax.quant.spec import QuantSpec

GGML_BLOCK = 32
_TYPES = {
    "q8_0": ("int8", "symmetric_narrow"),
    "q4_0": ("int4", "symmetric"),
    "q4_1": ("int4", "asymmetric"),
    "q5_0": ("int5", "symmetric"),
    "q5_1": ("int5", "asymmetric"),
}
GGML_TYPES = tuple(_TYPES)


def ggml_spec(name: str) -> QuantSpec:
  """The spec reproducing llama.cpp type `name` (q8_0, q4_0, q4_1, ...)."""
  if name not in _TYPES:
    raise ValueError(
        f"ggml_spec: {name!r} is not a supported llama.cpp type; allowed: "
        f"{', '.join(GGML_TYPES)}.")
  fmt, scheme = _TYPES[name]
  return QuantSpec(format=fmt, scheme=scheme, granularity="per_group",
                   group_size=GGML_BLOCK, scale_dtype="float16",
                   rounding="ggml")


def ggml_name(spec: QuantSpec) -> str | None:
  """The llama.cpp type `spec` reproduces exactly, or None."""
  if spec.axis == -1:  # The default group axis, spelled out.
    spec = dataclasses.replace(spec, axis=None)
  for name in GGML_TYPES:
    if spec == ggml_spec(name):
      return name
  return None
