"""A continuous-batching engine over a paged (quantized) KV cache.

Requests queue in arrival order. Each engine step:
  1. admits waiting requests that have arrived, first come first served,
     while a slot is free and the pool holds the request's pages (its
     prompt, plus what it already generated if it was preempted) plus one
     page of headroom (`EngineConfig.headroom_pages`); a request that does
     not fit blocks the ones behind it;
  2. grows each decoding slot by the page its next token needs; when the
     pool is dry, the newest running request is preempted by recompute
     (vLLM's default): its pages are freed, and it goes back to the front
     of the queue to prefill its prompt and its generated tokens again;
  3. spends the step's token budget (`max_step_tokens`): one token per
     decoding slot, the rest on prefill chunks, oldest request first, of
     at most `prefill_chunk` tokens cut to a power of two no smaller than
     `min_chunk`, single tokens below that (so at most
     log2(prefill_chunk / min_chunk) + 2 chunk shapes ever compile);
  4. runs one decode step for every decoding slot at once
     (`steps.decode_step`), picks their tokens, and retires the requests
     that stopped (EOS unless ignored, a stop string, max tokens).
A request whose prefill ends picks its first token from the last chunk's
logits. Token i of a request is picked as `models.generate` picks it
(argmax, or fold_in(key(seed), i)), so a request served here yields what it
yields alone through `generate`, up to the float rounding of batch shapes.
Given the same requests the schedule is the same (the clock only decides
when an online request has arrived).

Prefix caching (`EngineConfig.prefix_caching`): every full page a request
commits is registered under a hash of all tokens up to its end
(`prefix_index.PrefixIndex`); a new request whose prompt starts with cached
pages attaches them by refcount and prefills the rest only; a request whose
prompt shares full pages with a prompt still being prefilled waits at the
head of the queue until those pages are committed, so requests arriving
together compute a shared prefix once. Only pages whose
every token sits in quantized (or dense) storage can be shared, and the
state a request keeps outside its pages (a full-precision residual or flush
window, sinks, a sliding layer's ring) cannot be rebuilt from pages, so a
cache with any of those refuses prefix caching with a ValueError.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from kvq_jax.cache.paged.layer import DEFAULT_PAGE_SIZE, PagedLayerCache
from kvq_jax.cache.paged.model import (init_paged_cache, reset_slots,
                                       with_block_table)
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.models.runtime import Runtime
from kvq_jax.serving import steps
from kvq_jax.serving.pages import BlockTables, OutOfPages, PageAllocator
from kvq_jax.serving.prefix_index import PrefixIndex, page_keys
from kvq_jax.serving.request import Request, RequestResult, check_requests


@dataclasses.dataclass(frozen=True)
class EngineConfig:
  """Static shape of a serving run.

  Attributes:
    max_slots: requests served at once (the decode batch).
    num_pages: pool pages per layer, page 0 the null page included.
    max_context: the most tokens one request may hold (prompt + output).
    page_size: tokens per page (P).
    prefill_chunk: the largest prefill chunk, a power of two.
    min_chunk: the smallest chunk above one token, a power of two
      <= prefill_chunk (fewer programs to compile; a remainder below it is
      prefilled a token at a time).
    max_step_tokens: tokens one step may process (decode + prefill); None
      means max_slots + prefill_chunk.
    headroom_pages: free pages beyond a prompt's that admission asks for.
    cache_spec: None for a dense cache, else the quantized one.
    cache_dtype: the full-precision dtype (a dense cache's storage, what a
      quantized cache quantizes from); None means the model's.
    prefix_caching: share full committed prompt pages between requests.
  """

  max_slots: int
  num_pages: int
  max_context: int
  page_size: int = DEFAULT_PAGE_SIZE
  prefill_chunk: int = 256
  min_chunk: int = 32
  max_step_tokens: int | None = None
  headroom_pages: int = 1
  cache_spec: CacheSpec | None = None
  cache_dtype: Any = None
  prefix_caching: bool = False

  def __post_init__(self):
    for name in ("max_slots", "num_pages", "max_context", "page_size",
                 "prefill_chunk", "min_chunk"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"EngineConfig.{name}={value!r}: allowed: an int "
                         ">= 1.")
    if self.num_pages < 2:
      raise ValueError(f"EngineConfig.num_pages={self.num_pages}: allowed: "
                       ">= 2 (page 0 is the null page).")
    for name in ("prefill_chunk", "min_chunk"):
      value = getattr(self, name)
      if value & (value - 1):
        raise ValueError(f"EngineConfig.{name}={value}: allowed: a power "
                         "of two.")
    if self.min_chunk > self.prefill_chunk:
      raise ValueError(f"EngineConfig.min_chunk={self.min_chunk}: allowed: "
                       f"<= prefill_chunk = {self.prefill_chunk}.")
    if self.headroom_pages < 0:
      raise ValueError(f"EngineConfig.headroom_pages={self.headroom_pages}: "
                       "allowed: >= 0.")
    if self.max_step_tokens is not None and self.max_step_tokens <= (
        self.max_slots - 1):
      raise ValueError(
          f"EngineConfig.max_step_tokens={self.max_step_tokens}: allowed: "
          f"> max_slots - 1 = {self.max_slots - 1} (every decoding slot "
          "takes one token per step, and prefill needs at least one).")

  @property
  def step_tokens(self) -> int:
    return (self.max_slots + self.prefill_chunk
            if self.max_step_tokens is None else self.max_step_tokens)

  @property
  def max_pages(self) -> int:
    """Pages one slot may hold."""
    return -(-self.max_context // self.page_size)


@dataclasses.dataclass(frozen=True)
class StepRecord:
  """One engine step: when it ended, how many requests were running
  (admitted, not finished) and decoding, the prefill tokens it ran, and the
  pages in use."""

  time: float
  running: int
  decoding: int
  prefill_tokens: int
  pages_used: int


@dataclasses.dataclass
class _Slot:
  result: RequestResult
  request: Request
  order: int  # Admission order: the newest is preempted first.
  tokens: list[int]  # What the cache must hold: prompt + generated.
  cursor: int = 0  # Tokens already in the cache.
  pending: int | None = None  # The last picked token, not yet fed.
  # With prefix caching: the keys of the full pages of `tokens` at
  # admission (what a prefilling slot will commit), hashed once.
  keys: list[bytes] = dataclasses.field(default_factory=list)


def _chunk(remaining: int, budget: int, largest: int, smallest: int) -> int:
  """The largest power of two <= min(remaining, budget, largest) if it is
  at least `smallest`, else 1."""
  n = 1 << (min(remaining, budget, largest).bit_length() - 1)
  return n if n >= smallest else 1


def _finish_reason(request: Request, result: RequestResult, eos_id,
                   decode_text) -> str | None:
  token = result.new_ids[-1]
  if request.eos_id is not None:
    eos_id = request.eos_id
  if not request.ignore_eos and eos_id is not None and token == eos_id:
    return "eos"
  if request.stop and any(s in decode_text(result.new_ids)
                          for s in request.stop):
    return "stop"
  if len(result.new_ids) >= request.max_new_tokens:
    return "length"
  return None


class Engine:
  """Serves `Request`s with continuous batching (module docstring)."""

  def __init__(self, model, config: EngineConfig, tokenizer=None):
    self.runtime = model if isinstance(model, Runtime) else Runtime(model)
    self.config = config
    self.tokenizer = tokenizer
    mc = self.runtime.config
    mc.check_context(config.max_context,
                     f"EngineConfig.max_context={config.max_context}")
    dtype = (self.runtime.model.dtype if config.cache_dtype is None
             else config.cache_dtype)
    self.cache = init_paged_cache(mc, config.max_slots, config.num_pages,
                                  config.max_pages, config.cache_spec, dtype,
                                  config.page_size)
    if config.prefix_caching:
      why = self._prefix_refusal()
      if why:
        raise ValueError(f"EngineConfig.prefix_caching: {why}")
    self._decode, self._prefill = steps.jitted(self.runtime.graphdef)
    self.preemptions = 0
    self.steps: list[StepRecord] = []

  def _prefix_refusal(self) -> str | None:
    for i, layer in enumerate(self.cache):
      if not isinstance(layer, PagedLayerCache):
        return (f"layer {i} is a sliding-window ring, whose state cannot "
                "be rebuilt from shared pages.")
      spec = layer.spec
      if spec.sink or spec.window_of("k") or spec.window_of("v"):
        return (f"layer {i} keeps full-precision tokens outside its pages "
                f"(sink={spec.sink}, windows k={spec.window_of('k')} / "
                f"v={spec.window_of('v')}), which belong to one request and "
                "cannot be shared; allowed: formats that commit every token "
                "as it is written (residual 0, flush 1, no sinks).")
    return None

  # -- checks ---------------------------------------------------------------

  def check(self, requests: Sequence[Request]) -> None:
    """ValueError, before anything compiles, for a request this engine can
    never serve."""
    check_requests(requests)
    cfg = self.config
    for r in requests:
      if r.max_tokens > cfg.max_context:
        raise ValueError(
            f"Request {r.id!r}: prompt {len(r.prompt)} + max_new_tokens "
            f"{r.max_new_tokens} = {r.max_tokens} tokens > max_context "
            f"{cfg.max_context}.")
      need = -(-r.max_tokens // cfg.page_size) + cfg.headroom_pages
      if need > cfg.num_pages - 1:
        raise ValueError(
            f"Request {r.id!r} needs {need} pages (its {r.max_tokens} tokens "
            f"in pages of {cfg.page_size}, + {cfg.headroom_pages} headroom); "
            f"the pool has {cfg.num_pages - 1}: allowed: a budget of at "
            "least one request's pages.")
      if r.stop and self.tokenizer is None:
        raise ValueError(f"Request {r.id!r} has stop strings but the engine "
                         "has no tokenizer.")

  # -- the loop -------------------------------------------------------------

  def run(self, requests: Sequence[Request],
          clock: Callable[[], float] = time.perf_counter,
          sleep: Callable[[float], None] = time.sleep
          ) -> list[RequestResult]:
    """Serves every request; results in the order given."""
    self.check(requests)
    cfg = self.config
    allocator = PageAllocator(cfg.num_pages)
    tables = BlockTables(allocator, cfg.max_slots, cfg.max_pages,
                         cfg.page_size)
    index = (PrefixIndex(allocator, cfg.page_size) if cfg.prefix_caching
             else None)
    eos = self.runtime.config.eos_token_id
    results = {r.id: RequestResult(r.id, r.prompt, arrival=r.arrival)
               for r in requests}
    arrivals = sorted(requests, key=lambda r: r.arrival)
    waiting: list[tuple[Request, list[int]]] = []  # (request, tokens)
    slots: list[_Slot | None] = [None] * cfg.max_slots
    order = 0
    start = clock()
    now = lambda: clock() - start
    decode_text = (self.tokenizer.decode if self.tokenizer is not None
                   else None)
    self.steps, self.preemptions = [], 0
    self._table = None

    def free_slot(s: int) -> None:
      tables.free(s)
      slots[s] = None
      self.cache = reset_slots(self.cache, [s])

    while arrivals or waiting or any(slots):
      t = now()
      while arrivals and arrivals[0].arrival <= t:
        r = arrivals.pop(0)
        waiting.append((r, list(r.prompt)))
      if not waiting and not any(slots):
        sleep(max(0.0, arrivals[0].arrival - now()))
        continue
      # 1. Admission.
      while waiting and None in slots:
        r, tokens = waiting[0]
        reused = (index.lookup(tokens[:-1]) if index is not None else [])
        if index is not None and self._awaits_prefix(
            tokens, len(reused), slots):
          break
        fresh = -(-len(tokens) // cfg.page_size) - len(reused)
        if allocator.num_free < fresh + cfg.headroom_pages:
          if index is not None and index.evict(
              fresh + cfg.headroom_pages - allocator.num_free):
            continue
          break
        waiting.pop(0)
        s = slots.index(None)
        if reused:
          tables.attach(s, reused)
        assert tables.reserve(s, len(tokens)) is None
        result = results[r.id]
        if result.admitted is None:
          result.admitted = now()
        result.reused_tokens = max(result.reused_tokens,
                                   len(reused) * cfg.page_size)
        slots[s] = _Slot(result, r, order, tokens,
                         cursor=len(reused) * cfg.page_size,
                         keys=(page_keys(tokens, cfg.page_size)
                               if index is not None else []))
        order += 1
        self.cache = self._set_length(s, slots[s].cursor)
      # 2. Growth (and preemption) of the decoding slots.
      for s in sorted((s for s, x in enumerate(slots)
                       if x is not None and x.pending is not None),
                      key=lambda s: slots[s].order):
        while slots[s] is not None and isinstance(
            tables.reserve(s, slots[s].cursor + 1), OutOfPages):
          victim = max((v for v, x in enumerate(slots) if x is not None),
                       key=lambda v: slots[v].order)
          x = slots[victim]
          x.result.preemptions += 1
          self.preemptions += 1
          waiting.insert(0, (x.request, list(x.request.prompt)
                             + x.result.new_ids))
          free_slot(victim)
      table = tables.table
      if not np.array_equal(table, self._table):
        self.cache, self._table = with_block_table(self.cache, table), table
      # 3. Prefill under the step's token budget.
      decoding = [s for s, x in enumerate(slots)
                  if x is not None and x.pending is not None]
      budget = cfg.step_tokens - len(decoding)
      prefilled = 0
      for s in sorted((s for s, x in enumerate(slots)
                       if x is not None and x.pending is None),
                      key=lambda s: slots[s].order):
        x = slots[s]
        while budget > 0 and x.cursor < len(x.tokens):
          n = _chunk(len(x.tokens) - x.cursor, budget, cfg.prefill_chunk,
                     cfg.min_chunk)
          chunk = jnp.asarray([x.tokens[x.cursor:x.cursor + n]], jnp.int32)
          logits_1xV, self.cache = self._prefill(
              self.runtime.state, self.cache, chunk,
              jnp.asarray([s], jnp.int32))
          x.cursor += n
          budget -= n
          prefilled += n
        if x.cursor == len(x.tokens):
          if index is not None:
            index.insert(x.tokens, list(tables.pages(s)))
          token = int(steps.pick(
              logits_1xV, jnp.asarray([x.request.seed], jnp.int32),
              jnp.asarray([len(x.result.new_ids)], jnp.int32),
              jnp.asarray([x.request.temperature], jnp.float32))[0])
          self._emit(s, slots, token, eos, decode_text, now, free_slot)
      # 4. One decode step for the slots that were decoding.
      if decoding:
        self._decode_all(decoding, slots, eos, decode_text, now, free_slot)
      self.steps.append(StepRecord(
          now(), sum(x is not None for x in slots), len(decoding), prefilled,
          allocator.num_used))
    if index is not None:
      index.evict(len(index))
    return [results[r.id] for r in requests]

  def _awaits_prefix(self, tokens, num_reused: int, slots) -> bool:
    """Whether a running request is still prefilling full pages that
    `tokens` share beyond the `num_reused` cached ones: the request then
    waits for them to be committed (a few steps) instead of computing the
    same pages again."""
    keys = page_keys(tokens[:-1], self.config.page_size)
    if len(keys) <= num_reused:
      return False
    for x in slots:
      if x is None or x.pending is not None or x.cursor >= len(x.tokens):
        continue  # Not prefilling.
      theirs = x.keys
      if len(theirs) > num_reused and theirs[num_reused] == keys[num_reused]:
        return True
    return False

  def _emit(self, s, slots, token, eos, decode_text, now, free_slot):
    x = slots[s]
    x.result.new_ids.append(token)
    x.result.token_times.append(now())
    x.tokens.append(token)
    reason = _finish_reason(x.request, x.result, eos, decode_text)
    if reason is not None:
      x.result.finish_reason = reason
      free_slot(s)
    else:
      x.pending = token

  def _decode_all(self, decoding, slots, eos, decode_text, now, free_slot):
    b = self.config.max_slots
    token_B = np.zeros(b, np.int32)
    active_B = np.zeros(b, bool)
    seed_B = np.zeros(b, np.int32)
    step_B = np.zeros(b, np.int32)
    temp_B = np.zeros(b, np.float32)
    for s in decoding:
      x = slots[s]
      token_B[s], active_B[s] = x.pending, True
      seed_B[s], step_B[s] = x.request.seed, len(x.result.new_ids)
      temp_B[s] = x.request.temperature
    next_B, _, self.cache = self._decode(
        self.runtime.state, self.cache, jnp.asarray(token_B),
        jnp.asarray(active_B), jnp.asarray(seed_B), jnp.asarray(step_B),
        jnp.asarray(temp_B))
    next_B = np.asarray(next_B)
    for s in decoding:
      slots[s].cursor += 1
      slots[s].pending = None
      self._emit(s, slots, int(next_B[s]), eos, decode_text, now, free_slot)

  def _set_length(self, slot: int, length: int) -> list:
    """Every layer's length of `slot` set to `length` (a prefix reused
    from shared pages counts as written)."""
    if not length:
      return self.cache
    return [layer.replace(length_B=layer.length_B.at[slot].set(length))
            for layer in self.cache]
