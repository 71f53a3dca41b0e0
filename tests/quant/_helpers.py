"""Test-side re-implementation of the grouping (independent of the library)."""

from __future__ import annotations

import numpy as np

from kvq_jax.quant import QuantSpec

SHAPE = (2, 8, 2, 16)  # [B, T, K, H]

GROUPINGS = [
    dict(granularity="per_tensor"),
    dict(granularity="per_token"),
    dict(granularity="per_channel"),
    dict(granularity="per_channel", group_size=4),
    dict(granularity="per_group", group_size=8),
    dict(granularity="per_group", group_size=4, axis=-3),
]


def grouping_id(g: dict) -> str:
  return "-".join(f"{v}" for v in g.values())


def per_element(stat: np.ndarray, spec: QuantSpec, shape) -> np.ndarray:
  """Broadcasts a stored per-group statistic to every element of `shape`."""
  stat = np.asarray(stat, np.float64)
  if spec.granularity == "per_tensor":
    assert stat.shape == (1,) * len(shape)
    return np.broadcast_to(stat, shape)
  axis = len(shape) + spec.group_axis
  g = spec.group_size or shape[axis]
  assert stat.shape == shape[:axis] + (shape[axis] // g,) + shape[axis + 1:]
  return np.repeat(stat, g, axis=axis)


def group_ids(spec: QuantSpec, shape) -> np.ndarray:
  """An integer id per element: elements sharing a scale share an id."""
  if spec.granularity == "per_tensor":
    return np.zeros(shape, np.int64)
  axis = len(shape) + spec.group_axis
  g = spec.group_size or shape[axis]
  idx = np.indices(shape)
  idx[axis] //= g
  dims = [s if a != axis else s // g for a, s in enumerate(shape)]
  return np.ravel_multi_index(tuple(idx), dims)
