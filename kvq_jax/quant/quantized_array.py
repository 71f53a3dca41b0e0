"""`QuantizedArray`: the pytree a quantized tensor travels as.

Leaves: `data` (uint8 packed codes, or float8 for fp8 formats), `scale`
(spec.scale_dtype; None for scheme static), `zero` (spec.scale_dtype,
asymmetric only; None otherwise) and, with spec.outliers = n > 0,
`outlier_value` (spec.scale_dtype) and `outlier_index` (uint8), both
[..., n]: the n values per vector kept exactly and their positions along the
last axis (None otherwise). Static aux data: `spec`, `last_dim` (logical length of the last
axis, which packing shrinks) and `dtype` (name of the original dtype).

The logical shape is not stored (it would be wrong after `vmap` adds a batch
dimension); `.shape` derives it from the leaves.

`scale`/`zero` have the rank of the logical tensor: n_groups along the group
axis (1 for per_token), all ones for per_tensor, the original size elsewhere.
"""

from __future__ import annotations

import dataclasses

import jax

from kvq_jax.quant.spec import QuantSpec


@dataclasses.dataclass(frozen=True)
class QuantizedArray:
  data: jax.Array
  scale: jax.Array | None
  zero: jax.Array | None
  spec: QuantSpec
  last_dim: int
  dtype: str
  outlier_value: jax.Array | None = None
  outlier_index: jax.Array | None = None

  @property
  def shape(self) -> tuple[int, ...]:
    """Logical shape: `data.shape[:-1] + (last_dim,)`."""
    return tuple(self.data.shape[:-1]) + (self.last_dim,)

  @property
  def ndim(self) -> int:
    return len(self.data.shape)


jax.tree_util.register_dataclass(
    QuantizedArray,
    data_fields=["data", "scale", "zero", "outlier_value", "outlier_index"],
    meta_fields=["spec", "last_dim", "dtype"])
