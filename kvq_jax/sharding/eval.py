"""Evaluation forward pass on a mesh: sharded params, cache and windows.

The runner's `window_forward` creates its cache inside `jit`;
`sharded_window_forward` does the same but constrains the cache with
`shard_cache` (KV heads over 'model', windows over 'data') and places the
token batch over 'data'. The weights are expected already sharded
(`shard_params` on the model's decoder before it is split).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from kvq_jax.cache.factory import init_cache
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.sharding.cache import batch_sharding, shard_cache


@functools.lru_cache(maxsize=16)
def _forward(graphdef, spec: CacheSpec | None, cache_dtype_name: str,
             mesh: Mesh):
  def forward(state, tokens_BxT):
    model = nnx.merge(graphdef, state)
    b, t = tokens_BxT.shape
    cache = init_cache(model.config, b, t, spec, jnp.dtype(cache_dtype_name))
    cache = shard_cache(cache, mesh)
    positions_BxT = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    logits, _ = model(tokens_BxT, positions_BxT, cache)
    return logits
  return jax.jit(forward)


def sharded_window_forward(model, spec: CacheSpec | None = None,
                           cache_dtype=None, *, mesh: Mesh):
  """Like `facade.window_forward`, on `mesh`: fn(tokens_BxT) -> logits."""
  graphdef, state = model.split
  dtype = jnp.dtype(model.decoder.dtype if cache_dtype is None else cache_dtype)
  fn = _forward(graphdef, spec, dtype.name, mesh)

  def call(tokens_BxT):
    tokens = jnp.asarray(tokens_BxT, jnp.int32)
    tokens = jax.device_put(tokens, batch_sharding(tokens.shape[0], mesh))
    return fn(state, tokens)
  return call
