"""What a cache costs in bytes, and what it buys: context that fits, speed.

Bytes are read off the real cache pytree (`jax.eval_shape`, so nothing is
allocated). Two figures:

* stored bits (`theoretical_bits`, `cache_bytes`'s per-token part): packed
  codes + scales + zeros per token, what one quantized token costs;
* effective bytes at T tokens (`effective_bytes`): what the cache really
  holds for one sequence of T tokens. Per layer and tensor x in {K, V}:
      stored_x * max(0, T - P_x) + P_x * fp_x + constants,
  P_x = S + W_x the full-precision slots (sinks + window, allocated whatever
  T is), fp_x their bytes per token in the window dtype, stored_x the
  quantized bytes per token; a full-precision layer costs T tokens in the
  cache dtype. Per-layer constants (codebooks, calibrated ranges) are added
  by caches that have them (`constant_leaves`). Effective bits per element
  = 8 * bytes / (T * 2 * layers * kv_heads * head_dim).

Every comparison (compression, context that fits, the speed model) uses the
effective figure. Decode is memory-bound in this model, so the speed-up
estimate is 1 / (1 - beta + beta / c): beta = cache / (weights + cache)
bytes read per step at the baseline's largest context in the budget, c =
the effective compression there. It is a model of an accelerator's decode,
printed beside the measured ratio.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from kvq_jax.cache.dense import DenseLayerCache
from kvq_jax.cache.factory import init_cache
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.models.config import ModelConfig
from kvq_jax.quant import bits_per_element

_PROBE_SLOTS = 4096

# `memory_report` keys that describe the baseline alone (a run without a
# quantized cache reports only these).
BASELINE_KEYS = ("kv_bytes_per_token_baseline", "kv_bytes_per_token_bf16",
                 "kv_bytes_per_sequence_baseline", "kv_context_tokens",
                 "memory_budget_gib", "weight_bytes",
                 "max_context_tokens_baseline")


def _nbytes(leaves) -> int:
  return sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in leaves)


def cache_bytes(config: ModelConfig, spec: CacheSpec | None,
                dtype) -> tuple[float, int]:
  """(stored bytes per token over all layers, fixed bytes per sequence).

  Fixed = the full-precision buffers (windows, sinks), allocated per
  sequence whatever its length, and any per-layer constants;
  `effective_bytes` combines the two.
  """
  costs = _costs(config, spec, jnp.dtype(dtype).name)
  return (sum(stored for stored, _, _ in costs),
          sum(fp_bytes for _, _, fp_bytes in costs))


@functools.lru_cache(maxsize=64)
def _costs(config: ModelConfig, spec: CacheSpec | None, dtype_name: str
           ) -> tuple[tuple[float, int, int], ...]:
  """(stored bytes per token, full-precision slots, their bytes) for every
  tensor of every layer, per-layer constants as (0, 0, bytes)."""
  out = []
  cache = jax.eval_shape(lambda: init_cache(config, 1, _PROBE_SLOTS, spec,
                                            jnp.dtype(dtype_name)))
  for layer in cache:
    if isinstance(layer, DenseLayerCache):
      out.append((_nbytes([layer.k_BxSxKxH, layer.v_BxSxKxH])
                  / layer.capacity, 0, 0))
      continue
    slots = layer.allocated_slots
    for store, window, sink in ((layer.k_store, layer.window_k, layer.sink_k),
                                (layer.v_store, layer.window_v, layer.sink_v)):
      out.append((_nbytes(jax.tree_util.tree_leaves(store)) / slots,
                  window.shape[2] + sink.shape[2], _nbytes([window, sink])))
    out.append((0.0, 0, _nbytes(layer.constant_leaves())))
  return tuple(out)


def effective_bytes(config: ModelConfig, spec: CacheSpec | None, dtype,
                    num_tokens: int) -> int:
  """Bytes one sequence of `num_tokens` holds (module docstring)."""
  if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) \
      or num_tokens < 1:
    raise ValueError(f"effective_bytes: num_tokens={num_tokens!r}; allowed: "
                     "an integer >= 1.")
  total = sum(stored * max(0, num_tokens - fp_slots) + fp_bytes
              for stored, fp_slots, fp_bytes in _costs(
                  config, spec, jnp.dtype(dtype).name))
  return int(math.ceil(total))


def effective_bits(config: ModelConfig, spec: CacheSpec | None, dtype,
                   num_tokens: int) -> float:
  """Effective bits per cached K/V element at `num_tokens` tokens."""
  elements = (num_tokens * 2 * config.num_layers * config.num_kv_heads
              * config.head_dim)
  return 8 * effective_bytes(config, spec, dtype, num_tokens) / elements


def max_context(config: ModelConfig, spec: CacheSpec | None, dtype,
                free_bytes: float) -> int:
  """Largest T with effective_bytes(T) <= free_bytes (0 if none)."""
  if free_bytes < effective_bytes(config, spec, dtype, 1):
    return 0
  lo, hi = 1, 2
  while effective_bytes(config, spec, dtype, hi) <= free_bytes:
    lo, hi = hi, hi * 2
  while hi - lo > 1:  # effective_bytes is non-decreasing in T.
    mid = (lo + hi) // 2
    if effective_bytes(config, spec, dtype, mid) <= free_bytes:
      lo = mid
    else:
      hi = mid
  return lo


def full_precision_note(config: ModelConfig, spec: CacheSpec | None) -> str:
  """What the cache keeps in full precision, in words (per distinct layer)."""
  if spec is None:
    return "every token, K and V (no quantization)"
  parts = {}
  for i in range(config.num_layers):
    layer = spec.layer(i)
    if layer.is_full_precision:
      text = "every token (full-precision layer)"
    else:
      slots = layer.full_precision_slots
      pieces = []
      for name in ("k", "v"):
        if getattr(layer, name) is None:
          pieces.append(f"{name.upper()}: every token (unquantized)")
        elif slots[name]:
          pieces.append(
              f"{name.upper()}: up to {slots[name]} tokens (sinks "
              f"{layer.sink}, residual {layer.residual}, flush window "
              f"{layer.flush(name) - 1})")
        else:
          pieces.append(f"{name.upper()}: none")
      text = "; ".join(pieces) + (f", in {layer.window_dtype}"
                                  if any(slots.values()) else "")
    parts.setdefault(text, []).append(i)
  if len(parts) == 1:
    return next(iter(parts))
  return " | ".join(f"layers {_ranges(ls)}: {t}" for t, ls in parts.items())


def _ranges(layers: list[int]) -> str:
  out, start = [], layers[0]
  for a, b in zip(layers, layers[1:] + [None]):
    if b != a + 1:
      out.append(str(start) if start == a else f"{start}-{a}")
      start = b
  return ",".join(out)


def theoretical_bits(config: ModelConfig, spec: CacheSpec | None,
                     dtype) -> float:
  """Mean bits per cached K/V element over layers, from the specs alone."""
  full_bits = 8 * jnp.dtype(dtype).itemsize
  total = 0.0
  for i in range(config.num_layers):
    layer = None if spec is None else spec.layer(i)
    for s in ((None, None) if layer is None else (layer.k, layer.v)):
      total += full_bits if s is None else bits_per_element(s, config.head_dim
                                                            if s.granularity == "per_token" else None)
  return total / (2 * config.num_layers)


def num_params(config: ModelConfig) -> int:
  d, f, v = config.hidden_size, config.intermediate_size, config.vocab_size
  q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
  bias = (q + 2 * kv) if config.attention_bias else 0
  layer = 2 * d + d * q + 2 * d * kv + q * d + 3 * d * f + bias
  head = 0 if config.tie_embeddings else d * v
  return v * d + head + d + config.num_layers * layer


def memory_report(config: ModelConfig, spec: CacheSpec | None, quant_dtype,
                  baseline_dtype, budget_gib: float,
                  weight_bytes_per_param: float,
                  num_tokens: int) -> dict[str, float | int | str]:
  """Byte accounting of the quantized cache at `num_tokens` (the evaluated
  context) and at 4096 / 32768 tokens, against bf16 and the baseline."""
  base_tok, _ = cache_bytes(config, None, baseline_dtype)
  bf16_tok, _ = cache_bytes(config, None, jnp.bfloat16)
  quant_tok, quant_fixed = cache_bytes(config, spec, quant_dtype)
  weights = num_params(config) * weight_bytes_per_param
  budget = budget_gib * 2**30
  free = budget - weights
  if free <= 0:
    raise ValueError(
        f"config.memory.budget_gib={budget_gib}: the weights alone take "
        f"{weights / 2**30:.2f} GiB; allowed: a larger budget.")
  ctx_base = int(free // bf16_tok)
  ctx_quant = max_context(config, spec, quant_dtype, free)
  at = lambda t: effective_bytes(config, spec, quant_dtype, t)
  compression = bf16_tok * num_tokens / at(num_tokens)
  compression_at_base = bf16_tok * ctx_base / at(ctx_base)
  beta = ctx_base * bf16_tok / (weights + ctx_base * bf16_tok)
  stored = theoretical_bits(config, spec, quant_dtype)
  elements_per_token = 2 * config.num_layers * config.num_kv_heads * \
      config.head_dim
  return {
      "kv_bits_per_element": stored,
      "kv_bits_per_element_effective": effective_bits(
          config, spec, quant_dtype, num_tokens),
      "kv_bits_per_element_at_4096": effective_bits(config, spec, quant_dtype,
                                                    4096),
      "kv_bits_per_element_at_32768": effective_bits(config, spec,
                                                     quant_dtype, 32768),
      "kv_bytes_per_sequence": at(num_tokens),
      "kv_bytes_per_sequence_baseline": int(base_tok * num_tokens),
      "kv_context_tokens": num_tokens,
      "kv_bytes_per_token": quant_tok,
      "kv_bytes_per_token_theoretical": stored * elements_per_token / 8,
      "kv_fixed_bytes_per_sequence": quant_fixed,
      "kv_bytes_per_token_baseline": base_tok,
      "kv_bytes_per_token_bf16": bf16_tok,
      "compression_vs_bf16": compression,
      "memory_budget_gib": budget_gib,
      "weight_bytes": weights,
      "max_context_tokens_baseline": ctx_base,
      "max_context_tokens_quant": ctx_quant,
      "speedup_estimate": 1.0 / (1.0 - beta + beta / compression_at_base),
      "full_precision_note": full_precision_note(config, spec),
  }
