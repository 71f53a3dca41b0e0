"""What a cache costs in bytes, and what it buys: context that fits, speed.

Bytes are read off the real cache pytree (`jax.eval_shape`, so nothing is
allocated). Two figures:

* stored bits (`theoretical_bits`, `cache_bytes`'s per-token part): packed
  codes + scales + zeros per token, what one quantized token costs;
* effective bytes at T tokens (`effective_bytes`): what the cache really
  holds for one sequence of T tokens. Per layer and tensor x in {K, V}:
      stored_x * min(max(0, T - P_x), C_x) + P_x * fp_x + constants,
  P_x = S + W_x the full-precision slots (sinks + window, allocated whatever
  T is), fp_x their bytes per token in the window dtype, stored_x the
  quantized bytes per token; a full-precision layer costs T tokens in the
  cache dtype. C_x is unbounded on a global layer; on a sliding-window
  (local) layer it is the ring's stored slots (`cache/sliding.py`: W for
  a full-precision layer; R_x = round_up(max(W - R, 1), g_x) quantized,
  where sinks are dropped, S = 0), so a local layer's cost stops growing
  once its window is full: a constant, at most about W + the
  full-precision window tokens, and exactly a global layer's cost while
  T <= W. Per-layer constants (calibrated codebooks and ranges) are added
  by caches that have them (`constant_leaves`); a format's fixed codebook
  (Lloyd-Max or vector codes of N(0, 1) data, `fixed_tables`) is the same
  in every layer, stored once per model and charged once. Effective bits per element =
  8 * bytes / (2 * kv_heads * head_dim * sum over layers of the tokens each
  layer holds): T on a global layer, min(T, W) on a local one, so a dense
  bfloat16 cache is 16 bits at every T and a model with sliding-window
  layers is charged per element it actually keeps.
  `cost_split` reports the global (per token) and local (constant) parts.

Every comparison (compression, context that fits, the speed model) uses the
effective figure. Decode is memory-bound in this model, so the speed-up
estimate is 1 / (1 - beta + beta / c): beta = cache / (weights + cache)
bytes read per step at the baseline's largest context in the budget, c =
the effective compression there. It is a model of an accelerator's decode,
printed beside the measured ratio.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from kvq_jax.cache.dense import DenseLayerCache
from kvq_jax.cache.factory import init_cache
from kvq_jax.cache.sliding import SlidingDenseLayerCache
from kvq_jax.cache.sliding_quantized import (SlidingQuantizedLayerCache,
                                             local_layer_spec)
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.loaders import param_layout
from kvq_jax.models.config import ModelConfig
from kvq_jax.quant import cache_bits_per_element, table_id

_PROBE_SLOTS = 4096

# `memory_report` keys that describe the baseline alone (a run without a
# quantized cache reports only these).
BASELINE_KEYS = ("kv_bytes_per_token_baseline", "kv_bytes_per_token_bf16",
                 "kv_bytes_per_sequence_baseline", "kv_context_tokens",
                 "memory_budget_gib", "weight_bytes",
                 "max_context_tokens_baseline")


def _nbytes(leaves) -> int:
  return sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in leaves)


def _first_use(tables, seen: set) -> list:
  """The format-fixed tables no earlier layer reads (adds them to
  `seen`): one copy serves the whole model."""
  out = []
  for table in tables:
    key = table_id(table)
    if key not in seen:
      seen.add(key)
      out.append(table)
  return out


def cache_bytes(config: ModelConfig, spec: CacheSpec | None,
                dtype) -> tuple[float, int]:
  """(stored bytes per token, fixed bytes per sequence).

  Per token: over the layers whose cost grows with the context, i.e. every
  layer but the sliding-window ones (a local layer costs nothing per token
  beyond its window). Fixed = what is allocated per sequence whatever its
  length: the full-precision buffers (windows, sinks), any per-layer
  constants, and every local layer's ring (`effective_bytes` charges a
  local layer only the part a shorter sequence fills).
  """
  split = cost_split(config, spec, dtype)
  return (split.global_bytes_per_token,
          split.global_fixed_bytes + split.local_bytes)


@dataclasses.dataclass(frozen=True)
class CostSplit:
  """A cache's bytes per sequence, global vs sliding-window (local) layers.

  Attributes:
    global_layers, local_layers: the layer indices of each kind.
    global_bytes_per_token: stored bytes per token of the global layers
      (beyond their full-precision slots): their cost grows with T.
    global_fixed_bytes: the global layers' full-precision buffers (windows,
      sinks) and per-layer constants.
    local_bytes: what the local layers hold once their windows are full
      (rings, windows, constants): a constant, whatever T > W.
  """

  global_layers: tuple[int, ...]
  local_layers: tuple[int, ...]
  global_bytes_per_token: float
  global_fixed_bytes: int
  local_bytes: int


def cost_split(config: ModelConfig, spec: CacheSpec | None,
               dtype) -> CostSplit:
  """The global (per token) / local (constant) split of the cache's bytes."""
  layers = _costs(config, spec, jnp.dtype(dtype).name)
  per_token, fixed, local = 0.0, 0, 0
  for is_local, tensors in layers:
    for cost in tensors:
      if is_local:
        local += cost.ring_bytes + cost.fp_bytes
      else:
        per_token += cost.stored
        fixed += cost.fp_bytes
  return CostSplit(
      global_layers=tuple(i for i, (lc, _) in enumerate(layers) if not lc),
      local_layers=tuple(i for i, (lc, _) in enumerate(layers) if lc),
      global_bytes_per_token=per_token, global_fixed_bytes=fixed,
      local_bytes=local)


