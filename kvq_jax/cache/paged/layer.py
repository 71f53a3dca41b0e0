"""A paged layer cache: `QuantizedLayerCache`'s formats over a page pool.

The storage -- packed codes, scales, zeros, outliers, or a plain
full-precision store -- lives in a pool of N pages of P tokens
(`cache/paged/store.py`), shared by every slot; a block table [B, M] and
the lengths say which pages hold which slot's tokens. Everything that
belongs to one request stays per slot, as in the contiguous cache: its
full-precision sink and residual / flush windows. The arithmetic is the
contiguous cache's (`QuantizedLayerCache.attend`, the same method): only
the three storage accesses are paged -- a commit scatters rows through the
block table, a storage block gathers its pages, the mixed segment gathers
rows -- so a paged cache equals a contiguous one of M * P slots up to the
order the blocks are read in (the same order, here), and the storage loop
still runs over the filled blocks only: work grows with a sequence's
length, not with the pool.

A full-precision layer is the same class with `LayerSpec(k=None, v=None)`:
its plain store is written in the cache dtype (a bf16 cache rounds as the
dense baseline does) and read block by block.

P must be a multiple of every token group (a per-channel format's g) and
flush block (F_k, F_v) the layer uses, so a group's scale row never spans
two pages, and the read block (`spec.block_size`) and P must divide one
another. Slot == token index, as in the contiguous cache, so pre-RoPE keys
work unchanged.

With attention_impl selecting 'pallas', a decode step (T == 1) reads the
storage segment with the paged kernel
(`kvq_jax.kernels.paged_decode_attention`: the block table and lengths by
scalar prefetch, codes dequantized in the kernel, page by page), merged with
the other segments exactly as the contiguous cache merges its kernel's
(out, lse); the two hooks `_kernel_reason` / `_kernel_attention` are all
that differ. Where the kernel cannot serve (the contiguous kernel's static
reasons, `LayerSpec.pallas_static_reason`, then the paged kernel's shape
and backend reasons), an explicit 'pallas' raises ValueError at trace time
and a tuple such as ('pallas', 'xla') falls back to the XLA loop with a
warning.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import struct

from kvq_jax.cache import hadamard
from kvq_jax.cache.paged.store import (gather_block, gather_rows, pool_store,
                                       scatter_rows)
from kvq_jax.cache.quantized import QuantizedLayerCache
from kvq_jax.cache.quantized_keys import check_key_affine
from kvq_jax.cache.quantized_store import Store, empty_store, token_group
from kvq_jax.cache.spec import LayerSpec
from kvq_jax.kernels.dispatch import paged_pallas_unsupported_reason
from kvq_jax.kernels.paged_decode_attention import paged_decode_attention
from kvq_jax.quant import QuantSpec

DEFAULT_PAGE_SIZE = 32


def page_size_reason(spec: LayerSpec, page_size: int) -> str | None:
  """Why `page_size` cannot page `spec`'s storage, or None."""
  if isinstance(page_size, bool) or not isinstance(page_size, int) \
      or page_size < 1:
    return f"page_size={page_size!r} is not a positive integer"
  needs = {"k group": token_group(spec.k), "v group": token_group(spec.v),
           "flush_k": spec.flush_k, "flush_v": spec.flush_v}
  bad = {name: n for name, n in needs.items() if page_size % n}
  if bad:
    return (f"page_size={page_size} is not a multiple of "
            + ", ".join(f"{name}={n}" for name, n in bad.items())
            + f" (allowed: multiples of {math.lcm(*needs.values())})")
  blk = spec.block_size
  if blk % page_size and page_size % blk:
    return (f"page_size={page_size} and the read block block_size={blk} "
            "must divide one another")
  return None


