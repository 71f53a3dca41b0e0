"""End-to-end greedy generation vs context and cache kind: prefill seconds,
decode tokens/s, peak memory, cache bytes (`bench_decode --generate`).

Per (kind, context, batch): a random prompt of `context` token ids per
sequence (the same prompts for every kind of one context and batch) is
prefilled in one jitted call (`Runtime.prefill_last_fn`: the output head on
the last position only) into the kind's cache (`cache.factory.init_cache`,
dense or quantized, the classes the evaluation uses), then `new_tokens`
jitted decode steps (`Runtime.decode_fn`) run greedily: step i writes token
i into the cache (token 0 is the argmax of the prefill's logits) and its
argmax is token i + 1. There is no end-of-sequence stop: every run does
exactly `new_tokens` steps. Every kind of one context gets the same slots,
`equal_slots(context + new_tokens)`, which the last step fills.

Both programs are lowered and compiled ahead of time, so no timing includes
compilation: `prefill_seconds` is one call of the compiled prefill;
the first decode step is the warm-up (a compiled program's first call sets
it up) and `decode_tokens_per_s` is batch * (new_tokens - 1) over the wall
seconds of the other steps (the greedy pick included, tokens kept on the
device; the cache capacity is checked once before the loop instead of on
every step as `Runtime.decode` does, so the loop does not wait for the
device each step).

Memory:

* `decode_step_bytes` / `prefill_bytes`: XLA's `memory_analysis()` of the
  compiled program, argument + output - alias + temp bytes (the donated
  cache is an argument whose buffers the output reuses, so it is counted
  once): what the device holds while the program runs, weights included.
* `peak_rss_gib`: this process's peak resident memory over the kind's whole
  run (both compiles, prefill and decode, the resident weights included),
  the peak reset before each kind (`process_memory`; on systems without
  /proc it is the process lifetime's peak).
* `cache_bytes`: every leaf of the cache; `effective_bits` per K/V element
  held at `context + new_tokens` tokens (`memory.effective_bits`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from kvq_jax.bench import decode_bench
from kvq_jax.bench.decode_bench import leaf_bytes
from kvq_jax.bench.decode_speed import equal_slots
from kvq_jax.bench.process_memory import (peak_rss_gib, release_freed_memory,
                                          reset_peak_rss)
from kvq_jax.cache.base import check_capacity
from kvq_jax.cache.factory import init_cache
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.capacity.memory import effective_bits
from kvq_jax.models.runtime import Runtime
from kvq_jax.settings.kinds import resolve_kind


@dataclasses.dataclass(frozen=True)
class Row:
  """One kind's generation at one context and batch (the `--json` rows)."""

  kind: str
  context: int  # Prompt tokens per sequence.
  batch: int
  new_tokens: int  # Decode steps (tokens written after the prompt), >= 2.
  slots: int  # Cache capacity, the same for every kind at one context.
  prefill_seconds: float  # One compiled prefill of the prompts.
  decode_seconds: float  # Decode steps 2 .. new_tokens together.
  decode_tokens_per_s: float  # batch * (new_tokens - 1) / decode_seconds.
  decode_step_bytes: int  # XLA arguments + outputs - aliased + temporaries.
  prefill_bytes: int  # The same for the compiled prefill.
  peak_rss_gib: float  # Process peak RSS over this kind's run.
  cache_bytes: int  # Every leaf of the cache (storage + fp buffers).
  effective_bits: float  # Per K/V element held at context + new_tokens.
  # The greedy tokens, [batch][new_tokens + 1]: the prefill's pick, then
  # one per decode step.
  token_ids: tuple[tuple[int, ...], ...]


def program_bytes(compiled) -> int:
  """What a compiled program holds while it runs: arguments + outputs -
  aliased (donated buffers the outputs reuse) + temporaries."""
  m = compiled.memory_analysis()
  return int(m.argument_size_in_bytes + m.output_size_in_bytes
             - m.alias_size_in_bytes + m.temp_size_in_bytes)


def random_prompts(vocab_size: int, batch_size: int, context: int,
                   seed: int = 0) -> np.ndarray:
  """int32 [batch, context] token ids, uniform over the vocabulary."""
  return np.random.default_rng(seed).integers(
      0, vocab_size, (batch_size, context), dtype=np.int32)


def _greedy(logits_BxV: jax.Array) -> jax.Array:
  return jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32)


