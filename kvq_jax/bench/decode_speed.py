"""Batched decode throughput at a fixed context, for one cache kind.

The cache is created with `equal_slots(...)` slots -- the same number for
every cache kind of a comparison (the quantized cache allocates whole
`block_size` blocks, so the dense one gets as many) -- and its lengths set
to `context` (its contents are zeros: a decode step's cost does not depend
on the values); `steps` jitted decode steps are then timed after one
warm-up.
"""

from __future__ import annotations

import math
import time
from typing import Sequence

import jax
import jax.numpy as jnp

from kvq_jax.cache.factory import init_cache
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.facade import LoadedModel
from kvq_jax.models.runtime import Runtime


def equal_slots(tokens: int, specs: Sequence[CacheSpec | None]) -> int:
  """Slots every cache of a comparison gets: `tokens` rounded up to whole
  blocks of every quantized spec (what its cache would allocate anyway)."""
  blocks = [s.block_size for s in specs if s is not None]
  block = math.lcm(*blocks) if blocks else 1
  return -(-tokens // block) * block


def decode_tokens_per_s(model: LoadedModel, spec: CacheSpec | None, dtype,
                        batch_size: int, context: int, steps: int,
                        slots: int | None = None) -> float:
  """Tokens/s of `steps` decode steps from `context` tokens; `slots` (the
  cache capacity) defaults to context + steps + 1."""
  runtime = Runtime(model.decoder)
  slots = context + steps + 1 if slots is None else slots
  if slots < context + steps + 1:
    raise ValueError(f"decode_tokens_per_s: slots={slots} < context + steps "
                     f"+ 1 = {context + steps + 1}.")
  cache = init_cache(model.config, batch_size, slots, spec, dtype)
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
