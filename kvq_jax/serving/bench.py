"""`experiments.serve_bench`: what a cache kind buys when serving.

Per kind, one `Engine` serves the same requests (`workload.make_requests`)
from a KV memory budget. The budget buys pages: each slot's own state (a
full-precision residual / flush window, sinks, a sliding layer's ring) is
charged first for every slot, the rest is pages of the kind's pool bytes
per page (`page_costs`). The kind's slots are the most whose own state and
full-length requests fit, capped by `max_slots`. Before the timed run the
engine compiles every program it can run (warm-up requests: a prompt of
c + 1 tokens per chunk size c that fits the pool, then their decode steps:
`warm_up_requests`); that time is reported apart.

Reported per kind: effective bytes per token at the workload's mean length
(`capacity.memory.effective_bytes`), pages in the budget, max and mean
(time-weighted) concurrency, preemptions, requests/s and output tokens/s
(over the run's makespan), TTFT and inter-token latency p50 / p99, the
median decode-only step per decode batch size and the share of time in
steps that ran prefill (where the time goes), peak KV
bytes in use (pages in use x page bytes + the slots' own state) and the
process's peak RSS, the capacity model's predicted speed-up
1 / (1 - beta + beta / c) beside the measured requests/s ratio to the
baseline (beta = the baseline's peak KV bytes / (weights + those bytes),
c = the baseline's effective bytes per token / the kind's), and the
quality of its greedy outputs against the baseline kind's: the fraction
equal token for token, and the mean tokens to the first divergence.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from kvq_jax.bench.process_memory import peak_rss_gib, reset_peak_rss
from kvq_jax.cache.paged.model import (init_paged_cache, pool_bytes,
                                       slot_fields)
from kvq_jax.capacity.memory import effective_bytes
from kvq_jax.models.runtime import Runtime
from kvq_jax.serving.engine import Engine, EngineConfig
from kvq_jax.serving.request import Request, RequestResult
from kvq_jax.settings.kinds import resolve_kind


def page_costs(config, spec, dtype, page_size: int) -> tuple[int, int]:
  """(bytes of one page over every layer's pool, bytes of one slot's own
  state over every layer), read off the cache pytree's shapes."""
  shapes = jax.eval_shape(lambda: init_paged_cache(config, 1, 2, 1, spec,
                                                   dtype, page_size))
  per_page = pool_bytes(shapes) // 2
  per_slot = sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize
                 for layer in shapes for name in slot_fields(layer)
                 for x in jax.tree_util.tree_leaves(getattr(layer, name)))
  return per_page, per_slot


def plan(budget_bytes: int, per_page: int, per_slot: int, page_size: int,
         request_tokens: int, max_slots: int, headroom_pages: int = 1
         ) -> tuple[int, int]:
  """(pool pages incl. the null page, slots) a budget buys; ValueError
  when it cannot hold one request's pages."""
  pages_per_request = -(-request_tokens // page_size)
  need = pages_per_request + headroom_pages
  slots = max(1, min(max_slots, budget_bytes // (
      per_slot + pages_per_request * per_page)))
  pages = (budget_bytes - slots * per_slot) // per_page
  if pages < need:
    raise ValueError(
        f"KV budget {budget_bytes / 2**20:.2f} MiB holds {max(pages, 0)} "
        f"pages of {per_page} B (after {slots} slots' own state of "
        f"{per_slot} B); one request of {request_tokens} tokens needs {need} "
        "pages (+ headroom): allowed: a budget of at least one request's "
        "pages.")
  return pages + 1, slots  # + the null page, which the budget does not buy.


def _spec_dtype(kind: str) -> tuple:
  """(cache spec or None, jnp dtype) of kind `kind`
  (`settings.kinds.resolve_kind`)."""
  resolved = resolve_kind(kind)
  return resolved.spec, jnp.dtype(resolved.dtype)


def kind_plan(runtime: Runtime, kind: str, budget_bytes: int, page_size: int,
              request_tokens: int, max_slots: int
              ) -> tuple[int, int, int, int]:
  """(page bytes, slot bytes, pool pages, slots) of `kind` in the budget."""
  spec, dtype = _spec_dtype(kind)
  per_page, per_slot = page_costs(runtime.config, spec, dtype, page_size)
  try:
    pages, slots = plan(budget_bytes, per_page, per_slot, page_size,
                        request_tokens, max_slots)
  except ValueError as e:
    raise ValueError(f"kind {kind!r}: {e}") from e
  return per_page, per_slot, pages, slots


