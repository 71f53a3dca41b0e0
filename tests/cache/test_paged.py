"""The paged cache (`cache/paged/layer.py`) equals the contiguous caches.

Layer level (`kvq_jax.serving.paged_check`): ragged prefill, a chunk and 64
decode steps on SmolLM2's layer shapes, pages scattered at random in the
pool, for one preset per code path of the storage (CI's budget: every
distinct layer of every preset is `experiments.paged_check`'s sweep).
Model level: logits of the tiny decoder over a paged cache against the
contiguous one in one prefill and in uneven chunks. Then the slot
operations, the bit views of 16-bit pools, and what is refused.
"""

from __future__ import annotations

import dataclasses
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kvq_jax.cache.factory import init_cache
from kvq_jax.cache.paged.layer import PagedLayerCache, page_size_reason
from kvq_jax.cache.paged.model import (init_paged_cache, reset_slots,
                                       select_slots, with_block_table)
from kvq_jax.cache.spec import CacheSpec, LayerSpec
from kvq_jax.quant import QuantSpec
from kvq_jax.serving.paged_check import compare, scattered_table
from tests.cache import tiny_setup as ts
from tests.fixtures.preset_specs import preset_settings, synthetic_key_stats
from tests.fixtures.smollm2 import SMOLLM2

# One preset per storage path: a bf16 plain store (as uint16 bits), int8
# per token (scales folded out of the dots), kivi2 (per-channel keys with
# their flush window, a residual window, the mixed segment), tq3 (Lloyd-Max
# codebooks after a seeded rotation, pre-RoPE keys, key affine), kq3
# (static keys, outliers, a sink). q4_0 (float16 scales) and kvq4 (pre-RoPE
# per-channel keys, Hadamard values) are experiments.paged_check's, with
# every other preset: CI's budget.
PRESETS = ("bf16", "int8", "kivi2", "tq3", "kq3")


@pytest.fixture(scope="module", name="key_stats")
def _key_stats(tmp_path_factory):
  return synthetic_key_stats(pathlib.Path(tmp_path_factory.mktemp("ks")))


@pytest.mark.parametrize("name", PRESETS)
def test_paged_layer_equals_contiguous(name, key_stats):
  _, settings = preset_settings(name, key_stats)
  assert compare(SMOLLM2, settings.cache_spec,
                 dtype=settings.cache_dtype) <= 1e-5


def _paged_tiny(config_name, spec, batch=2, page=8, max_pages=6, pages=20):
  cache = init_paged_cache(ts.CONFIGS[config_name], batch, pages, max_pages,
                           spec, page_size=page)
  table = np.random.default_rng(3).permutation(np.arange(1, pages))
  return with_block_table(cache, table[:batch * max_pages].reshape(
      batch, max_pages).astype(np.int32))


@pytest.mark.parametrize("name", ["kivi_pc8_r8"])
def test_paged_model_logits_equal_contiguous(name):
  # The contiguous logits are the streaming-consistency tests' (cached per
  # session): one prefill, and uneven chunks of 7 and decode steps.
  config_name, spec = ts.SWEEP[name]
  rt, ids = ts.runtime(config_name), ts.token_ids()
  want = ts.sweep_logits(name)
  for key, chunks in (("prefill", (ts.SEQ_LEN,)), ("mixed", ts.MIXED_CHUNKS)):
    got, _ = ts.run_chunks(rt, _paged_tiny(config_name, spec), ids, chunks)
    np.testing.assert_allclose(got, want[key], atol=1e-5, rtol=0)