class _TensorCost(NamedTuple):
  """One tensor (K or V) of one layer, or its per-layer constants."""

  stored: float  # Bytes per stored (quantized or dense) token.
  fp_slots: int  # Full-precision slots (sinks + window), always allocated.
  fp_bytes: int  # Their bytes (and per-layer constants).
  ring: int | None = None  # Local layer: stored tokens its ring holds
  ring_bytes: int = 0  # and their bytes (None, 0: no ring).

  def bytes_at(self, num_tokens: int) -> float:
    """Bytes held for one sequence of `num_tokens` tokens."""
    tokens = max(0, num_tokens - self.fp_slots)
    if self.ring is None:
      return self.stored * tokens + self.fp_bytes
    return (self.ring_bytes * min(tokens, self.ring) / self.ring
            + self.fp_bytes)


@functools.lru_cache(maxsize=64)
def _costs(config: ModelConfig, spec: CacheSpec | None, dtype_name: str
           ) -> tuple[tuple[bool, tuple[_TensorCost, ...]], ...]:
  """Per layer: (is local, the costs of its tensors), per-layer constants
  as a tensor (0, 0, bytes, ring)."""
  out, seen = [], set()
  cache = jax.eval_shape(lambda: init_cache(config, 1, _PROBE_SLOTS, spec,
                                            jnp.dtype(dtype_name)))
  for layer in cache:
    if isinstance(layer, DenseLayerCache):
      out.append((False, (_TensorCost(
          _nbytes([layer.k_BxSxKxH, layer.v_BxSxKxH]) / layer.capacity, 0,
          0),)))
    elif isinstance(layer, SlidingDenseLayerCache):
      ring, ring_bytes = layer.ring_slots, _nbytes([layer.k_BxRxKxH,
                                                    layer.v_BxRxKxH])
      out.append((True, (_TensorCost(ring_bytes / ring, 0, 0, ring,
                                     ring_bytes),)))
    elif isinstance(layer, SlidingQuantizedLayerCache):
      tensors = []
      for name, store, window in (("k", layer.k_ring, layer.window_k),
                                  ("v", layer.v_ring, layer.window_v)):
        ring = layer.ring_slots(name)
        ring_bytes = _nbytes(jax.tree_util.tree_leaves(store))
        tensors.append(_TensorCost(ring_bytes / ring, window.shape[2],
                                   _nbytes([window]), ring, ring_bytes))
      tensors.append(_TensorCost(0.0, 0, _nbytes(
          layer.constant_leaves() + _first_use(layer.fixed_tables(), seen))))
      out.append((True, tuple(tensors)))
    else:
      slots = layer.allocated_slots
      tensors = []
      for store, window, sink in ((layer.k_store, layer.window_k,
                                   layer.sink_k),
                                  (layer.v_store, layer.window_v,
                                   layer.sink_v)):
        tensors.append(_TensorCost(
            _nbytes(jax.tree_util.tree_leaves(store)) / slots,
            window.shape[2] + sink.shape[2], _nbytes([window, sink])))
      tensors.append(_TensorCost(0.0, 0, _nbytes(
          layer.constant_leaves() + _first_use(layer.fixed_tables(), seen))))
      out.append((False, tuple(tensors)))
  return tuple(out)