def _percentiles(values: Sequence[float]) -> tuple[float, float]:
  if not values:
    return float("nan"), float("nan")
  return (float(np.percentile(values, 50)), float(np.percentile(values, 99)))


def _mean_concurrency(engine: Engine) -> float:
  """Running requests averaged over the run's time."""
  times = [0.0] + [s.time for s in engine.steps]
  durations = np.diff(times)
  running = np.array([s.running for s in engine.steps])
  return float(np.sum(durations * running) / max(times[-1], 1e-12))


def warm_up_requests(cfg: EngineConfig) -> list[Request]:
  """Requests whose prefill runs every chunk size the engine can cut
  (`min_chunk` .. `prefill_chunk`, and single tokens) and then decode, for
  the sizes the pool holds: prompt c + 1 for each size c."""
  out, c = [], cfg.min_chunk
  while c <= cfg.prefill_chunk:
    pages = -(-(c + 3) // cfg.page_size) + cfg.headroom_pages
    if pages <= cfg.num_pages - 1 and c + 3 <= cfg.max_context:
      out.append(Request(f"warm-up {c}", tuple(range(1, c + 2)), 2,
                         ignore_eos=True))
    c *= 2
  return out or [Request("warm-up", (1,), 2, ignore_eos=True)]


def step_profile(engine: Engine) -> tuple[dict[int, float], float]:
  """(median seconds of a decode-only step per decode batch size, the
  share of the run's time spent in steps that ran prefill)."""
  times = [0.0] + [s.time for s in engine.steps]
  by_batch: dict[int, list[float]] = {}
  prefill = 0.0
  for step, begin, end in zip(engine.steps, times, times[1:]):
    if step.prefill_tokens:
      prefill += end - begin
    elif step.decoding:
      by_batch.setdefault(step.decoding, []).append(end - begin)
  medians = {b: float(np.median(v)) for b, v in sorted(by_batch.items())}
  return medians, prefill / max(times[-1], 1e-12)


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int:
  """Tokens before `a` and `b` first differ (the shorter length if one is
  a prefix of the other)."""
  for i, (x, y) in enumerate(zip(a, b)):
    if x != y:
      return i
  return min(len(a), len(b))


def serve_kind(runtime: Runtime, kind: str, requests: Sequence[Request],
               budget_bytes: int, *, max_slots: int, page_size: int,
               prefill_chunk: int, request_tokens: int,
               prefix_caching: bool = False) -> dict:
  """One kind's row (module docstring), its results under 'results'."""
  spec, dtype = _spec_dtype(kind)
  config = runtime.config
  per_page, per_slot, num_pages, slots = kind_plan(
      runtime, kind, budget_bytes, page_size, request_tokens, max_slots)
  engine = Engine(runtime, EngineConfig(
      max_slots=slots, num_pages=num_pages,
      max_context=max(request_tokens, prefill_chunk + 3),
      page_size=page_size, prefill_chunk=prefill_chunk,
      min_chunk=min(32, prefill_chunk), cache_spec=spec,
      cache_dtype=dtype, prefix_caching=prefix_caching))
  engine.check(requests)
  capacity = (num_pages - 1) * page_size
  per_request = -(-request_tokens // page_size) * page_size
  print(f"{kind}: KV capacity {capacity} tokens; maximum concurrency for "
        f"{request_tokens} tokens per request "
        f"{min(slots, capacity // per_request)}", flush=True)
  t0 = time.perf_counter()
  engine.run(warm_up_requests(engine.config))
  compile_s = time.perf_counter() - t0
  reset_peak_rss()
  t0 = time.perf_counter()
  results = engine.run(requests)
  wall = time.perf_counter() - t0
  makespan = max(r.finished for r in results)
  out_tokens = sum(len(r.new_ids) for r in results)
  ttft = _percentiles([r.ttft for r in results])
  itl = _percentiles([g for r in results for g in r.inter_token])
  mean_len = int(np.mean([len(r.prompt) + len(r.new_ids) for r in results]))
  eff = effective_bytes(config, spec, dtype, mean_len)
  peak_pages = max(s.pages_used for s in engine.steps)
  step_cost, prefill_share = step_profile(engine)
  return {
      "kind": kind, "effective_bytes_per_token": eff / mean_len,
      "mean_request_tokens": mean_len, "page_bytes": per_page,
      "slot_bytes": per_slot, "pages_in_budget": num_pages - 1,
      "slots": slots, "capacity_tokens": capacity,
      "max_concurrency": max(s.running for s in engine.steps),
      "mean_concurrency": _mean_concurrency(engine),
      "preemptions": engine.preemptions, "requests": len(results),
      "requests_per_s": len(results) / makespan,
      "output_tokens_per_s": out_tokens / makespan,
      "makespan_s": makespan, "wall_s": wall, "compile_s": compile_s,
      "ttft_p50_s": ttft[0], "ttft_p99_s": ttft[1],
      "itl_p50_s": itl[0], "itl_p99_s": itl[1],
      "peak_kv_bytes": peak_pages * per_page + slots * per_slot,
      "peak_rss_gib": peak_rss_gib(),
      "prefill_tokens": sum(s.prefill_tokens for s in engine.steps),
      "steps": len(engine.steps),
      "decode_step_s_by_batch": step_cost, "prefill_time_share": prefill_share,
      "concurrency_trace": [(s.time, s.running) for s in engine.steps],
      "results": results,
  }


def weight_bytes(runtime: Runtime) -> int:
  return sum(int(x.size) * x.dtype.itemsize
             for x in jax.tree_util.tree_leaves(runtime.state))


def compare_to_baseline(rows: list[dict], baseline: str,
                        weights: int) -> None:
  """Adds ratios, the capacity model and output agreement (in place)."""
  base = next(r for r in rows if r["kind"] == baseline)
  beta = base["peak_kv_bytes"] / (weights + base["peak_kv_bytes"])
  for row in rows:
    c = base["effective_bytes_per_token"] / row["effective_bytes_per_token"]
    row["compression"] = c
    row["predicted_speedup"] = 1.0 / (1.0 - beta + beta / c)
    row["capacity_ratio"] = row["capacity_tokens"] / base["capacity_tokens"]
    row["mean_concurrency_ratio"] = (row["mean_concurrency"]
                                     / base["mean_concurrency"])
    row["requests_per_s_ratio"] = (row["requests_per_s"]
                                   / base["requests_per_s"])
    pairs = list(zip(row["results"], base["results"]))
    row["output_match"] = float(np.mean([a.new_ids == b.new_ids
                                         for a, b in pairs]))
    row["mean_tokens_to_divergence"] = float(np.mean(
        [first_divergence(a.new_ids, b.new_ids) for a, b in pairs]))
    row["beta"] = beta


def run(runtime: Runtime, kinds: Sequence[str], requests: Sequence[Request],
        budget_bytes: int, *, max_slots: int,
        page_size: int, prefill_chunk: int, prefix_caching: bool = False,
        on_kind: Callable[[list[dict]], None] | None = None) -> list[dict]:
  """Every kind's row, compared to the first kind (the baseline).

  `on_kind(rows)`, when given, receives the rows so far (compared) after
  every kind, so a long run leaves its finished kinds on disk.
  """
  request_tokens = max(r.max_tokens for r in requests)
  for kind in kinds:  # Every budget is checked before anything compiles.
    kind_plan(runtime, kind, budget_bytes, page_size, request_tokens,
              max_slots)
  rows = []
  for kind in kinds:
    rows.append(serve_kind(runtime, kind, requests, budget_bytes,
                           max_slots=max_slots, page_size=page_size,
                           prefill_chunk=prefill_chunk,
                           request_tokens=request_tokens,
                           prefix_caching=prefix_caching))
    compare_to_baseline(rows, kinds[0], weight_bytes(runtime))
    if on_kind is not None:
      on_kind(rows)
  return rows


def budget_for_requests(runtime: Runtime, kind: str, request_tokens: int,
                        num_requests: int, page_size: int) -> int:
  """The KV budget in which `kind` holds `num_requests` full-length
  requests (their pages + one headroom page, and their slots' state)."""
  spec, dtype = _spec_dtype(kind)
  per_page, per_slot = page_costs(runtime.config, spec, dtype, page_size)
  pages = -(-request_tokens // page_size)
  return num_requests * (pages * per_page + per_slot) + per_page


__all__ = ["RequestResult", "budget_for_requests", "compare_to_baseline",
           "first_divergence", "page_costs", "plan", "run", "serve_kind"]
