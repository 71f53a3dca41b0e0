"""`shard_cache`: KV heads over 'model', batch over 'data'.

Leaf layouts (see kvq_jax/cache):
  * DenseLayerCache and SlidingDenseLayerCache (a local layer's ring):
    k/v [B, S or R, K, H] -> P(data, None, model, None).
  * QuantizedLayerCache and SlidingQuantizedLayerCache: every storage leaf (packed codes, scales, zeros, or a
    plain store) and the window/sink buffers are [B, K, *, *]
    -> P(data, model, None, None).
  * length_B [B] -> P(data).
  * PagedLayerCache: its per-slot leaves (windows, sinks, lengths, block
    table) as above; its page pool [N, K, P, ...] -> P(None, model): every
    device holds its KV heads of every page, since any slot may own any
    page.
An axis whose size does not divide by its mesh axis (e.g. 1 KV head on a
4-way 'model' axis, or a batch of 3 on 2-way 'data') is replicated instead;
the other axis still shards. Called outside `jit` the leaves are moved with
`put_global` (`jax.device_put`, or each process's own shards on a mesh
spanning processes); inside `jit` (tracers) `with_sharding_constraint` is used,
so the same call shards a cache that a jitted function creates.
"""

from __future__ import annotations

from typing import Sequence

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from kvq_jax.cache.dense import DenseLayerCache
from kvq_jax.cache.paged.layer import PagedLayerCache
from kvq_jax.cache.quantized import QuantizedLayerCache
from kvq_jax.cache.sliding import SlidingDenseLayerCache
from kvq_jax.cache.sliding_quantized import SlidingQuantizedLayerCache
from kvq_jax.sharding.mesh import axis_size
from kvq_jax.sharding.placement import put_global


def _spec(shape: tuple[int, ...], kv_axis: int | None, data: int,
          model: int) -> P:
  axes: list[str | None] = [None] * len(shape)
  if shape and shape[0] % data == 0:
    axes[0] = "data"
  if kv_axis is not None and len(shape) > kv_axis and shape[kv_axis] % model == 0:
    axes[kv_axis] = "model"
  if data == 1 and axes[:1] == ["data"]:
    axes[0] = None
  if model == 1 and kv_axis is not None and len(shape) > kv_axis:
    axes[kv_axis] = None
  while axes and axes[-1] is None:
    axes.pop()
  return P(*axes)


def layer_partition_specs(layer, mesh: Mesh):
  """A pytree like `layer` of PartitionSpecs (module docstring)."""
  if isinstance(layer, (DenseLayerCache, SlidingDenseLayerCache)):
    kv_axis = 2
  elif isinstance(layer, (QuantizedLayerCache, SlidingQuantizedLayerCache)):
    kv_axis = 1
  else:
    raise ValueError(
        f"shard_cache: layer cache of type {type(layer).__name__} is not "
        "supported; allowed: DenseLayerCache, QuantizedLayerCache and their "
        "Sliding* ring variants.")
  data, model = axis_size(mesh, "data"), axis_size(mesh, "model")
  rule = lambda d: lambda x: _spec(tuple(x.shape),
                                   kv_axis if x.ndim == 4 else None, d, model)
  specs = jax.tree_util.tree_map(rule(data), layer)
  if isinstance(layer, PagedLayerCache):
    specs = specs.replace(
        k_store=jax.tree_util.tree_map(rule(1), layer.k_store),
        v_store=jax.tree_util.tree_map(rule(1), layer.v_store))
  return specs


def _place(x, sharding):
  if isinstance(x, jax.core.Tracer):
    return jax.lax.with_sharding_constraint(x, sharding)
  return put_global(x, sharding)


def shard_cache(cache: Sequence, mesh: Mesh) -> list:
  """Each layer's leaves placed by the module rule; returns a new list."""
  out = []
  for layer in cache:
    specs = layer_partition_specs(layer, mesh)
    out.append(jax.tree_util.tree_map(
        lambda x, s: _place(x, NamedSharding(mesh, s)), layer, specs))
  return out


def batch_sharding(batch_size: int, mesh: Mesh) -> NamedSharding:
  """Tokens [B, T]: batch over 'data' when it divides, else replicated."""
  data = axis_size(mesh, "data")
  return NamedSharding(mesh, P("data") if data > 1 and batch_size % data == 0
                       else P())
