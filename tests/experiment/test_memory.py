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
  report = memory_report(SMOLLM2, INT4_G32, jnp.float32, jnp.float32,
                         budget_gib=1.0, weight_bytes_per_param=2.0)
  weights = 134_515_008 * 2
  free = 2**30 - weights
  ctx_base, ctx_quant = free // 23040, free // 6480
  beta = ctx_base * 23040 / (weights + ctx_base * 23040)
  compression = 23040 / 6480
  assert report["kv_bits_per_element"] == 4.5
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
  assert set(BASELINE_KEYS) <= set(report)


def test_residual_window_is_a_fixed_cost():
  spec = CacheSpec(k=parse_short_spec("int2_pc32_asym"),
                   v=parse_short_spec("int2_g32_asym"), residual=128)
  window = spec.layer(0).window  # residual + flush_block - 1 tokens.
  report = memory_report(SMOLLM2, spec, jnp.float32, jnp.float32, 1.0, 2.0)
  fixed = 30 * 2 * window * 3 * 64 * 4
  assert report["kv_fixed_bytes_per_sequence"] == fixed
  assert report["kv_bytes_per_token"] == 30 * 2 * 3 * 64 * 3 / 8
  free = 2**30 - 134_515_008 * 2
  assert report["max_context_tokens_quant"] == math.floor(
      (free - fixed) / report["kv_bytes_per_token"])


def test_budget_below_weights_rejected():
  with pytest.raises(ValueError, match=r"budget_gib=0\.1.*0\.25 GiB"):
    memory_report(SMOLLM2, INT4_G32, jnp.float32, jnp.float32, 0.1, 2.0)
