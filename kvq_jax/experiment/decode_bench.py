"""One decode step vs context length: time, XLA temp memory, cache bytes.

Every cache kind at one context gets the same number of slots: `context`
rounded up to whole blocks of every quantized kind (`equal_slots`), and
lengths that start at `context - repeats - 1`, so every timed step attends
over (almost) `context` tokens (contents are zeros: a decode step's cost does
not depend on them).
The jitted decode step of `models.runtime` is lowered and compiled once;
`memory_analysis()` of that executable gives the XLA temporaries, and the
same executable is timed (median of `repeats` steps, the cache threaded
through because it is donated).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp

from kvq_jax.cache.factory import init_cache
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.experiment.decode_speed import equal_slots
from kvq_jax.models.config import ModelConfig
from kvq_jax.models.runtime import Runtime
from kvq_jax.quant import QuantSpec

# The bench's cache kinds: name -> (CacheSpec or None for dense, dtype).
KINDS: dict[str, tuple[CacheSpec | None, jnp.dtype]] = {
    "bf16": (None, jnp.bfloat16),
    "int8": (CacheSpec(k=QuantSpec("int8", "symmetric", "per_token"),
                       v=QuantSpec("int8", "symmetric", "per_token")),
             jnp.bfloat16),
    "int4_g32": (CacheSpec(k=QuantSpec("int4", "symmetric", "per_group", 32),
                           v=QuantSpec("int4", "symmetric", "per_group", 32)),
                 jnp.bfloat16),
    "kivi2": (CacheSpec(k=QuantSpec("int2", "asymmetric", "per_channel", 32),
                        v=QuantSpec("int2", "asymmetric", "per_group", 32),
                        residual=128),
              jnp.bfloat16),
}


@dataclasses.dataclass(frozen=True)
class Row:
  kind: str
  context: int
  seconds: float  # Median wall-clock seconds of one decode step.
  temp_bytes: int  # XLA temporaries of the compiled decode step.
  cache_bytes: int  # Every leaf of the cache (storage + fp buffers).


def _leaf_bytes(tree) -> int:
  return sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize
             for x in jax.tree_util.tree_leaves(tree))


def _abstract_cache(config: ModelConfig, spec: CacheSpec | None, dtype,
                    batch_size: int, capacity: int):
  return jax.eval_shape(
      lambda: init_cache(config, batch_size, capacity, spec, dtype))


def _lower_decode(runtime: Runtime, cache, batch_size: int):
  token = jax.ShapeDtypeStruct((batch_size,), jnp.int32)
  return runtime.decode_fn.lower(runtime.state, token, cache, None)


def decode_step_memory(runtime: Runtime, spec: CacheSpec | None,
                       batch_size: int, capacity: int,
                       dtype=jnp.bfloat16) -> tuple[int, int]:
  """(XLA temp bytes of one decode step, bytes of a dense bf16 cache).

  Nothing is allocated: the cache is abstract (`jax.eval_shape`) and the
  step is only lowered and compiled. The second number is the size of the
  dense bfloat16 cache of the same capacity, the yardstick the temporaries
  are compared with (a step that dequantized the whole cache would need
  about that much scratch).
  """
  cache = _abstract_cache(runtime.config, spec, dtype, batch_size, capacity)
  compiled = _lower_decode(runtime, cache, batch_size).compile()
  bf16 = _abstract_cache(runtime.config, None, jnp.bfloat16, batch_size,
                         capacity)
  return int(compiled.memory_analysis().temp_size_in_bytes), _leaf_bytes(bf16)


def bench_one(runtime: Runtime, kind: str, spec: CacheSpec | None, dtype,
              batch_size: int, context: int, repeats: int,
              slots: int | None = None) -> Row:
  """Compiles, measures and times one decode step at `context` in a cache
  of `slots` (default `context`) slots."""
  if repeats < 1:
    raise ValueError(f"bench_one: repeats={repeats}; allowed: >= 1.")
  if context <= repeats + 1:
    raise ValueError(
        f"bench_one: context={context}; allowed: > repeats + 1 = "
        f"{repeats + 1}.")
  slots = context if slots is None else slots
  if slots < context:
    raise ValueError(f"bench_one: slots={slots} < context={context}.")
  cache = init_cache(runtime.config, batch_size, slots, spec, dtype)
  start_length = context - repeats - 1
  # One length array per layer: the decode step donates every cache leaf.
  cache = [layer.replace(
      length_B=jnp.full((batch_size,), start_length, jnp.int32))
           for layer in cache]
  compiled = _lower_decode(runtime, jax.eval_shape(lambda: cache),
                           batch_size).compile()
  temp = int(compiled.memory_analysis().temp_size_in_bytes)
  cache_bytes = _leaf_bytes(cache)
  token = jnp.zeros((batch_size,), jnp.int32)
  logits, cache = compiled(runtime.state, token, cache, None)  # Warm-up.
  jax.block_until_ready(logits)
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    logits, cache = compiled(runtime.state, token, cache, None)
    jax.block_until_ready((logits, cache))
    times.append(time.perf_counter() - start)
  return Row(kind=kind, context=context, seconds=statistics.median(times),
             temp_bytes=temp, cache_bytes=cache_bytes)


def run(runtime: Runtime, kinds: Sequence[str], contexts: Sequence[int], *,
        batch_size: int, repeats: int,
        log: Callable[[str], None] = print) -> list[Row]:
  rows = []
  for kind in kinds:
    if kind not in KINDS:
      raise ValueError(
          f"decode_bench: kind={kind!r}; allowed: {', '.join(KINDS)}.")
  for context in contexts:
    slots = equal_slots(context, [KINDS[kind][0] for kind in kinds])
    for kind in kinds:
      spec, dtype = KINDS[kind]
      row = bench_one(runtime, kind, spec, dtype, batch_size, context,
                      repeats, slots)
      log(f"  {kind} @ {context}: {row.seconds * 1e3:.1f} ms")
      rows.append(row)
  return rows


def format_table(rows: Sequence[Row], baseline: str = "bf16") -> str:
  """Markdown table; ratios are to `baseline` at the same context."""
  base = {r.context: r for r in rows if r.kind == baseline}
  lines = ["| context | cache | ms/step | x time | temp MiB | x temp | "
           "cache MiB | x cache |",
           "|---:|---|---:|---:|---:|---:|---:|---:|"]

  def ratio(a: float, b: float | None) -> str:
    return f"{a / b:.3f}" if b else "-"

  for r in rows:
    b = base.get(r.context)
    lines.append(
        f"| {r.context} | {r.kind} | {r.seconds * 1e3:.2f} | "
        f"{ratio(r.seconds, b and b.seconds)} | "
        f"{r.temp_bytes / 2**20:.2f} | "
        f"{ratio(r.temp_bytes, b and b.temp_bytes)} | "
        f"{r.cache_bytes / 2**20:.2f} | "
        f"{ratio(r.cache_bytes, b and b.cache_bytes)} |")
  return "\n".join(lines)
