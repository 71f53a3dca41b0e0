"""Real SmolLM2-135M: prefill and token-by-token decode give the same NLL."""

from __future__ import annotations

import numpy as np
import pytest

import kvq_jax
from kvq_jax.cache.factory import init_cache
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.models.runtime import Runtime
from kvq_jax.quant import QuantSpec

from tests.cache import tiny_setup as ts

pytestmark = pytest.mark.slow

TEXT = ("The tower is 324 metres tall, about the same height as an 81-storey "
        "building, and the tallest structure in Paris. Its base is square, "
        "measuring 125 metres on each side. During its construction, the "
        "Eiffel Tower surpassed the Washington Monument.")
# (An int4_g32 case with float32 scales ran here too; removed to keep CI
# inside its budget: token-local formats' prefill == decode is checked on
# the tiny models, tests/cache/test_streaming_consistency.py.)
SPECS = {
    # window_dtype float32: with bfloat16 windows, the ulp-level difference
    # between the T=40 and T=1 projections occasionally moves a value across
    # a rounding boundary and later NLLs move (seen with bfloat16 scales on
    # this text: up to 0.05).
    "kivi2_r8": CacheSpec(k=QuantSpec("int2", "asymmetric", "per_channel", 32),
                          v=QuantSpec("int2", "asymmetric", "per_group", 32),
                          residual=8, block_size=32,
                          window_dtype="float32"),
}


@pytest.fixture(scope="module", name="setup")
def _setup():
  model = kvq_jax.load_model("smollm2-135m")
  ids = np.asarray([model.tokenizer.encode(TEXT)[:40]], np.int32)
  assert ids.shape == (1, 40)
  return model, Runtime(model.decoder), ids


@pytest.fixture(scope="module", name="dense_nll")
def _dense_nll(setup):
  model, rt, ids = setup
  logits, _ = ts.run_chunks(rt, init_cache(model.config, 1, 64, None), ids,
                            (40,))
  return ts.nll(logits, ids)


def test_dense_nll_is_pinned(dense_nll):
  # Golden value: float32, full-precision cache, the 40 tokens of TEXT.
  assert round(float(dense_nll.mean()), 4) == 2.9846, dense_nll.mean()


@pytest.mark.parametrize("name", list(SPECS))
def test_prefill_and_decode_nll_agree(setup, dense_nll, name):
  model, rt, ids = setup
  spec = SPECS[name]
  fresh = lambda: init_cache(model.config, 1, 64, spec)
  prefill, _ = ts.run_chunks(rt, fresh(), ids, (40,))
  decode, _ = ts.run_chunks(rt, fresh(), ids, (1,) * 40)
  nll_p, nll_d = ts.nll(prefill, ids), ts.nll(decode, ids)
  np.testing.assert_allclose(nll_d, nll_p, atol=1e-3, rtol=0)
  # Quantization is applied (some token's NLL moves by ~1) but costs little
  # on average with KIVI-2's window (measured: mean NLL +0.067 against the
  # dense cache).
  assert np.abs(nll_p - dense_nll).max() > 0.01
  assert abs(nll_p.mean() - dense_nll.mean()) < 0.2, nll_p.mean()
