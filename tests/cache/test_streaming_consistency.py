"""Chunked prefill == token-by-token decode == uneven chunks, per CacheSpec.

The quantized cache promises that a query sees exactly what streaming decode
held when it processed that token (block flushes included), so every way of
feeding the same tokens gives the same logits up to float32 rounding.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kvq_jax.cache.dense import DenseLayerCache
from kvq_jax.cache.quantized import QuantizedLayerCache
from kvq_jax.quant import QuantizedArray

from tests.cache import tiny_setup as ts

ATOL = 1e-4


@pytest.mark.parametrize("name", list(ts.SWEEP))
def test_prefill_decode_and_mixed_chunks_agree(name):
  out = ts.sweep_logits(name)
  ids = ts.token_ids()
  np.testing.assert_allclose(out["decode"], out["prefill"], atol=ATOL, rtol=0)
  if "mixed" in out:
    np.testing.assert_allclose(out["mixed"], out["prefill"], atol=ATOL,
                               rtol=0)
  np.testing.assert_allclose(ts.nll(out["decode"], ids),
                             ts.nll(out["prefill"], ids), atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ["kivi_pc8_r8"])
def test_chunks_7_13_1_19(name):
  config_name, spec = ts.SWEEP[name]
  logits, cache = ts.run_chunks(ts.runtime(config_name),
                                ts.fresh_cache(config_name, spec),
                                ts.token_ids(), (7, 13, 1, 19))
  np.testing.assert_allclose(logits, ts.sweep_logits(name)["prefill"],
                             atol=ATOL, rtol=0)
  for layer in cache:
    np.testing.assert_array_equal(np.asarray(layer.length_B), [40, 40])


def _concat_batches(cache_a, cache_b):
  return [jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a, b]), la, lb)
          for la, lb in zip(cache_a, cache_b)]


def test_ragged_batch_from_separate_prefills():
  """Different lengths per sequence: prefill each alone, stack, decode.

  The Runtime has no padding mask, so a single batched prefill always writes
  the same T tokens to every sequence; ragged batches are built by
  concatenating the caches of separate B=1 prefills along the batch axis.
  """
  name = "kivi_pc8_r8"
  config_name, spec = ts.SWEEP[name]
  rt, ids = ts.runtime(config_name), ts.token_ids()
  _, cache_a = ts.run_chunks(rt, ts.fresh_cache(config_name, spec, batch=1),
                             ids[:1, :7], (7,))
  _, cache_b = ts.run_chunks(rt, ts.fresh_cache(config_name, spec, batch=1),
                             ids[1:, :21], (7, 7, 7))
  cache = _concat_batches(cache_a, cache_b)
  np.testing.assert_array_equal(np.asarray(cache[0].length_B), [7, 21])
  reference = ts.sweep_logits(name)["prefill"]
  for step in range(12):
    token = jnp.stack([ids[0, 7 + step], ids[1, 21 + step]])
    logits, cache = rt.decode(token, cache)
    np.testing.assert_allclose(np.asarray(logits[0]), reference[0, 7 + step],
                               atol=ATOL, rtol=0)
    np.testing.assert_allclose(np.asarray(logits[1]), reference[1, 21 + step],
                               atol=ATOL, rtol=0)


def _max_error(name: str) -> float:
  return float(np.max(np.abs(ts.sweep_logits(name)["prefill"]
                             - ts.dense_logits(ts.SWEEP[name][0]))))


def test_quantization_changes_logits_and_error_falls_with_bits():
  errors = {name: _max_error(name)
            for name in ("int2_g8_asym", "int4_g8_sym", "int8_per_token")}
  assert errors["int2_g8_asym"] > errors["int4_g8_sym"] > errors[
      "int8_per_token"], errors
  # Logits of the tiny model have std ~0.8 and |max| ~3.
  assert errors["int8_per_token"] < 0.05, errors
  assert errors["int4_g8_sym"] > 2 * errors["int8_per_token"], errors
  assert errors["int2_g8_asym"] > 2 * errors["int4_g8_sym"], errors
  assert errors["int2_g8_asym"] > 0.5, errors


def test_full_precision_override_layer_is_dense():
  """The override spec: layer 0 a DenseLayerCache, layer 1 K-only."""
  spec = ts.SWEEP["override_fp_layer0_k_only_pc8"][1]
  cache = ts.fresh_cache("tiny2", spec)
  assert isinstance(cache[0], DenseLayerCache)
  assert isinstance(cache[1], QuantizedLayerCache)
  assert isinstance(cache[1].k_store, QuantizedArray)
  assert not isinstance(cache[1].v_store, QuantizedArray)  # Plain V store.
