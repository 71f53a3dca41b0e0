"""num_params, cache bytes and memory_report, checked by hand on SmolLM2
and on tiny configs with sliding-window (local) layers."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import pytest

from kvq_jax.cache.spec import CacheSpec
from kvq_jax.capacity.memory import (BASELINE_KEYS, CostSplit, cache_bytes,
                                     cost_split, effective_bits,
                                     effective_bytes, full_precision_note,
                                     max_context, memory_report, num_params)
from kvq_jax.models.config import ModelConfig
from kvq_jax.models.params import random_params
from kvq_jax.settings.short_specs import parse_short_spec
from tests.fixtures.smollm2 import SMOLLM2
from tests.models.tiny import TINY, TINY_BIAS_UNTIED

INT4_G32 = CacheSpec(k=parse_short_spec("int4_g32"),
                     v=parse_short_spec("int4_g32"))


def test_num_params_smollm2():
  # Equal to the element count of the real GGUF's 272 tensors (verified in
  # tests/test_real_model.py).
  assert num_params(SMOLLM2) == 134_515_008


@pytest.mark.parametrize("config", [TINY, TINY_BIAS_UNTIED],
                         ids=["tied", "bias_untied"])
def test_num_params_counts_the_params_tree(config):
  params = random_params(config, seed=0)
  assert num_params(config) == sum(
      x.size for x in jax.tree_util.tree_leaves(params))


def test_cache_bytes_per_token_by_hand():
  # 30 layers * (K + V) * 3 heads * 64 dims.
  elements = 30 * 2 * 3 * 64
  assert cache_bytes(SMOLLM2, None, jnp.bfloat16) == (elements * 2, 0)
  assert cache_bytes(SMOLLM2, None, jnp.float32) == (elements * 4, 0)
  per_token, fixed = cache_bytes(SMOLLM2, INT4_G32, jnp.float32)
  assert per_token == elements * 4.5 / 8 == 6480 and fixed == 0


def test_memory_report_int4_g32_by_hand():
  # A token-local format holds no full-precision token: effective = stored.
  report = memory_report(SMOLLM2, INT4_G32, jnp.float32, jnp.float32,
                         budget_gib=1.0, weight_bytes_per_param=2.0,
                         num_tokens=512)
  weights = 134_515_008 * 2
  free = 2**30 - weights
  ctx_base, ctx_quant = free // 23040, free // 6480
  beta = ctx_base * 23040 / (weights + ctx_base * 23040)
  compression = 23040 / 6480
  assert report["kv_bits_per_element"] == 4.5
  assert report["kv_bits_per_element_effective"] == 4.5
  assert report["kv_bits_per_element_at_4096"] == 4.5
  assert report["kv_bits_per_element_at_32768"] == 4.5
  assert report["kv_bytes_per_sequence"] == 512 * 6480
  assert report["kv_bytes_per_sequence_baseline"] == 512 * 46080
  assert report["kv_bytes_per_token"] == 6480
  assert report["kv_bytes_per_token_theoretical"] == 6480
  assert report["kv_fixed_bytes_per_sequence"] == 0
  assert report["kv_bytes_per_token_baseline"] == 46080  # float32 baseline.
  assert report["kv_bytes_per_token_bf16"] == 23040
  assert report["compression_vs_bf16"] == pytest.approx(3.5556, abs=1e-4)
  assert report["weight_bytes"] == weights
  assert report["memory_budget_gib"] == 1.0
  assert report["max_context_tokens_baseline"] == ctx_base == 34926
  assert report["max_context_tokens_quant"] == ctx_quant == 124183
  assert report["speedup_estimate"] == pytest.approx(
      1 / (1 - beta + beta / compression))
  assert report["speedup_estimate"] == pytest.approx(2.1676, abs=1e-4)
  assert report["full_precision_note"] == "K: none; V: none"
  assert set(BASELINE_KEYS) <= set(report)


def test_residual_window_is_charged_in_effective_bits():
  # KIVI-2: per-channel K waits for its 32-token group on top of R = 128,
  # per-group V only for R; both windows in bfloat16 (2 bytes).
  spec = CacheSpec(k=parse_short_spec("int2_pc32_asym"),
                   v=parse_short_spec("int2_g32_asym"), residual=128)
  report = memory_report(SMOLLM2, spec, jnp.float32, jnp.float32, 1.0, 2.0,
                         num_tokens=512)
  heads = 3 * 64
  fp_k, fp_v = 128 + 31, 128
  assert report["kv_fixed_bytes_per_sequence"] == 30 * (fp_k + fp_v) * heads * 2
  # Stored: int2 codes + bf16 scale and zero per 32 elements = 3 bits.
  assert report["kv_bits_per_element"] == 3.0
  per_tensor_token = heads * 3 / 8  # stored bytes of one token of K or V.
  at = lambda t: 30 * (per_tensor_token * (t - fp_k) + fp_k * heads * 2
                       + per_tensor_token * (t - fp_v) + fp_v * heads * 2)
  assert report["kv_bytes_per_sequence"] == at(512)
  bits = lambda t: 8 * at(t) / (t * 30 * 2 * heads)
  assert report["kv_bits_per_element_effective"] == pytest.approx(bits(512))
  # By hand: K (3 * 353 + 16 * 159) / 512 = 7.0371, V (3 * 384 + 16 * 128) /
  # 512 = 6.25: more than twice the stored 3 bits at 512 tokens.
  assert bits(512) == pytest.approx(6.6436, abs=1e-4)
  assert report["kv_bits_per_element_at_32768"] == pytest.approx(3.0570,
                                                                 abs=1e-4)
  assert report["compression_vs_bf16"] == pytest.approx(512 * 23040 / at(512))
  free = 2**30 - 134_515_008 * 2
  # Largest T with at(T) <= free, solved by hand for the affine at(T).
  slope = 30 * 2 * per_tensor_token
  offset = at(0)
  assert report["max_context_tokens_quant"] == math.floor(
      (free - offset) / slope)
  assert report["full_precision_note"] == (
      "K: up to 159 tokens (sinks 0, residual 128, flush window 31); V: up "
      "to 128 tokens (sinks 0, residual 128, flush window 0), in bfloat16")


def test_budget_below_weights_rejected():
  with pytest.raises(ValueError, match=r"budget_gib=0\.1.*0\.25 GiB"):
    memory_report(SMOLLM2, INT4_G32, jnp.float32, jnp.float32, 0.1, 2.0, 512)


# -- Sliding-window (local) layers ---------------------------------------------

# Layers 0 and 2 local (window 64), layer 1 global; per layer and token
# K + V hold 2 * 2 heads * 32 = 128 elements.
LOCAL = ModelConfig(vocab_size=97, hidden_size=64, intermediate_size=128,
                    num_layers=3, num_heads=4, num_kv_heads=2, head_dim=32,
                    sliding_window=64, local_layers=(0, 2))
GLOBAL = dataclasses.replace(LOCAL, sliding_window=None, local_layers=())
INT4_G32_ASYM = CacheSpec(k=parse_short_spec("int4_g32_asym"),
                          v=parse_short_spec("int4_g32_asym"))
KIVI_R16 = CacheSpec(k=parse_short_spec("int2_pc32_asym"),
                     v=parse_short_spec("int2_g32_asym"), residual=16)


def test_local_layers_cost_a_constant_dense():
  # bf16: 256 bytes per layer and token. Global layer 1: 256 per token;
  # the two local rings: 2 * 64 * 256 = 32768 bytes, whatever T.
  assert cache_bytes(LOCAL, None, jnp.bfloat16) == (256, 32768)
  split = cost_split(LOCAL, None, jnp.bfloat16)
  assert split == CostSplit(global_layers=(1,), local_layers=(0, 2),
                            global_bytes_per_token=256,
                            global_fixed_bytes=0, local_bytes=32768)
  for t in (1, 10, 64):  # T <= W: exactly as if every layer were global.
    assert effective_bytes(LOCAL, None, jnp.bfloat16, t) == 3 * 256 * t == \
        effective_bytes(GLOBAL, None, jnp.bfloat16, t)
  assert effective_bytes(LOCAL, None, jnp.bfloat16, 65) == 256 * 65 + 32768
  assert effective_bytes(LOCAL, None, jnp.bfloat16, 1000) == 288768
  # Elements held: the global layer 1000 tokens, each local ring 64:
  # 8 * 288768 / ((1000 + 2 * 64) * 2 * 2 heads * 32) = 16 bits, as a dense
  # bf16 cache must be, not 6.016 (all 3 layers counted at 1000 tokens).
  assert effective_bits(LOCAL, None, jnp.bfloat16, 1000) == pytest.approx(
      16.0)
  assert effective_bits(LOCAL, None, jnp.bfloat16, 10) == pytest.approx(16.0)
  assert effective_bits(GLOBAL, None, jnp.bfloat16, 1000) == 16.0
  # Largest T with 256 * T + 32768 <= 10**6: 3778.
  assert max_context(LOCAL, None, jnp.bfloat16, 10**6) == 3778
  assert max_context(GLOBAL, None, jnp.bfloat16, 10**6) == 10**6 // 768


def test_local_layers_cost_a_constant_int4_g32_asym():
  # 4-bit codes + a bf16 scale and zero per 32 elements = 5 bits: 80 bytes
  # per layer and token; a local ring holds W = 64 tokens (R = 0, F = 1).
  assert cache_bytes(LOCAL, INT4_G32_ASYM, jnp.bfloat16) == (80, 2 * 64 * 80)
  assert effective_bytes(LOCAL, INT4_G32_ASYM, jnp.bfloat16, 64) == \
      3 * 64 * 80
  assert effective_bytes(LOCAL, INT4_G32_ASYM, jnp.bfloat16, 1000) == \
      80 * 1000 + 10240
  assert max_context(LOCAL, INT4_G32_ASYM, jnp.bfloat16, 10**6) == (
      (10**6 - 10240) // 80)


def test_local_layers_with_a_residual_window():
  # K int2 per-channel g32, V int2 g32, R = 16: 3 bits, 24 bytes per token
  # and tensor. Full precision (bf16, 128 bytes a token): K 16 + 31 = 47
  # tokens (6016 bytes), V 16 (2048). Local rings: K round_up(64 - 16, 32)
  # = 64 tokens (1536 bytes), V 64 - 16 = 48 (1152).
  local_layer = 1536 + 6016 + 1152 + 2048
  assert cache_bytes(LOCAL, KIVI_R16, jnp.bfloat16) == (
      48, 6016 + 2048 + 2 * local_layer)
  at = lambda t: effective_bytes(LOCAL, KIVI_R16, jnp.bfloat16, t)
  global_at = lambda t: (24 * max(0, t - 47) + 6016 + 24 * max(0, t - 16)
                         + 2048)
  assert at(64) == 3 * global_at(64) == 28872  # T = W: nothing changes.
  assert at(64) == effective_bytes(GLOBAL, KIVI_R16, jnp.bfloat16, 64)
  assert at(1000) == global_at(1000) + 2 * local_layer == 76056
  assert full_precision_note(LOCAL, KIVI_R16) == (
      "layers 0,2: sliding window 64: K: up to 47 tokens (sinks 0, residual "
      "16, flush window 31); V: up to 16 tokens (sinks 0, residual 16, flush "
      "window 0), in bfloat16 | layers 1: K: up to 47 tokens (sinks 0, "
      "residual 16, flush window 31); V: up to 16 tokens (sinks 0, residual "
      "16, flush window 0), in bfloat16")


def test_sinks_are_not_charged_on_local_layers():
  spec = dataclasses.replace(INT4_G32_ASYM, sink=32)
  # Global layer: 32 sink tokens in bf16 per tensor = 2 * 32 * 64 bytes.
  split = cost_split(LOCAL, spec, jnp.bfloat16)
  assert split.global_fixed_bytes == 2 * 32 * 64 * 2
  assert split.local_bytes == 2 * 64 * 80  # Rings only, no sinks.


def test_memory_report_with_local_layers_by_hand():
  report = memory_report(LOCAL, INT4_G32_ASYM, jnp.float32, jnp.float32,
                         budget_gib=0.01, weight_bytes_per_param=2.0,
                         num_tokens=1000)
  weights = num_params(LOCAL) * 2
  free = 0.01 * 2**30 - weights
  assert report["kv_bytes_per_token"] == 80  # The global layer only.
  assert report["kv_bytes_per_token_theoretical"] == 80
  assert report["kv_bytes_per_token_bf16"] == 256
  assert report["kv_bytes_per_token_baseline"] == 512  # float32.
  assert report["kv_local_layers"] == 2
  assert report["kv_local_bytes_per_sequence"] == 10240
  assert report["kv_fixed_bytes_per_sequence"] == 10240
  assert report["kv_bytes_per_sequence"] == 90240
  # float32 baseline: 512 per token globally + 2 rings of 64 * 512.
  assert report["kv_bytes_per_sequence_baseline"] == 512 * 1000 + 65536
  assert report["compression_vs_bf16"] == pytest.approx(
      (256 * 1000 + 32768) / 90240)
  assert report["kv_bits_per_element"] == 5.0
  # Elements held: 1000 tokens on the global layer, 64 on each local one.
  assert report["kv_bits_per_element_effective"] == pytest.approx(
      8 * 90240 / ((1000 + 2 * 64) * 128))
  assert report["max_context_tokens_baseline"] == (free - 32768) // 256
  assert report["max_context_tokens_quant"] == (free - 10240) // 80


def test_gemma3_270m_shaped_numbers():
  """The worked example: 18 layers, 1 KV head of 256, 15 local (W = 512)."""
  config = ModelConfig(
      vocab_size=262144, hidden_size=640, intermediate_size=2048,
      num_layers=18, num_heads=4, num_kv_heads=1, head_dim=256,
      sliding_window=512,
      local_layers=tuple(i for i in range(18) if i % 6 != 5))
  # bf16: 1024 bytes per layer and token; 3 global layers.
  assert cache_bytes(config, None, jnp.bfloat16) == (3072, 15 * 512 * 1024)
  assert effective_bytes(config, None, jnp.bfloat16, 4096) == 20_447_232
  assert effective_bytes(config, None, jnp.bfloat16, 32768) == 108_527_616
  # Elements held at 4096: 3 global layers x 4096 + 15 rings x 512.
  assert effective_bits(config, None, jnp.bfloat16, 4096) == pytest.approx(
      16.0)
  assert 8 * 20_447_232 / ((3 * 4096 + 15 * 512) * 2 * 256) == 16.0
  # int4 g32 asymmetric, 5 bits: 320 bytes per layer and token.
  spec = INT4_G32_ASYM
  assert cache_bytes(config, spec, jnp.bfloat16) == (960, 15 * 512 * 320)
  assert effective_bytes(config, spec, jnp.bfloat16, 4096) == 6_389_760
  assert effective_bytes(config, spec, jnp.bfloat16, 32768) == 33_914_880
  # Its stored 5 bits per element held (was 1.35 when every layer was
  # counted at 4096 tokens).
  assert effective_bits(config, spec, jnp.bfloat16, 4096) == pytest.approx(
      5.0)


def test_every_layer_local_sets_no_cache_limit():
  config = dataclasses.replace(LOCAL, local_layers=(0, 1, 2),
                               max_position_embeddings=4096)
  assert cache_bytes(config, None, jnp.bfloat16) == (0, 3 * 64 * 256)
  assert max_context(config, None, jnp.bfloat16, 10**6) == 4096
  assert max_context(config, None, jnp.bfloat16, 3 * 64 * 256 - 1) == 63


def test_auto_budget_is_weights_plus_one_gib():
  auto = memory_report(SMOLLM2, None, jnp.bfloat16, jnp.bfloat16,
                              None, 2.0, 512)
  weights = num_params(SMOLLM2) * 2.0
  assert auto["memory_budget_gib"] == weights / 2**30 + 1.0
  explicit = memory_report(SMOLLM2, None, jnp.bfloat16, jnp.bfloat16,
                                  auto["memory_budget_gib"], 2.0, 512)
  assert auto == explicit
  # SmolLM2 bf16: 23,040 bytes per token fill exactly 1 GiB.
  assert auto["max_context_tokens_baseline"] == 2**30 // 23040


def test_fixed_codebooks_are_charged_once_per_model_by_hand():
  """K int2 Lloyd-Max per token, V int2 vector on SmolLM2's shape: each is
  2 bits + one bfloat16 scale per 64-vector = 2.25 bits, and its codebook
  is fixed by the format, so one copy serves all 30 layers: 4 float32
  levels (16 bytes) + 256 x 4 float32 vectors (4096 bytes), once."""
  spec = CacheSpec(k=parse_short_spec("int2_lm"), v=parse_short_spec("int2_vq"))
  tokens, elements = 512, 30 * 2 * 3 * 64
  stored = tokens * elements * 2.25 / 8
  assert effective_bytes(SMOLLM2, spec, jnp.float32, tokens) == (
      stored + 16 + 4096)
  assert effective_bits(SMOLLM2, spec, jnp.float32, tokens) == (
      pytest.approx(2.25 + 8 * 4112 / (tokens * elements)))
  # Layer 0 with int2_vq keys too: K's vector codes in layer 0 reuse V's
  # table and layers 1-29 still share the one int2_lm table, so nothing
  # is added.
  mixed = dataclasses.replace(spec, layer_overrides=(
      (0, parse_short_spec("int2_vq"), parse_short_spec("int2_vq")),))
  assert effective_bytes(SMOLLM2, mixed, jnp.float32, tokens) == (
      stored + 16 + 4096)