def effective_bytes(config: ModelConfig, spec: CacheSpec | None, dtype,
                    num_tokens: int) -> int:
  """Bytes one sequence of `num_tokens` holds (module docstring)."""
  if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) \
      or num_tokens < 1:
    raise ValueError(f"effective_bytes: num_tokens={num_tokens!r}; allowed: "
                     "an integer >= 1.")
  total = sum(cost.bytes_at(num_tokens)
              for _, tensors in _costs(config, spec, jnp.dtype(dtype).name)
              for cost in tensors)
  return int(math.ceil(total))


def effective_bits(config: ModelConfig, spec: CacheSpec | None, dtype,
                   num_tokens: int) -> float:
  """Effective bits per K/V element held at `num_tokens` tokens (module
  docstring: a local layer holds min(T, W) tokens)."""
  held = sum(min(num_tokens, config.layer_window(i) or num_tokens)
             for i in range(config.num_layers))
  elements = held * 2 * config.num_kv_heads * config.head_dim
  return 8 * effective_bytes(config, spec, dtype, num_tokens) / elements


def max_context(config: ModelConfig, spec: CacheSpec | None, dtype,
                free_bytes: float) -> int:
  """Largest T with effective_bytes(T) <= free_bytes (0 if none).

  When every layer is a sliding-window one and their constant fits, the
  cache sets no limit: the model's own `max_position_embeddings` is
  returned.
  """
  if free_bytes < effective_bytes(config, spec, dtype, 1):
    return 0
  if not cost_split(config, spec, dtype).global_layers:
    full = max(cost.fp_slots + (cost.ring or 0)
               for _, tensors in _costs(config, spec, jnp.dtype(dtype).name)
               for cost in tensors)
    if effective_bytes(config, spec, dtype, max(full, 1)) <= free_bytes:
      return config.max_position_embeddings
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
  """What the cache keeps in full precision, in words (per distinct layer).

  A sliding-window layer's text starts with "sliding window W:" and counts
  no sinks (they are dropped there).
  """
  parts = {}
  for i in range(config.num_layers):
    layer = None if spec is None else spec.layer(i)
    window = config.layer_window(i)
    if layer is not None and window is not None:
      layer = local_layer_spec(layer)
    if layer is None:
      text = "every token, K and V (no quantization)"
    elif layer.is_full_precision:
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
    if window is not None:
      text = f"sliding window {window}: " + text.replace(
          "every token", f"the last {window} tokens")
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
                     dtype, layers: tuple[int, ...] | None = None) -> float:
  """Mean bits per cached K/V element over `layers` (None: all), from the
  specs alone."""
  full_bits = 8 * jnp.dtype(dtype).itemsize
  total = 0.0
  layers = range(config.num_layers) if layers is None else layers
  for i in layers:
    layer = None if spec is None else spec.layer(i)
    for s in ((None, None) if layer is None else (layer.k, layer.v)):
      total += (full_bits if s is None
                else cache_bits_per_element(s, config.head_dim))
  return total / (2 * len(layers))