def test_reset_one_slot_leaves_the_others():
  spec = ts.SWEEP["kivi_pc8_r8"][1]
  rt, ids = ts.runtime("tiny1"), ts.token_ids(batch=3, length=24)
  cache = _paged_tiny("tiny1", spec, batch=3, max_pages=4, pages=13)
  _, cache = rt.prefill(ids, cache)
  reset = reset_slots(jax.tree_util.tree_map(jnp.copy, cache), [1])
  for before, after in zip(cache, reset):
    keep = select_slots([before], [0, 2])[0], select_slots([after], [0, 2])[0]
    for a, b in zip(*(jax.tree_util.tree_leaves(c) for c in keep)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    emptied = select_slots([after], [1])[0]
    assert int(emptied.length_B[0]) == 0
    assert not np.asarray(emptied.block_table_BxM).any()
    assert not np.asarray(emptied.window_k).any()
  # The others still decode exactly as before the reset.
  token = ids[:, -1]
  want, _ = rt.decode(token, cache)
  got, _ = rt.decode(token, reset)
  np.testing.assert_array_equal(np.asarray(got)[[0, 2]],
                                np.asarray(want)[[0, 2]])


def test_bfloat16_pool_holds_bits_and_equals_the_dense_bf16_cache():
  rt, ids = ts.runtime("tiny1"), ts.token_ids(length=24)
  config = ts.CONFIGS["tiny1"]
  for chunks in ((24,), (7, 1, 7, 7, 1, 1)):
    paged = with_block_table(init_paged_cache(
        config, 2, 16, 6, None, jnp.bfloat16, page_size=8),
        scattered_table(1))
    assert paged[0].k_store.dtype == jnp.uint16
    dense = init_cache(config, 2, ts.CAPACITY, None, jnp.bfloat16)
    want, _ = ts.run_chunks(rt, dense, ids, chunks)
    got, after = ts.run_chunks(rt, paged, ids, chunks)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
  assert after[0].k_store.dtype == jnp.uint16


def test_page_size_must_fit_groups_flushes_and_blocks():
  pc32 = QuantSpec("int2", "asymmetric", "per_channel", 32)
  layer = LayerSpec(k=pc32, v=None, flush_k=32)
  assert page_size_reason(layer, 32) is None
  assert "multiple of k group=32" in page_size_reason(layer, 16)
  assert "divide one another" in page_size_reason(
      LayerSpec(k=None, v=None, block_size=48), 32)
  with pytest.raises(ValueError, match="page_size=16 is not a multiple"):
    init_paged_cache(SMOLLM2, 2, 8, 4, CacheSpec(k=pc32, v=pc32),
                     page_size=16)
  with pytest.raises(ValueError, match="num_pages=1"):
    PagedLayerCache.create_paged(layer, 2, 1, 4, 3, 64)


def _respec(cache: list, **changes) -> list:
  """A copy (decode donates its cache) with every layer's LayerSpec
  fields changed; the stored pages are the same."""
  return [c.replace(spec=dataclasses.replace(c.spec, **changes))
          for c in jax.tree_util.tree_map(jnp.copy, cache)]


def test_paged_pallas_decode_equals_xla_and_refusals_fall_back():
  """attention_impl='pallas' decodes through the paged kernel (interpreted:
  pages scattered in the pool, read through the block table) and equals
  the XLA loop. Pre-RoPE keys, which the kernel cannot read, are refused
  when 'pallas' is explicit and fall back to 'xla' in a tuple. Every copy
  shares one prefill: only the static spec changes."""
  int4 = QuantSpec("int4", "symmetric", "per_group", 8)
  rt, ids = ts.runtime("tiny1"), ts.token_ids(length=8)
  spec = CacheSpec(k=int4, v=int4, block_size=16, interpret=True)
  _, cache = rt.prefill(ids, _paged_tiny("tiny1", spec))
  want, _ = rt.decode(ids[:, -1], _respec(cache))
  got, _ = rt.decode(ids[:, -1], _respec(cache, attention_impl="pallas"))
  assert np.abs(np.asarray(want)).max() > 0.1  # Non-trivial logits.
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
  with pytest.raises(ValueError,
                     match="implementation='pallas'.*key_rope='pre'"):
    rt.decode(ids[:, -1], _respec(cache, key_rope="pre",
                                  attention_impl="pallas"))
  with pytest.warns(UserWarning,
                    match="key_rope='pre'.*falling back to 'xla'"):
    rt.decode(ids[:, -1], _respec(cache, key_rope="pre",
                                  attention_impl=("pallas", "xla")))


def test_scattered_table_uses_distinct_real_pages():
  table = scattered_table(0)
  assert table.min() >= 1 and len(set(table.ravel())) == table.size
