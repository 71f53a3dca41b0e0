"""Static (calibrated-range) keys and outliers in the quantized cache."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kvq_jax.cache.factory import init_cache
from kvq_jax.cache.key_affine import KeyAffine
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.quant import QuantSpec, cache_bits_per_element

from tests.cache import tiny_setup as ts

NAME = "static_k_outliers"


def test_storage_leaves_match_the_accounting():
  """Keys store codes and outliers only (no scale); bytes per token equal
  the spec's bits per element."""
  config_name, spec = ts.SWEEP[NAME]
  _, cache = ts.run_chunks(ts.runtime(config_name),
                           ts.fresh_cache(config_name, spec), ts.token_ids(),
                           (ts.SEQ_LEN,))
  layer = cache[0]
  assert layer.k_store.scale is None and layer.k_store.zero is None
  b, k, c, _ = layer.k_store.data.shape
  assert layer.k_store.outlier_index.shape == (b, k, c, 1)
  config = ts.CONFIGS[config_name]
  for store, qspec in ((layer.k_store, spec.k), (layer.v_store, spec.v)):
    leaves = [x for x in (store.data, store.scale, store.zero,
                          store.outlier_value, store.outlier_index)
              if x is not None]
    bits = 8 * sum(x.nbytes for x in leaves) / (b * k * c * config.head_dim)
    assert bits == cache_bits_per_element(qspec, config.head_dim)
  # Written outliers sit at distinct positions of every filled key vector.
  index = np.asarray(layer.k_store.outlier_index)[:, :, :ts.SEQ_LEN]
  assert index.max() < config.head_dim


ST = QuantSpec("int4", "static", "per_token")
AFFINE = KeyAffine.from_arrays(np.zeros((2, 16)), np.ones((2, 16)),
                               mode="range")


@pytest.mark.parametrize("kwargs, match", [
    (dict(k=None, v=ST), "values"),
    (dict(k=ST, v=None, key_rope="pre", hadamard_k=True,
          key_affines=(AFFINE,)), "hadamard_k"),
    (dict(k=None, v=None, layer_overrides=((0, None, ST),)), "values"),
])
def test_invalid_static_cache_specs(kwargs, match):
  with pytest.raises(ValueError, match=match):
    CacheSpec(**kwargs)


@pytest.mark.parametrize("affines", [(), (dataclasses.replace(
    AFFINE, mode="std"),)], ids=["none", "std_mode"])
def test_static_keys_need_range_mode_affines_when_built(affines):
  spec = CacheSpec(k=ST, v=None, key_rope="pre", key_affines=affines)
  with pytest.raises(ValueError, match="range mode"):
    init_cache(ts.CONFIGS["tiny1"], 1, 16, spec)
