"""Non-finite and extreme keys/values through the caches (numerics policy).

Policy (quantized cache; quant/quantize.py has the per-group arithmetic):
  * NaN in a key/value is stored as 0 (symmetric/fp8 code 0; asymmetric: the
    grid point nearest 0). +-Inf saturates to the group's extreme code. The
    group's scale comes from its finite values only, so other groups, other
    tokens and other heads are unaffected.
  * All-zero groups get scale = finfo(scale_dtype).tiny and dequantize to
    exactly 0 (finite, no 0/0).
  * A 1e4 outlier in one channel only costs precision inside its own group
    (per_group along head_dim): tokens/groups without it round-trip with the
    usual error; its own group's other values collapse towards 0 (documented
    int4 behaviour, not an error).
  * float16 scales: values beyond fp16's range cap the scale at 65504 and
    saturate; stored scales and outputs stay finite.
  * Queries that cannot see a token (causally earlier, other sequences) are
    bit-identical with and without the bad token in the quantized storage.
    Full-precision regions (dense cache, quantized sink/residual window and
    the chunk being written) keep the raw NaN/Inf: a query that attends to
    it gets NaN (propagation, not masking). Masked-out full-precision NaN/Inf
    never leaks into queries that cannot see it: bad value rows are zeroed
    for the probabilities @ values product and NaN is put back only for the
    queries that attend to them (cache/attention.py `split_nonfinite`).
  * No silent NaN perplexity: `perplexity_from_nll` raises FloatingPointError
    when any scored NLL is NaN/Inf (what the runner calls on its logits).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kvq_jax.cache.dense import DenseLayerCache
from kvq_jax.cache.quantized import QuantizedLayerCache
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.eval.evaluate import evaluate_windows
from kvq_jax.quant import QuantSpec, dequantize, quantize
from tests.robustness import tiny

B, T, K, N, H = 2, 6, 2, 4, 16
BAD_TOKEN = 3
ROPE = tiny.runtime().model.layers[0].attn.rope


def _inputs(seed=0):
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.standard_normal((B, T, N, H)), jnp.float32)
  k = jnp.asarray(rng.standard_normal((B, T, K, H)), jnp.float32)
  v = jnp.asarray(rng.standard_normal((B, T, K, H)), jnp.float32)
  return q, k, v


_STEP = jax.jit(lambda c, q, k, v, p: c.attend(q, k, v, p, ROPE))
POS = jnp.broadcast_to(jnp.arange(T), (B, T))


def _attend(layer, q, k, v):
  return _STEP(layer, q, k, v, POS)


def _quantized(spec=tiny.INT4):
  return QuantizedLayerCache.create(spec.layer(0), B, 16, K, H)


def _poison(x, value, token=BAD_TOKEN):
  return x.at[0, token, 0, 0].set(value)


def _prefill_then_decode(layer, q, k, v):
  """Writes T-1 clean tokens, then token T-1 (maybe bad) as a decode step."""
  _, layer = _STEP(layer, q[:, :-1], k[:, :-1], v[:, :-1], POS[:, :-1])
  out, layer = _STEP(layer, q[:, -1:], k[:, -1:], v[:, -1:], POS[:, -1:])
  return out, layer


@pytest.mark.parametrize("where", ["k", "v"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_bad_token_in_quantized_storage_is_isolated(where, bad):
  """A decode step writes a NaN/Inf token; it is quantized (R=0), so later
  reads see 0 / a saturated code: outputs stay finite, sequence 1 and head 1
  are bit-identical to the clean run."""
  q, k, v = _inputs()
  clean_out, clean = _prefill_then_decode(_quantized(), q, k, v)
  k2, v2 = (_poison(k, bad, T - 1), v) if where == "k" else (
      k, _poison(v, bad, T - 1))
  out, layer = _prefill_then_decode(_quantized(), q, k2, v2)
  assert np.all(np.isfinite(out)), out
  np.testing.assert_array_equal(out[1], clean_out[1])  # other sequence
  # Query heads 2, 3 read KV head 1: untouched.
  np.testing.assert_array_equal(out[0, :, 2:], clean_out[0, :, 2:])
  store = layer.k_store if where == "k" else layer.v_store
  read = np.asarray(dequantize(store, jnp.float32))[0, 0, T - 1]
  assert np.all(np.isfinite(read))
  if where == "k":  # RoPE mixes channel 0 into channel 8: values checked on v.
    return
  if np.isnan(bad):
    assert read[0] == 0.0  # NaN -> 0.
  else:  # Inf saturates to the group's extreme (+-qmax * scale or -8*scale).
    group = read[:8]
    assert read[0] == (group.max() if bad > 0 else group.min())
    assert abs(read[0]) > 0
  # Other groups of the same token are the clean ones exactly.
  clean_read = np.asarray(dequantize(clean.v_store, jnp.float32))
  np.testing.assert_array_equal(read[8:], clean_read[0, 0, T - 1, 8:])


@pytest.mark.parametrize("make", [
    pytest.param(lambda: _quantized(), id="int4"),
    pytest.param(lambda: DenseLayerCache.create(B, 16, K, H), id="dense"),
])
@pytest.mark.parametrize("where", ["k", "v"])
def test_earlier_queries_in_chunk_do_not_see_a_later_bad_value(make, where):
  """Prefill of T tokens with NaN at token 3: queries 0..2 cannot see it."""
  q, k, v = _inputs()
  clean_out, _ = _attend(make(), q, k, v)
  k2, v2 = (_poison(k, np.nan), v) if where == "k" else (k, _poison(v, np.nan))
  out, _ = _attend(make(), q, k2, v2)
  np.testing.assert_array_equal(out[:, :BAD_TOKEN], clean_out[:, :BAD_TOKEN])
  np.testing.assert_array_equal(out[1], clean_out[1])


def test_masked_nan_value_does_not_leak_dense():
  """Full precision keeps the raw NaN: exactly the queries that attend to
  it (token >= 3, query heads 0, 1 of KV head 0) are NaN, nothing else."""
  q, k, v = _inputs()
  out, _ = _attend(DenseLayerCache.create(B, 16, K, H), q, k,
                   _poison(v, np.nan))
  sees_bad = np.zeros((B, T, N), bool)
  sees_bad[0, BAD_TOKEN:, :N // K] = True
  np.testing.assert_array_equal(np.isnan(np.asarray(out)).all(-1), sees_bad)
  assert not np.isnan(np.asarray(out)[~sees_bad]).any()


def test_masked_nan_value_does_not_leak_quantized():
  """R = 0: the NaN value is stored as 0, so every output equals the run
  with that element set to 0 (the scale comes from the finite values)."""
  q, k, v = _inputs()
  out, _ = _attend(_quantized(), q, k, _poison(v, np.nan))
  zero, _ = _attend(_quantized(), q, k, _poison(v, 0.0))
  np.testing.assert_array_equal(out, zero)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_decode_nan_value_output_is_finite(bad):
  q, k, v = _inputs()
  out, _ = _prefill_then_decode(_quantized(), q, k, _poison(v, bad, T - 1))
  assert np.all(np.isfinite(out))


def test_all_zero_group_is_exact_zero_and_finite():
  q, k, v = _inputs()
  v = v.at[0, :, 0, :8].set(0.0)  # First group of head 0: all zero.
  _, layer = _prefill_then_decode(_quantized(), q, k, v)
  read = np.asarray(dequantize(layer.v_store, jnp.float32))
  assert np.all(np.isfinite(read))
  stored_scale = np.asarray(layer.v_store.scale.astype(jnp.float32))
  np.testing.assert_array_equal(read[0, 0, :T, :8], 0.0)
  assert np.all(stored_scale[0, 0, :T, 0] == float(
      jnp.finfo(jnp.bfloat16).tiny))


def test_outlier_channel_stays_in_its_group():
  """1e4 in channel 0 of every token: group 0 loses its small values, the
  other group round-trips with int4 error; the outlier itself is accurate."""
  q, k, v = _inputs()
  k_out = k.at[:, :, :, 0].set(1e4)
  _, layer = _prefill_then_decode(_quantized(), q, jnp.zeros_like(k), k_out)
  read = np.asarray(dequantize(layer.v_store, jnp.float32))[:, :, :T]
  want = np.swapaxes(np.asarray(k_out), 1, 2)
  assert np.all(np.isfinite(read))
  np.testing.assert_allclose(read[..., 0], 1e4, rtol=1e-2)
  err = np.abs(read[..., 8:] - want[..., 8:]).max()
  assert err < 0.25 * np.abs(want[..., 8:]).max()  # scale / 2 at int4.
  assert np.abs(read[..., 1:8]).max() == 0.0  # swamped: round to 0.


def test_float16_scale_overflow_saturates_finite():
  spec = QuantSpec("int8", "symmetric", "per_group", 8, scale_dtype="float16")
  x = jnp.asarray([[1e30, 1.0, -2.0, 3.0, 0.5, 0.0, 1e6, -1e30]], jnp.float32)
  qa = quantize(x, spec)
  scale = np.asarray(qa.scale.astype(jnp.float32))
  # The full-level rule: d = (signed extreme, the first 1e30) / -128, its
  # magnitude capped at fp16's max, so d = -65504 and code -128 stands for
  # +128 * 65504; -1e30 saturates at code +127 = -127 * 65504.
  assert np.all(np.isfinite(scale)) and scale.min() == -65504.0
  out = np.asarray(dequantize(qa, jnp.float32))
  assert np.all(np.isfinite(out))
  assert out[0, 0] == 128 * 65504.0 and out[0, 7] == -127 * 65504.0
  cache = CacheSpec(k=spec, v=spec, block_size=16)
  q, k, v = _inputs()
  out, _ = _prefill_then_decode(QuantizedLayerCache.create(
      cache.layer(0), B, 16, K, H), q, k.at[0, -1, 0, 0].set(1e30), v)
  assert np.all(np.isfinite(out))


def test_nan_logits_raise_floating_point_error_in_evaluation():
  """The runner's evaluate_windows never reports a NaN perplexity."""
  windows = np.arange(2 * 8, dtype=np.int32).reshape(2, 8) % 5
  mask = np.ones(7, bool)

  def good(tokens):
    return jnp.zeros(tokens.shape + (5,), jnp.float32)

  def bad(tokens):
    return good(tokens).at[-1, 3, 2].set(jnp.nan)

  result = evaluate_windows(windows, mask, good, good)
  # Uniform logits over 5 tokens: NLL log 5 everywhere, PPL exactly 5.
  assert result.baseline.ppl == pytest.approx(5.0, rel=1e-6)
  assert result.quant.ppl == pytest.approx(5.0, rel=1e-6)
  assert result.kl_mean == 0.0 and result.top1_agreement == 1.0
  with pytest.raises(FloatingPointError, match=r"2 of 14 token NLLs are not "
                     r"finite: the model produced NaN/Inf logits"):
    evaluate_windows(windows, mask, good, bad)
  with pytest.raises(FloatingPointError, match="NaN/Inf logits"):
    evaluate_windows(windows, mask, bad)
