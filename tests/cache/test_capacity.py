"""Writing past a quantized cache's capacity raises through the Runtime."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from tests.cache import tiny_setup as ts


def _with_length(cache, n):
  return [layer.replace(length_B=jnp.full((2,), n, jnp.int32))
          for layer in cache]


def test_fill_to_capacity_then_overflow_raises():
  config_name, spec = ts.SWEEP["kivi_pc8_r8"]
  rt, ids = ts.runtime(config_name), ts.token_ids(length=ts.CAPACITY)
  cache = ts.fresh_cache(config_name, spec)
  # Exactly up to capacity works (decode steps only: the prefill below is
  # the one other program this test compiles).
  for t in range(ts.CAPACITY):
    logits, cache = rt.decode(ids[:, t], cache)
  # The last slot is usable: the step filling it gives the logits of one
  # prefill of all CAPACITY tokens (streaming consistency up to the end).
  whole, _ = ts.run_chunks(rt, ts.fresh_cache(config_name, spec), ids,
                           (ts.CAPACITY,))
  np.testing.assert_allclose(np.asarray(logits), whole[:, -1], atol=1e-4,
                             rtol=0)
  np.testing.assert_array_equal(np.asarray(cache[0].length_B),
                                [ts.CAPACITY] * 2)
  with pytest.raises(ValueError, match="overflow"):
    rt.decode(ids[:, 0], cache)
  with pytest.raises(ValueError, match="capacity 48"):
    rt.prefill(ids[:, :2], cache)


@pytest.mark.parametrize("stored,new", [(0, 49), (47, 2), (40, 9)])
def test_prefill_past_capacity_raises_before_running(stored, new):
  config_name, spec = ts.SWEEP["int4_g8_sym"]
  cache = _with_length(ts.fresh_cache(config_name, spec), stored)
  with pytest.raises(ValueError, match=f"{stored} tokens stored \\+ {new} new"):
    ts.runtime(config_name).prefill(ts.token_ids(length=new), cache)


def test_decode_at_capacity_raises():
  config_name, spec = ts.SWEEP["pre_rope_hadamard_sinks"]
  cache = _with_length(ts.fresh_cache(config_name, spec), ts.CAPACITY)
  with pytest.raises(ValueError, match="layer 0"):
    ts.runtime(config_name).decode(jnp.zeros((2,), jnp.int32), cache)
