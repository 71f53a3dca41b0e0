"""Storage cost of quantized tensors: bits per element and real bytes."""

from __future__ import annotations

import hashlib

import jax
import jax.numpy as jnp
import numpy as np

from kvq_jax.quant import codebook, vector_codebook

from kvq_jax.quant.quantized_array import QuantizedArray
from kvq_jax.quant.spec import QuantSpec


def bits_per_element(spec: QuantSpec, axis_len: int | None = None) -> float:
  """Stored bits per logical element: code bits + metadata bits per group.

  Metadata is the scale (and, asymmetric, the zero point) in
  `spec.scale_dtype`, amortised over the elements of one group (none for
  scheme static), plus, with spec.outliers = n, n values in scale_dtype and
  n uint8 indices per vector of `axis_len` elements.

  Args:
    spec: the quantization spec.
    axis_len: length of the group axis (e.g. head_dim for per_token, the token
      count for per_channel with group_size None). Required for per_token and
      for per_channel without group_size. For per_tensor, the total element
      count to amortise the single scale over (None: metadata counted as 0).
      With outliers, the vector length (head_dim), required.
  """
  if axis_len is not None and (
      isinstance(axis_len, bool) or not isinstance(axis_len, int)
      or axis_len < 1):
    raise ValueError(
        f"bits_per_element: axis_len={axis_len!r} is invalid; allowed: None "
        "or a positive int.")
  value_bits = jnp.dtype(spec.scale_dtype).itemsize * 8
  outlier_bits = 0.0
  if spec.outliers:
    if axis_len is None:
      raise ValueError(
          f"bits_per_element: outliers={spec.outliers} are stored per "
          "vector; allowed: pass axis_len, the vector length.")
    outlier_bits = spec.outliers * (value_bits + 8) / axis_len
  if spec.component_bits:
    width = len(spec.component_bits)
    return spec.packed_dim(width) * 8 / width + outlier_bits
  if not spec.has_scale:
    return spec.bits + outlier_bits
  meta_bits = value_bits * (2 if spec.scheme == "asymmetric" else 1)
  needs_len = spec.granularity == "per_token" or (
      spec.granularity == "per_channel" and spec.group_size is None)
  if needs_len and axis_len is None:
    raise ValueError(
        f"bits_per_element: axis_len=None but granularity="
        f"{spec.granularity!r} (group_size={spec.group_size}) has one group "
        "per whole axis; allowed: pass axis_len, the group axis length.")
  if spec.granularity == "per_tensor" and axis_len is None:
    return float(spec.bits)
  return (spec.bits + meta_bits / spec.elements_per_group(axis_len)
          + outlier_bits)


def cache_bits_per_element(spec: QuantSpec, head_dim: int) -> float:
  """`bits_per_element` of a cache tensor spec: vectors of `head_dim`
  elements; per_channel groups run over tokens (their group_size)."""
  return bits_per_element(
      spec, None if spec.granularity == "per_channel" else head_dim)


def constant_arrays(spec: QuantSpec | None, last_dim: int) -> list[np.ndarray]:
  """Per-tensor constants a format needs besides its leaves: the Lloyd-Max
  codebook (2^bits float32 centroids) of a lloyd_max spec, the 256-vector
  table (float32 [256, 8 // bits]) of a vector spec, a static spec's
  calibrated levels (float32), a transform-coded spec's widths (uint8) and
  codebook per width (float32), else none. Charged by
  `kvq_jax.capacity.memory`: once per layer, except a fixed table
  (`has_fixed_table`), which is the same in every layer and charged once
  per model."""
  if spec is not None and spec.levels:
    return [np.asarray(spec.levels, np.float32)]
  if spec is not None and spec.component_bits:  # The widths, and codebooks.
    return [np.asarray(spec.component_bits, np.uint8)] + [
        np.asarray(levels, np.float32) for _, levels in spec.width_levels]
  if spec is None or not spec.is_codebook:
    return []
  if spec.is_vector:
    return [vector_codebook.centroids(spec.bits)]
  return [codebook.centroids(spec.bits, spec.elements_per_group(last_dim))]


def has_fixed_table(spec: QuantSpec | None) -> bool:
  """Whether `constant_arrays(spec)` is a table fixed by the format alone
  (the Lloyd-Max or vector codebook of N(0, 1) data, a function of bits and
  group size), not calibrated: one copy serves every layer that uses it."""
  return (spec is not None and spec.is_codebook and not spec.levels
          and not spec.component_bits)


def table_id(table) -> str:
  """A fixed table's identity by content (dtype, shape, sha256): equal ids
  are one stored copy."""
  a = np.ascontiguousarray(table)
  return f"{a.dtype.str}{a.shape}:{hashlib.sha256(a.tobytes()).hexdigest()}"


def nbytes(qa: QuantizedArray) -> int:
  """Bytes actually held by `qa`'s arrays (data, scale and zero if any)."""
  return int(sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(qa)))
