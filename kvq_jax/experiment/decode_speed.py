"""Batched decode throughput at a fixed context, for one cache kind.

The cache is created with `context + steps` slots and its lengths set to
`context` (its contents are zeros: a decode step's cost does not depend on
the values); `steps` jitted decode steps are then timed after one warm-up.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp

from kvq_jax.cache.factory import init_cache
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.facade import LoadedModel
from kvq_jax.models.runtime import Runtime


def decode_tokens_per_s(model: LoadedModel, spec: CacheSpec | None, dtype,
                        batch_size: int, context: int, steps: int) -> float:
  runtime = Runtime(model.decoder)
  cache = init_cache(model.config, batch_size, context + steps + 1, spec,
                     dtype)
  # One length array per layer: the decode step donates every cache leaf.
  cache = [layer.replace(length_B=jnp.full((batch_size,), context, jnp.int32))
           for layer in cache]
  token = jnp.zeros((batch_size,), jnp.int32)
  logits, cache = runtime.decode(token, cache)  # compile + warm-up
  jax.block_until_ready(logits)
  start = time.perf_counter()
  for _ in range(steps):
    logits, cache = runtime.decode(token, cache)
  jax.block_until_ready(logits)
  return batch_size * steps / (time.perf_counter() - start)
