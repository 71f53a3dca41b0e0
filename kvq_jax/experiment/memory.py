"""What a cache costs in bytes, and what it buys: context that fits, speed.

Bytes are read off the real cache pytree (`jax.eval_shape`, so nothing is
allocated): per-token storage (packed codes, scales, zeros) is divided by the
slots it holds; full-precision sink/residual buffers are a fixed cost per
sequence, reported apart. Decode is memory-bound, so the speed-up estimate
is 1 / (1 - beta + beta / c): beta = cache / (weights + cache) bytes read per
step at the baseline's largest context in the budget, c = the compression.
"""

from __future__ import annotations

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
                 "memory_budget_gib", "weight_bytes",
                 "max_context_tokens_baseline")


def _nbytes(leaves) -> int:
  return sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in leaves)


def cache_bytes(config: ModelConfig, spec: CacheSpec | None,
                dtype) -> tuple[float, int]:
  """(bytes per token over all layers, fixed bytes per sequence)."""
  cache = jax.eval_shape(
      lambda: init_cache(config, 1, _PROBE_SLOTS, spec, dtype))
  per_token, fixed = 0.0, 0
  for layer in cache:
    if isinstance(layer, DenseLayerCache):
      per_token += _nbytes([layer.k_BxSxKxH, layer.v_BxSxKxH]) / layer.capacity
    else:
      per_token += _nbytes(layer.storage_leaves()) / layer.k_store.shape[2]
      fixed += _nbytes(layer.fixed_leaves())
  return per_token, fixed


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
                  weight_bytes_per_param: float) -> dict[str, float | int]:
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
  ctx_quant = int(max(0.0, free - quant_fixed) // quant_tok)
  compression = bf16_tok / quant_tok
  beta = ctx_base * bf16_tok / (weights + ctx_base * bf16_tok)
  return {
      "kv_bits_per_element": theoretical_bits(config, spec, quant_dtype),
      "kv_bytes_per_token": quant_tok,
      "kv_bytes_per_token_theoretical": theoretical_bits(
          config, spec, quant_dtype) * 2 * config.num_layers
                                        * config.num_kv_heads * config.head_dim / 8,
      "kv_fixed_bytes_per_sequence": quant_fixed,
      "kv_bytes_per_token_baseline": base_tok,
      "kv_bytes_per_token_bf16": bf16_tok,
      "compression_vs_bf16": compression,
      "memory_budget_gib": budget_gib,
      "weight_bytes": weights,
      "max_context_tokens_baseline": ctx_base,
      "max_context_tokens_quant": ctx_quant,
      "speedup_estimate": 1.0 / (1.0 - beta + beta / compression),
  }
