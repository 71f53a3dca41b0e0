"""One decode step vs context length: time, XLA temp memory, cache bytes.

Kinds are named as `settings.kinds.resolve_kind` takes them (bf16, float32,
a preset or a short spec); ratios in the table are to the fastest dense
(full-precision) cache at the same context.

Every cache kind at one context gets the same number of slots: `context`
rounded up to whole blocks of every quantized kind (`equal_slots`), and
lengths that start at `context - repeats - 1`, so every timed step attends
over (almost) `context` tokens (contents are zeros: a decode step's cost does
not depend on them).
The jitted decode step of `models.runtime` is lowered and compiled once;
`memory_analysis()` of that executable gives the XLA temporaries, and the
same executable is timed (median of `repeats` steps, the cache threaded
through because it is donated).

With `rounds` R > 1, every kind of one context is compiled and allocated
first, then timed R times in turn (round r times every kind once, in
order), so a drift of the machine's speed over the run reaches every kind
alike. A row then keeps each round's median (`round_seconds`), and
`format_table` gives, beside the ratio of the medians, the range of the
per-round ratios: each round's step against the same round's fastest
full-precision step (a paired spread; the 2-core machine's speed was seen
to move by 20% between runs of one command).
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import statistics
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from kvq_jax.bench.decode_speed import equal_slots
from kvq_jax.bench.timing import write_measured
from kvq_jax.cache.factory import init_cache
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.capacity.memory import effective_bits
from kvq_jax.models.config import ModelConfig
from kvq_jax.models.dtypes import dense_dtype_name
from kvq_jax.models.runtime import Runtime
from kvq_jax.settings.kinds import resolve_kind

@dataclasses.dataclass(frozen=True)
class Row:
  """One timed decode step (the `--json` rows)."""

  kind: str
  context: int
  batch: int
  slots: int  # Cache capacity, the same for every kind at one context.
  seconds_median: float  # Wall-clock seconds of one decode step.
  seconds_min: float
  temp_bytes: int  # XLA temporaries of the compiled decode step.
  cache_bytes: int  # Every leaf of the cache (storage + fp buffers).
  effective_bits: float  # Per K/V element held at `context` (memory).
  # Median seconds of each timing round (`run(..., rounds=R)`); one entry
  # per round, seconds_median is their median.
  round_seconds: tuple[float, ...] = ()


def leaf_bytes(tree) -> int:
  """Bytes of every leaf of a (possibly abstract) pytree."""
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
  return int(compiled.memory_analysis().temp_size_in_bytes), leaf_bytes(bf16)


def bench_contexts(explicit: Sequence[int], max_context: int) -> list[int]:
  """`explicit` if given, else 1024, 2048, ... doubling up to max_context."""
  if explicit:
    return list(explicit)
  out, c = [], 1024
  while c <= max_context:
    out.append(c)
    c *= 2
  return out


def timed_steps(step: Callable, cache, repeats: int) -> list[float]:
  """Wall-clock seconds of `repeats` calls of step(cache) -> (out, cache)
  after one warm-up call, the (donated) cache threaded through."""
  out, cache = step(cache)
  jax.block_until_ready(out)
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    out, cache = step(cache)
    jax.block_until_ready((out, cache))
    times.append(time.perf_counter() - start)
  return times


@dataclasses.dataclass
class _Prepared:
  """A kind's compiled decode step and the cache it is timed on."""

  kind: str
  spec: CacheSpec | None
  dtype: Any
  compiled: Any
  cache: list
  temp_bytes: int
  cache_bytes: int


def _prepare(runtime: Runtime, kind: str, spec: CacheSpec | None, dtype,
             batch_size: int, context: int, repeats: int,
             slots: int) -> _Prepared:
  if repeats < 1:
    raise ValueError(f"decode_bench: repeats={repeats}; allowed: >= 1.")
  if context <= repeats + 1:
    raise ValueError(
        f"decode_bench: context={context}; allowed: > repeats + 1 = "
        f"{repeats + 1}.")
  if slots < context:
    raise ValueError(f"decode_bench: slots={slots} < context={context}.")
  cache = init_cache(runtime.config, batch_size, slots, spec, dtype)
  compiled = _lower_decode(runtime, jax.eval_shape(lambda: cache),
                           batch_size).compile()
  return _Prepared(kind, spec, dtype, compiled, cache,
                   int(compiled.memory_analysis().temp_size_in_bytes),
                   leaf_bytes(cache))


def _time_round(runtime: Runtime, prepared: _Prepared, batch_size: int,
                context: int, repeats: int) -> list[float]:
  """`repeats` timed steps (after a warm-up) from length
  `context - repeats - 1`; the cache is kept for the next round."""
  start_length = context - repeats - 1
  # One length array per layer: the decode step donates every cache leaf.
  cache = [layer.replace(
      length_B=jnp.full((batch_size,), start_length, jnp.int32))
           for layer in prepared.cache]
  token = jnp.zeros((batch_size,), jnp.int32)

  def step(c):
    out, prepared.cache = prepared.compiled(runtime.state, token, c, None)
    return out, prepared.cache

  return timed_steps(step, cache, repeats)


