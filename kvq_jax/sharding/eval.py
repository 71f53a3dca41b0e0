"""Evaluation forward pass on a mesh, bit-identical to the unsharded one.

`sharded_window_forward` / `sharded_window_prefill` run the same per-window
program as `facade.window_forward` (`facade.windows_prefill_fn`: each window
whole, batch 1, one after another) inside `jax.shard_map`: the windows are
split over 'data' (when the batch divides; otherwise every device runs every
window) and the weights -- sharded at rest by `shard_params` -- are gathered
whole for the forward. Nothing is split inside a window: tensor-parallel
matmuls would sum partial products in another order and a batch split would
change XLA's rounding, and both move a quantized cache's codes at rounding
boundaries (measured before: int4_g32's perplexity moved 2.0% on 2
windows with mesh 2x3). So 'model' here
only spreads the weights' storage; the math of every window is the
unsharded math, and the packed caches and logits are bit-identical.

On a mesh spanning several processes (`sharding.distributed`) every process
calls the forward with the same windows and keeps the shards on its own
devices; the logits come back as a global array (gather what is needed,
e.g. `multihost_utils.process_allgather`, before reading it on the host).
"""

from __future__ import annotations

import functools

import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

from kvq_jax.cache.spec import CacheSpec
from kvq_jax.facade import cache_dtype_name, windows_prefill_fn
from kvq_jax.sharding.cache import batch_sharding
from kvq_jax.sharding.placement import put_global


@functools.lru_cache(maxsize=16)
def _prefill(graphdef, spec: CacheSpec | None, dtype_name: str,
             mesh: Mesh, split: bool, logits_only: bool):
  run = windows_prefill_fn(graphdef, spec, dtype_name, logits_only)
  windows = P("data") if split else P()
  mapped = jax.shard_map(run, mesh=mesh, in_specs=(P(), windows),
                         out_specs=windows, check_vma=False)
  return jax.jit(mapped)


def _call(model, spec, cache_dtype, mesh: Mesh, logits_only: bool):
  graphdef, state = model.split
  dtype_name = cache_dtype_name(model, cache_dtype)

  def call(tokens_BxT):
    tokens = np.asarray(tokens_BxT, np.int32)  # The same on every process.
    sharding = batch_sharding(tokens.shape[0], mesh)
    split = sharding.spec != P()  # Windows over 'data' when they divide.
    tokens = put_global(tokens, sharding)
    return _prefill(graphdef, spec, dtype_name, mesh, split,
                    logits_only)(state, tokens)
  return call


def sharded_window_forward(model, spec: CacheSpec | None = None,
                           cache_dtype=None, *, mesh: Mesh):
  """Like `facade.window_forward`, on `mesh`: fn(tokens_BxT) -> logits."""
  return _call(model, spec, cache_dtype, mesh, logits_only=True)


def sharded_window_prefill(model, spec: CacheSpec | None = None,
                           cache_dtype=None, *, mesh: Mesh):
  """Like `facade.window_prefill`, on `mesh`: fn(tokens) -> (logits, caches)."""
  return _call(model, spec, cache_dtype, mesh, logits_only=False)