def num_params(config: ModelConfig) -> int:
  """Parameters of the architecture: every leaf of its loader layout."""
  leaves = jax.tree_util.tree_leaves(
      param_layout.expected_shapes(config),
      is_leaf=lambda x: isinstance(x, tuple))
  return sum(math.prod(shape) for shape in leaves)


AUTO_CACHE_GIB = 1.0


def memory_report(config: ModelConfig, spec: CacheSpec | None, quant_dtype,
                  baseline_dtype, budget_gib: float | None,
                  weight_bytes_per_param: float,
                  num_tokens: int) -> dict[str, float | int | str]:
  """Byte accounting of the quantized cache at `num_tokens` (the evaluated
  context) and at 4096 / 32768 tokens, against bf16 and the baseline.

  `budget_gib` is the total memory for weights and cache; None means the
  weights plus AUTO_CACHE_GIB (the resolved value is `memory_budget_gib`).

  Baselines are full-precision caches of the same model, rings on its
  sliding-window layers included. `kv_bytes_per_token` (and its
  `_theoretical`, `_baseline`, `_bf16` variants) count the global layers
  only, whose cost grows with the context; `kv_local_bytes_per_sequence` is
  the constant the `kv_local_layers` sliding-window layers hold once their
  windows are full (also part of `kv_fixed_bytes_per_sequence`).
  """
  base_tok, _ = cache_bytes(config, None, baseline_dtype)
  bf16_tok, _ = cache_bytes(config, None, jnp.bfloat16)
  quant_tok, quant_fixed = cache_bytes(config, spec, quant_dtype)
  split = cost_split(config, spec, quant_dtype)
  weights = num_params(config) * weight_bytes_per_param
  if budget_gib is None:  # Auto: 1 GiB for the cache beside the weights.
    budget_gib = weights / 2**30 + AUTO_CACHE_GIB
  budget = budget_gib * 2**30
  free = budget - weights
  if free <= 0:
    raise ValueError(
        f"config.memory.budget_gib={budget_gib}: the weights alone take "
        f"{weights / 2**30:.2f} GiB; allowed: a larger budget.")
  ctx_base = max_context(config, None, jnp.bfloat16, free)
  ctx_quant = max_context(config, spec, quant_dtype, free)
  at = lambda t: effective_bytes(config, spec, quant_dtype, t)
  bf16_at = lambda t: effective_bytes(config, None, jnp.bfloat16, t)
  compression = bf16_at(num_tokens) / at(num_tokens)
  compression_at_base = bf16_at(ctx_base) / at(ctx_base)
  beta = bf16_at(ctx_base) / (weights + bf16_at(ctx_base))
  stored = theoretical_bits(config, spec, quant_dtype)
  stored_global = (theoretical_bits(config, spec, quant_dtype,
                                    split.global_layers)
                   if split.global_layers else 0.0)
  elements_per_token = 2 * len(split.global_layers) * config.num_kv_heads * \
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
      "kv_bytes_per_sequence_baseline": effective_bytes(
          config, None, baseline_dtype, num_tokens),
      "kv_context_tokens": num_tokens,
      "kv_bytes_per_token": quant_tok,
      "kv_bytes_per_token_theoretical": (stored_global * elements_per_token
                                         / 8),
      "kv_fixed_bytes_per_sequence": quant_fixed,
      "kv_bytes_per_token_baseline": base_tok,
      "kv_bytes_per_token_bf16": bf16_tok,
      "kv_local_layers": len(split.local_layers),
      "kv_local_bytes_per_sequence": split.local_bytes,
      "compression_vs_bf16": compression,
      "memory_budget_gib": budget_gib,
      "weight_bytes": weights,
      "max_context_tokens_baseline": ctx_base,
      "max_context_tokens_quant": ctx_quant,
      "speedup_estimate": 1.0 / (1.0 - beta + beta / compression_at_base),
      "full_precision_note": full_precision_note(config, spec),
  }