@struct.dataclass
class PagedLayerCache(QuantizedLayerCache):
  """See the module docstring. Pool leaves [N, K, P (or P / g), ...];
  per slot: block table [B, M], lengths [B], windows and sinks as in
  `QuantizedLayerCache`. `capacity` is M * P, a slot's most tokens."""

  block_table_BxM: jax.Array
  page_size: int = struct.field(pytree_node=False)
  compute_dtype: str = struct.field(pytree_node=False)

  @classmethod
  def create_paged(cls, spec: LayerSpec, num_slots: int, num_pages: int,
                   max_pages: int, num_kv_heads: int, head_dim: int,
                   dtype=jnp.float32,
                   page_size: int = DEFAULT_PAGE_SIZE) -> PagedLayerCache:
    """An empty pool of `num_pages` pages (page 0 the null page) and
    `num_slots` slots of at most `max_pages` pages each."""
    why = page_size_reason(spec, page_size)
    if why:
      raise ValueError(f"PagedLayerCache: {why}.")
    for name, value, low in (("num_slots", num_slots, 1),
                             ("num_pages", num_pages, 2),
                             ("max_pages", max_pages, 1)):
      if isinstance(value, bool) or not isinstance(value, int) \
          or value < low:
        raise ValueError(
            f"PagedLayerCache.{name}={value!r}: must be an integer >= {low}"
            + (" (page 0 is the null page)" if name == "num_pages" else "")
            + ".")
    if spec.hadamard_k or spec.hadamard_v:
      hadamard.hadamard_matrix_np(head_dim)
    check_key_affine(spec, num_kv_heads, head_dim)
    # The table is padded with null pages to whole read blocks.
    unit = math.lcm(spec.block_size, page_size) // page_size
    width = -(-max_pages // unit) * unit
    b, k, h = num_slots, num_kv_heads, head_dim
    shape = (num_pages, k, page_size, h)
    full = lambda n: jnp.zeros((b, k, n, h), spec.window_dtype)
    return cls(
        k_store=pool_store(empty_store(spec.k, shape, dtype), spec.k),
        v_store=pool_store(empty_store(spec.v, shape, dtype), spec.v),
        window_k=full(spec.window_of("k")), window_v=full(spec.window_of("v")),
        sink_k=full(spec.sink), sink_v=full(spec.sink),
        length_B=jnp.zeros((b,), jnp.int32),
        capacity=max_pages * page_size, spec=spec,
        block_table_BxM=jnp.zeros((b, width), jnp.int32),
        page_size=page_size, compute_dtype=jnp.dtype(dtype).name)

  @property
  def allocated_slots(self) -> int:
    return self.block_table_BxM.shape[1] * self.page_size

  @property
  def num_pages(self) -> int:
    return jax.tree_util.tree_leaves(self.k_store)[0].shape[0]

  @property
  def dtype(self) -> jnp.dtype:
    return jnp.dtype(self.compute_dtype)

  def per_slot_leaves(self) -> dict[str, jax.Array]:
    """The fields that belong to one slot each (leading axis B); the pool
    (k_store, v_store) is shared."""
    return {name: getattr(self, name) for name in (
        "window_k", "window_v", "sink_k", "sink_v", "length_B",
        "block_table_BxM")}

  # -- storage access through the block table -----------------------------

  def _commit(self, store: Store, rows_B: Store, start_B: jax.Array,
              end_B: jax.Array, qspec: QuantSpec | None) -> Store:
    return scatter_rows(store, self.block_table_BxM, rows_B, start_B, end_B,
                        self.page_size, qspec)

  def _storage_block(self, store: Store, start: jax.Array, size: int,
                     qspec: QuantSpec | None) -> Store:
    return gather_block(store, self.block_table_BxM, start, size,
                        self.page_size, qspec, self.dtype)

  def _storage_rows(self, store: Store, start_B: jax.Array, size: int,
                    qspec: QuantSpec | None) -> Store:
    return gather_rows(store, self.block_table_BxM, start_B, size,
                       self.page_size, qspec, self.dtype)

  # -- the paged decode kernel (`QuantizedLayerCache._decode_impl`) --------

  def _kernel_reason(self, q_BxKxGxH: jax.Array, start_B: jax.Array,
                     end_B: jax.Array, interpret: bool) -> str | None:
    return paged_pallas_unsupported_reason(
        q_BxKxGxH, self.k_store, self.v_store, self.block_table_BxM, end_B,
        start_B=start_B, page_size=self.page_size, interpret=interpret)

  def _kernel_attention(self, cache: PagedLayerCache, q_BxKxGxH: jax.Array,
                        start_B: jax.Array, end_B: jax.Array,
                        interpret: bool):
    return paged_decode_attention(
        q_BxKxGxH, cache.k_store, cache.v_store, cache.block_table_BxM,
        end_B, start_B=start_B, page_size=self.page_size,
        interpret=interpret, return_lse=True)
