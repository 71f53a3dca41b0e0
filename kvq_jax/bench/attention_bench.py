"""One layer's decode attention through the cache's own path vs context.

What `experiments.bench_attention` times: `cache.attend` of one new token
(T = 1: write it, then attend over everything held) for layer 0 of a
model's shapes, exactly the call a decode step makes per layer, for every
kind (`settings.kinds`: bf16 / float32 dense or a preset's cache) in caches of
the same number of slots, with lengths starting at `context - repeats - 1`.
`implementation` picks the quantized cache's decode attention ("xla", the
blockwise path; "pallas", the kernel: compiled on GPU/TPU, interpreted on
CPU, which is not a timing). Rows are `decode_bench.Row`s: time (median and
min), XLA temporaries of the compiled step, cache bytes, effective bits.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Callable, Sequence

import jax
import jax.numpy as jnp

from kvq_jax.bench.decode_bench import Row, leaf_bytes, timed_steps
from kvq_jax.bench.decode_speed import equal_slots
from kvq_jax.cache.factory import layer_cache
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.capacity.memory import effective_bits
from kvq_jax.models.config import ModelConfig
from kvq_jax.models.decoder import layer_rope
from kvq_jax.settings.kinds import resolve_kind

IMPLEMENTATIONS = ("xla", "pallas")


def layer_step(config: ModelConfig, spec: CacheSpec | None, dtype,
               batch_size: int, context: int, slots: int, calls: int,
               implementation: str = "xla"):
  """(compiled step, cache): layer 0's one-token `attend` compiled for a
  cache of `slots` holding context - calls tokens, so the last of `calls`
  calls attends over `context` tokens (the cache is donated: pass each
  call's cache to the next)."""
  if context <= calls or slots < context:
    raise ValueError(
        f"layer_step: context={context}, slots={slots}, calls={calls}; "
        "allowed: calls < context <= slots.")
  if spec is not None:
    spec = dataclasses.replace(spec, attention_impl=implementation)
  cache = layer_cache(config, 0, batch_size, slots, spec, dtype)
  cache = cache.replace(length_B=jnp.full((batch_size,), context - calls,
                                          jnp.int32))
  rope = layer_rope(config, 0)
  b, k, h = batch_size, config.num_kv_heads, config.head_dim
  q = jnp.zeros((b, 1, config.num_heads, h), jnp.float32)
  kv = jnp.zeros((b, 1, k, h), jnp.float32)

  def attend(cache):
    return cache.attend(q, kv, kv, cache.length_B[:, None], rope)

  compiled = jax.jit(attend, donate_argnums=0).lower(
      jax.eval_shape(lambda: cache)).compile()
  return compiled, cache


def bench_layer(config: ModelConfig, kind: str, spec: CacheSpec | None,
                dtype, batch_size: int, context: int, slots: int,
                repeats: int, implementation: str = "xla") -> Row:
  """Compiles, measures and times layer 0's one-token `attend` (a warm-up
  call, then `repeats` timed ones; `timed_steps`)."""
  compiled, cache = layer_step(config, spec, dtype, batch_size, context,
                               slots, repeats + 1, implementation)
  temp = int(compiled.memory_analysis().temp_size_in_bytes)
  cache_bytes = leaf_bytes(cache)
  times = timed_steps(compiled, cache, repeats)
  name = kind if spec is None or implementation == "xla" else (
      f"{kind}:{implementation}")
  return Row(kind=name, context=context, batch=batch_size, slots=slots,
             seconds_median=statistics.median(times), seconds_min=min(times),
             temp_bytes=temp, cache_bytes=cache_bytes,
             effective_bits=effective_bits(config, spec, dtype, context))


def run(config: ModelConfig, kinds: Sequence[str], contexts: Sequence[int],
        *, batch_size: int, repeats: int,
        implementations: Sequence[str] = ("xla",),
        log: Callable[[str], None] = print) -> list[Row]:
  """Every kind x implementation at every context; dense kinds once."""
  for impl in implementations:
    if impl not in IMPLEMENTATIONS:
      raise ValueError(f"attention_bench: implementation={impl!r}; allowed: "
                       f"{', '.join(IMPLEMENTATIONS)}.")
  resolved = {kind: resolve_kind(kind) for kind in kinds}
  rows = []
  for context in contexts:
    slots = equal_slots(context, [k.spec for k in resolved.values()])
    for kind, k in resolved.items():
      for impl in implementations if k.spec is not None else ("xla",):
        row = bench_layer(config, kind, k.spec, jnp.dtype(k.dtype),
                          batch_size, context, slots, repeats, impl)
        log(f"  {row.kind} @ {context}: {row.seconds_median * 1e3:.3f} ms")
        rows.append(row)
  return rows
