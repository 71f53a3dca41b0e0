"""Tiny random llama models shared by the decoder tests."""

from __future__ import annotations

import pytest

from kvq_jax.models.config import ModelConfig
from kvq_jax.models.params import decoder_from_params, random_params

TINY = ModelConfig(vocab_size=97, hidden_size=64, intermediate_size=128,
                   num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                   rope_theta=10000.0, rms_norm_eps=1e-5)
# Qwen2-like variant: q/k/v biases, untied head, partial rotary dim.
TINY_BIAS_UNTIED = ModelConfig(
    vocab_size=97, hidden_size=64, intermediate_size=128, num_layers=2,
    num_heads=4, num_kv_heads=2, head_dim=16, rope_dim=8, rope_theta=500.0,
    rms_norm_eps=1e-6, tie_embeddings=False, attention_bias=True)


@pytest.fixture(scope="module", params=["tied", "bias_untied"])
def config(request) -> ModelConfig:
  return TINY if request.param == "tied" else TINY_BIAS_UNTIED


@pytest.fixture(scope="module")
def params(config):
  return random_params(config, seed=3, scale=0.1)


@pytest.fixture(scope="module")
def model(config, params):
  return decoder_from_params(config, params)


@pytest.fixture(scope="module")
def tiny_model():
  return decoder_from_params(TINY, random_params(TINY, seed=5, scale=0.1))
