"""num_params, cache bytes and memory_report, checked by hand on SmolLM2."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import pytest

from kvq_jax.experiment.memory import (BASELINE_KEYS, cache_bytes,
                                       memory_report, num_params)
from kvq_jax.experiment.short_specs import parse_short_spec
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.models.params import random_params
from tests.experiment.smollm2 import SMOLLM2
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