def _row(runtime: Runtime, prepared: _Prepared, batch_size: int,
         context: int, slots: int, rounds: list[list[float]]) -> Row:
  medians = tuple(statistics.median(times) for times in rounds)
  return Row(kind=prepared.kind, context=context, batch=batch_size,
             slots=slots, seconds_median=statistics.median(medians),
             seconds_min=min(min(times) for times in rounds),
             temp_bytes=prepared.temp_bytes,
             cache_bytes=prepared.cache_bytes,
             effective_bits=effective_bits(runtime.config, prepared.spec,
                                           prepared.dtype, context),
             round_seconds=medians)


def _bench_together(runtime: Runtime, kinds, batch_size: int, context: int,
                   repeats: int, slots: int, rounds: int,
                   log: Callable[[str], None]) -> list[Row]:
  """Rows of `kinds` ((name, `settings.kinds.Kind`) pairs), all compiled
  and held at once and timed in turn, `rounds` times."""
  prepared = [_prepare(runtime, name, kind.spec, jnp.dtype(kind.dtype),
                       batch_size, context, repeats, slots)
              for name, kind in kinds]
  times = {p.kind: [] for p in prepared}
  for r in range(rounds):
    tag = f"round {r + 1}/{rounds}: " if rounds > 1 else ""
    for p in prepared:
      times[p.kind].append(_time_round(runtime, p, batch_size, context,
                                       repeats))
      log(f"  {tag}{p.kind} @ {context}: "
          f"{statistics.median(times[p.kind][-1]) * 1e3:.1f} ms")
  return [_row(runtime, p, batch_size, context, slots, times[p.kind])
          for p in prepared]


def run(runtime: Runtime, kinds: Sequence[str], contexts: Sequence[int], *,
        batch_size: int, repeats: int, rounds: int = 1,
        log: Callable[[str], None] = print) -> list[Row]:
  """Every kind (`settings.kinds.resolve_kind`) at every context, all kinds
  of one context in caches of the same number of slots; with `rounds` > 1
  the kinds of a context are timed in turn, `rounds` times (module
  docstring)."""
  if rounds < 1:
    raise ValueError(f"decode_bench: rounds={rounds}; allowed: >= 1.")
  resolved = list({kind: resolve_kind(kind) for kind in kinds}.items())
  # One round: one kind's cache alive at a time; several: all of them.
  groups = [resolved] if rounds > 1 else [[item] for item in resolved]
  rows = []
  for context in contexts:
    slots = equal_slots(context, [kind.spec for _, kind in resolved])
    for group in groups:
      rows += _bench_together(runtime, group, batch_size, context, repeats,
                              slots, rounds, log)
  return rows


def fastest_full_precision(rows: Sequence, cost: Callable = lambda r:
                           r.seconds_median) -> dict[tuple[int, int], Any]:
  """(context, batch) -> the dense row (kind bf16, float32, ...: a
  `models.dtypes.DENSE_NAMES` name) of least `cost` there (default: median
  seconds per step)."""
  best = {}
  for r in rows:
    key = (r.context, r.batch)
    if dense_dtype_name(r.kind) and (key not in best
                                     or cost(r) < cost(best[key])):
      best[key] = r
  return best


def round_ratios(row: Row, base: Row) -> list[float]:
  """Each round's step time over the same round's `base` step."""
  return [a / b for a, b in zip(row.round_seconds, base.round_seconds)]


def format_table(rows: Sequence[Row]) -> str:
  """Markdown table; ratios are to the fastest full-precision cache of the
  same context and batch (named in the last column). Rows of several
  timing rounds add the range of the per-round ratios."""
  base = fastest_full_precision(rows)
  ranged = any(len(r.round_seconds) > 1 for r in rows)
  spread = " | per-round x time" if ranged else ""
  lines = ["| context | B | cache | eff. bits | ms/step | x time"
           f"{spread} | temp MiB | cache MiB | x cache | vs |",
           "|---:|---:|---|---:|---:|---:|" + ("---|" if ranged else "")
           + "---:|---:|---:|---|"]

  def ratio(a: float, b: float | None) -> str:
    return f"{a / b:.3f}" if b else "-"

  for r in rows:
    b = base.get((r.context, r.batch))
    span = ""
    if ranged:
      per_round = round_ratios(r, b) if b else []
      span = (f" {min(per_round):.3f}-{max(per_round):.3f} |" if per_round
              else " - |")
    lines.append(
        f"| {r.context} | {r.batch} | {r.kind} | {r.effective_bits:.2f} | "
        f"{r.seconds_median * 1e3:.2f} | "
        f"{ratio(r.seconds_median, b and b.seconds_median)} |{span} "
        f"{r.temp_bytes / 2**20:.2f} | {r.cache_bytes / 2**20:.2f} | "
        f"{ratio(r.cache_bytes, b and b.cache_bytes)} | "
        f"{b.kind if b else '-'} |")
  return "\n".join(lines)


def rows_json(rows: Sequence[Row]) -> list[dict]:
  """The rows as JSON-ready dicts (`--json=FILE`)."""
  return [dataclasses.asdict(r) for r in rows]


def write_rows(path: str, model: str, rows: Sequence,
               to_json: Callable[[Sequence], list[dict]] = rows_json
               ) -> pathlib.Path:
  """`--json=FILE`: {"machine", "model", "rows": to_json(rows)}; returns the
  path."""
  return write_measured(path, {"model": model, "rows": to_json(rows)})
