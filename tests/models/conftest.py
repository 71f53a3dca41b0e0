"""Tiny random llama models shared by the decoder tests."""

from __future__ import annotations

import pytest

from kvq_jax.models.config import ModelConfig
from kvq_jax.models.params import decoder_from_params, random_params

from tests.models.tiny import TINY, TINY_BIAS_UNTIED


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
