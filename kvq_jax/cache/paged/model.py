"""A whole model's paged cache, and the per-slot operations a server needs.

`init_paged_cache` builds one `PagedLayerCache` per global layer: a pool of
`num_pages` pages per layer, the same block table in every layer (a page
id names the same tokens in each layer's pool, as in vLLM). A
sliding-window (local) layer keeps its contiguous ring buffer per slot
(`cache/sliding.py`, `cache/sliding_quantized.py`): its size is bounded by
the window, not by the request, so paging it would buy nothing; it counts
as per-slot memory.

Slot operations act on the per-slot leaves only (lengths, block table,
windows, sinks, a ring buffer's whole state) and never touch another slot:
`select_slots` / `merge_slots` cut a sub-batch out of the cache and put it
back (the engine prefills one request while the others wait),
`reset_slots` empties slots for new requests, `with_block_table` installs
the host allocator's table.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from kvq_jax.cache import init_layer_caches
from kvq_jax.cache.factory import layer_cache
from kvq_jax.cache.paged.layer import DEFAULT_PAGE_SIZE, PagedLayerCache
from kvq_jax.cache.spec import CacheSpec, LayerSpec
from kvq_jax.models.config import ModelConfig

FULL_PRECISION = LayerSpec(k=None, v=None)


def paged_layer_spec(spec: CacheSpec | None, index: int) -> LayerSpec:
  """Layer `index`'s LayerSpec; `FULL_PRECISION` for a dense layer."""
  layer = None if spec is None else spec.layer(index)
  if layer is None or layer.is_full_precision:
    return FULL_PRECISION
  return layer


def init_paged_cache(config: ModelConfig, num_slots: int, num_pages: int,
                     max_pages: int, spec: CacheSpec | None = None,
                     dtype=jnp.float32,
                     page_size: int = DEFAULT_PAGE_SIZE) -> list:
  """Per-layer caches for `num_slots` slots of up to `max_pages` pages over
  a pool of `num_pages` pages (page 0 the null page) per global layer.

  `dtype` as in `cache.factory.init_cache`: a dense layer's storage, what a
  quantized layer quantizes from. A ValueError names the layer whose spec
  P cannot page.
  """
  if spec is not None:
    spec.check_num_layers(config.num_layers)

  def make(i: int):
    if config.layer_window(i) is not None:
      return layer_cache(config, i, num_slots, max_pages * page_size, spec,
                         dtype)
    try:
      return PagedLayerCache.create_paged(
          paged_layer_spec(spec, i), num_slots, num_pages, max_pages,
          config.num_kv_heads, config.head_dim, dtype, page_size)
    except ValueError as e:
      raise ValueError(f"init_paged_cache: layer {i}: {e}") from e

  return init_layer_caches(config, make)


def slot_fields(layer) -> tuple[str, ...]:
  """Names of the layer's per-slot array fields (leading axis B)."""
  if isinstance(layer, PagedLayerCache):
    return tuple(layer.per_slot_leaves())
  fields = layer.__dataclass_fields__
  return tuple(name for name, f in fields.items()
               if f.metadata.get("pytree_node", True)
               and getattr(layer, name) is not None)


def _on_slots(layer, fn):
  """`layer` with `fn` applied to every per-slot leaf."""
  updates = {name: jax.tree_util.tree_map(fn, getattr(layer, name))
             for name in slot_fields(layer)}
  return layer.replace(**updates)


def select_slots(cache: Sequence, slots: Sequence[int]) -> list:
  """The sub-batch of `slots` (in that order); pools are shared."""
  index = jnp.asarray(slots, jnp.int32)
  return [_on_slots(layer, lambda x: x[index]) for layer in cache]


def merge_slots(cache: Sequence, sub: Sequence, slots: Sequence[int]
                ) -> list:
  """`cache` with `sub` (from `select_slots(cache, slots)`, then run)
  written back into `slots`, and the pools taken from `sub`."""
  index = jnp.asarray(slots, jnp.int32)
  out = []
  for layer, part in zip(cache, sub):
    updates = {}
    for name in slot_fields(layer):
      updates[name] = jax.tree_util.tree_map(
          lambda whole, piece: whole.at[index].set(piece),
          getattr(layer, name), getattr(part, name))
    if isinstance(layer, PagedLayerCache):
      updates["k_store"], updates["v_store"] = part.k_store, part.v_store
    out.append(layer.replace(**updates))
  return out


def reset_slots(cache: Sequence, slots: Sequence[int]) -> list:
  """`cache` with `slots` emptied (length 0, windows, sinks and rings
  zeroed, block table rows on the null page); other slots untouched."""
  index = jnp.asarray(slots, jnp.int32)
  return [_on_slots(layer, lambda x: x.at[index].set(0)) for layer in cache]


def with_block_table(cache: Sequence, table_BxM: np.ndarray) -> list:
  """Every paged layer's block table replaced by `table_BxM` ([B, M'] with
  M' <= the layer's table width; the rest is the null page)."""
  padded: dict[int, np.ndarray] = {}  # width -> the host table.

  def table(width: int) -> jax.Array:
    if width not in padded:
      host = np.zeros((table_BxM.shape[0], width), np.int32)
      host[:, :table_BxM.shape[1]] = table_BxM
      padded[width] = host
    # One device array per layer: a cache's buffers are donated, and one
    # buffer may not be donated twice.
    return jnp.asarray(padded[width])

  return [layer.replace(block_table_BxM=table(layer.block_table_BxM.shape[1]))
          if isinstance(layer, PagedLayerCache) else layer for layer in cache]


def pool_bytes(cache: Sequence) -> int:
  """Bytes of every paged layer's pool (codes, scales, zeros, outliers)."""
  return sum(int(x.size) * x.dtype.itemsize for layer in cache
             if isinstance(layer, PagedLayerCache)
             for x in jax.tree_util.tree_leaves((layer.k_store,
                                                 layer.v_store)))


__all__ = ["FULL_PRECISION", "init_paged_cache", "merge_slots",
           "paged_layer_spec", "pool_bytes", "reset_slots", "select_slots",
           "slot_fields", "with_block_table"]