def generate_one(runtime: Runtime, kind: str, spec: CacheSpec | None, dtype,
                 prompts_BxT: np.ndarray, new_tokens: int, slots: int) -> Row:
  """Compiles, runs and measures one kind's prefill + `new_tokens` greedy
  decode steps of `prompts_BxT` in a cache of `slots` slots."""
  batch_size, context = prompts_BxT.shape
  if slots < context + new_tokens:
    raise ValueError(f"generate_one: slots={slots}; allowed: >= context + "
                     f"new_tokens = {context + new_tokens}.")
  release_freed_memory()
  reset_peak_rss()
  cache = init_cache(runtime.config, batch_size, slots, spec, dtype)
  abstract_cache = jax.eval_shape(lambda: cache)
  tokens_BxT = jnp.asarray(prompts_BxT, jnp.int32)
  prefill = runtime.prefill_last_fn.lower(runtime.state, tokens_BxT,
                                          abstract_cache).compile()
  token_B = jax.ShapeDtypeStruct((batch_size,), jnp.int32)
  decode = runtime.decode_fn.lower(runtime.state, token_B, abstract_cache,
                                   None).compile()
  cache_bytes = leaf_bytes(cache)

  start = time.perf_counter()
  logits_BxV, cache = prefill(runtime.state, tokens_BxT, cache)
  jax.block_until_ready((logits_BxV, cache))
  prefill_seconds = time.perf_counter() - start
  token_B = _greedy(logits_BxV)  # Also compiles the pick, outside the loop.
  jax.block_until_ready(token_B)
  check_capacity(cache, new_tokens)  # Once: the loop stays asynchronous.

  picked = [token_B]
  start = None
  for step in range(new_tokens):
    logits_BxV, cache = decode(runtime.state, token_B, cache, None)
    token_B = _greedy(logits_BxV)
    picked.append(token_B)
    if step == 0:  # The warm-up step.
      jax.block_until_ready((token_B, cache))
      start = time.perf_counter()
  jax.block_until_ready((token_B, cache))
  decode_seconds = time.perf_counter() - start

  token_ids = np.stack([np.asarray(t) for t in picked], axis=1)
  return Row(kind=kind, context=context, batch=batch_size,
             new_tokens=new_tokens, slots=slots,
             prefill_seconds=prefill_seconds, decode_seconds=decode_seconds,
             decode_tokens_per_s=(batch_size * (new_tokens - 1)
                                  / decode_seconds),
             decode_step_bytes=program_bytes(decode),
             prefill_bytes=program_bytes(prefill),
             peak_rss_gib=peak_rss_gib(), cache_bytes=cache_bytes,
             effective_bits=effective_bits(runtime.config, spec, dtype,
                                           context + new_tokens),
             token_ids=tuple(tuple(int(t) for t in seq) for seq in token_ids))


def run(runtime: Runtime, kinds: Sequence[str], contexts: Sequence[int], *,
        batch_size: int, new_tokens: int, seed: int = 0,
        log: Callable[[str], None] = print) -> list[Row]:
  """Every kind (`settings.kinds.resolve_kind`) at every context; all kinds of
  one context share the prompts (`random_prompts(..., seed)`) and the
  number of slots."""
  for name, value, least in (("batch_size", batch_size, 1),
                             ("new_tokens", new_tokens, 2)):
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
      raise ValueError(f"generate_bench.run: {name}={value!r}; allowed: an "
                       f"int >= {least} (new_tokens: a warm-up step and at "
                       "least one timed step).")
  bad = [c for c in contexts if isinstance(c, bool) or not isinstance(c, int)
         or c < 1]
  if not contexts or bad:
    raise ValueError(f"generate_bench.run: contexts={list(contexts)}; "
                     "allowed: one or more ints >= 1.")
  resolved = {kind: resolve_kind(kind) for kind in kinds}
  rows = []
  for context in contexts:
    slots = equal_slots(context + new_tokens,
                        [k.spec for k in resolved.values()])
    prompts_BxT = random_prompts(runtime.config.vocab_size, batch_size,
                                 context, seed)
    for kind, k in resolved.items():
      row = generate_one(runtime, kind, k.spec, jnp.dtype(k.dtype),
                         prompts_BxT, new_tokens, slots)
      log(f"  {kind} @ {context}: prefill {row.prefill_seconds:.2f} s, "
          f"{row.decode_tokens_per_s:.1f} tokens/s")
      rows.append(row)
  return rows


def fastest_full_precision(rows: Sequence[Row]) -> dict[tuple[int, int], Row]:
  """(context, batch) -> the dense (bf16 / float32) row of the most decode
  tokens/s there."""
  return decode_bench.fastest_full_precision(
      rows, cost=lambda r: -r.decode_tokens_per_s)


def _ratio(a: float, b: float | None) -> float | None:
  return a / b if b else None


def format_table(rows: Sequence[Row]) -> str:
  """Markdown table; the x columns are ratios to the fastest full-precision
  kind of the same context and batch (named in the last column)."""
  base = fastest_full_precision(rows)
  lines = ["| context | B | cache | eff. bits | prefill s | decode tok/s "
           "| x tok/s | step MiB | prefill MiB | peak RSS GiB | cache MiB "
           "| x cache | vs |",
           "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]

  def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"

  for r in rows:
    b = base.get((r.context, r.batch))
    lines.append(
        f"| {r.context} | {r.batch} | {r.kind} | {r.effective_bits:.2f} | "
        f"{r.prefill_seconds:.3f} | {r.decode_tokens_per_s:.1f} | "
        f"{fmt(_ratio(r.decode_tokens_per_s, b and b.decode_tokens_per_s))} "
        f"| {r.decode_step_bytes / 2**20:.1f} | "
        f"{r.prefill_bytes / 2**20:.1f} | {r.peak_rss_gib:.2f} | "
        f"{r.cache_bytes / 2**20:.2f} | "
        f"{fmt(_ratio(r.cache_bytes, b and b.cache_bytes))} | "
        f"{b.kind if b else '-'} |")
  return "\n".join(lines)


def rows_json(rows: Sequence[Row]) -> list[dict]:
  """The rows as JSON-ready dicts: every `Row` field plus `baseline` (the
  fastest full-precision kind of the same context and batch, or None) and
  `tokens_per_s_ratio` / `cache_bytes_ratio` to it (None without one)."""
  base = fastest_full_precision(rows)
  out = []
  for r in rows:
    b = base.get((r.context, r.batch))
    out.append(dataclasses.asdict(r) | {
        "baseline": b.kind if b else None,
        "tokens_per_s_ratio": _ratio(r.decode_tokens_per_s,
                                     b and b.decode_tokens_per_s),
        "cache_bytes_ratio": _ratio(r.cache_bytes, b and b.cache_bytes)})
  return out
