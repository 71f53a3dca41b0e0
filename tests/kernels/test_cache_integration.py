"""The Pallas decode kernel inside QuantizedLayerCache (attention_impl).

A tiny two-layer decoder reads a prompt on the XLA path (token by token:
the decode step compiles anyway, a prefill would be one more compile per
case); the cache is then copied with `attention_impl="pallas"` and both
copies decode the same tokens.
The two paths read the same packed storage and differ only in float summation
order, so their logits must agree to ~1e-5 (atol 5e-5: the XLA path sums a
2/4-bit dot plane by plane, `quant.planes`; measured 3.7e-5 on 2 of 582
logits of the hadamard/sink_window case, 0 mismatches at 2e-5 with the
interleaved read). The kernel runs in the Pallas
interpreter here (interpret=True; on the cpu backend also the auto default).
Compiles dominate the run time, so each model case mixes two layer formats
(`layer_overrides`) and decodes 3 tokens.
"""

from __future__ import annotations

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from configs import base as base_config
from kvq_jax.cache.factory import init_cache
from kvq_jax.cache.quantized import QuantizedLayerCache, committed_end
from kvq_jax.cache.spec import CacheSpec, LayerSpec
from kvq_jax.models.config import ModelConfig
from kvq_jax.models.params import decoder_from_params, random_params
from kvq_jax.models.rope import Rope
from kvq_jax.models.runtime import Runtime
from kvq_jax.quant import QuantSpec
from kvq_jax.settings.experiment_settings import settings_from_config

ON_CPU = jax.default_backend() == "cpu"
CONFIG = ModelConfig(vocab_size=97, hidden_size=64, intermediate_size=128,
                     num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32,
                     rope_theta=10000.0, rms_norm_eps=1e-5)
CAPACITY = 128
BATCH = 2
PROMPT = 70  # KIVI (R=8, F=32, S=32): storage [32, 32) is empty at n0 = 70,
STEPS = 3    # then the block [32, 64) is flushed at n0 = 71.

INT4_G32 = QuantSpec("int4", "symmetric", "per_group", 32)
INT8_TOKEN = QuantSpec("int8", "symmetric", "per_token")
INT2_ASYM = QuantSpec("int2", "asymmetric", "per_group", 32)
KIVI_K = QuantSpec("int2", "asymmetric", "per_channel", 32,
                   scale_dtype="float32")

CASES = {
    # Layer 0 int4 g32 symmetric, layer 1 int8 per-token.
    "int4_g32_sym/int8_per_token": CacheSpec(
        k=INT4_G32, v=INT4_G32, block_size=32,
        layer_overrides=((1, INT8_TOKEN, INT8_TOKEN),)),
    # Layer 0 KIVI (per-channel int2 keys, g32 values), layer 1 int2 asym g32;
    # residual window of 8 and 32 sink tokens.
    "kivi/int2_asym_residual_sink": CacheSpec(
        k=KIVI_K, v=INT2_ASYM, residual=8, sink=32, block_size=32,
        layer_overrides=((1, INT2_ASYM, INT2_ASYM),)),
    # Hadamard-rotated K and V, 4 sinks, residual 4 flushed every 4 tokens;
    # layer 0 int4 g32 keys and int8 per-token values, layer 1 int4 g32.
    "hadamard/sink_window": CacheSpec(
        k=INT4_G32, v=INT8_TOKEN, sink=4, residual=4, flush_block=4,
        hadamard_k=True, hadamard_v=True, block_size=32,
        layer_overrides=((1, INT4_G32, INT4_G32),)),
}


@pytest.fixture(scope="module")
def runtime() -> Runtime:
  return Runtime(decoder_from_params(
      CONFIG, random_params(CONFIG, seed=7, scale=0.3)))


def _tokens(shape, seed):
  return jnp.asarray(np.random.default_rng(seed).integers(0, 97, shape),
                     jnp.int32)


def _with_impl(cache: list, **changes) -> list:
  """A copy of every layer cache with its LayerSpec fields changed."""
  return [c.replace(spec=dataclasses.replace(c.spec, **changes))
          for c in jax.tree.map(jnp.copy, cache)]


def _decode_both(runtime: Runtime, spec: CacheSpec, **pallas_changes):
  """Logits [STEPS, B, V] of the XLA cache and of its pallas copy."""
  cache_x = init_cache(CONFIG, BATCH, CAPACITY, spec)
  for token_B in _tokens((BATCH, PROMPT), 0).T:  # == a prefill (tests/cache).
    _, cache_x = runtime.decode(token_B, cache_x)
  cache_p = _with_impl(cache_x, **pallas_changes)
  steps = _tokens((STEPS, BATCH), 1)
  out_x, out_p = [], []
  for token_B in steps:
    logits_x, cache_x = runtime.decode(token_B, cache_x)
    logits_p, cache_p = runtime.decode(token_B, cache_p)
    out_x.append(np.asarray(logits_x))
    out_p.append(np.asarray(logits_p))
  return np.stack(out_x), np.stack(out_p), cache_x[0].spec


@pytest.mark.parametrize("name", list(CASES))
def test_pallas_decode_logits_match_xla(runtime, name):
  spec = CASES[name]
  assert spec.attention_impl == "xla"  # The default.
  want, got, layer = _decode_both(runtime, spec, attention_impl="pallas",
                                  interpret=True)
  # The kernel reads a non-empty storage segment at some compared step.
  n0 = PROMPT + np.arange(STEPS)
  assert np.any(np.asarray(committed_end(jnp.asarray(n0 + 1), layer))
                > layer.sink)
  assert np.abs(want).max() > 0.1  # Non-trivial logits.
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=5e-5)


ROPE = Rope(theta=10000.0, rotary_dim=32)


def _attend(cache, q, k, v, pos):
  """One jitted QuantizedLayerCache.attend (a fresh trace per call site)."""
  return jax.jit(lambda c, *a: c.attend(*a, ROPE))(cache, q, k, v, pos)


def _jaxpr(cache, q, k, v, pos) -> str:
  """The traced attend (dispatch runs at trace time; nothing compiles)."""
  return str(jax.make_jaxpr(lambda c, *a: c.attend(*a, ROPE)[0])(
      cache, q, k, v, pos))


def _inputs(batch, t, n=4, k=2, h=32, seed=3):
  """Random (q, k, v) [B, T, heads, H] of T new tokens."""
  rng = np.random.default_rng(seed)
  def x(heads):
    return jnp.asarray(rng.standard_normal((batch, t, heads, h)), jnp.float32)
  return x(n), x(k), x(k)


def _empty(spec: LayerSpec, t: int = 1, batch: int = 2):
  """A fresh layer cache and the arguments of T new tokens at 0..T-1."""
  cache = QuantizedLayerCache.create(spec, batch, 64, 2, 32)
  pos = jnp.broadcast_to(jnp.arange(t), (batch, t))
  return (cache, *_inputs(batch, t), pos)


def _with(cache, **changes):
  return cache.replace(spec=dataclasses.replace(cache.spec, **changes))


def test_decode_step_uses_the_kernel_and_prefill_does_not():
  spec = CacheSpec(k=INT4_G32, v=INT4_G32, sink=4, block_size=32,
                   attention_impl="pallas", interpret=True).layer(0)
  decode = _jaxpr(*_empty(spec))
  assert "pallas_call" in decode
  assert "pallas_call" not in _jaxpr(*_empty(spec, t=2))  # Prefill: XLA.
  assert "pallas_call" not in _jaxpr(*_empty(
      dataclasses.replace(spec, attention_impl="xla")))


def test_layer_attend_ragged_lengths_match_xla():
  """Sequences at different lengths (one still inside the sink) in a batch."""
  spec = CacheSpec(k=INT2_ASYM, v=INT4_G32, sink=8, residual=2, flush_block=2,
                   block_size=16).layer(0)
  cache = QuantizedLayerCache.create(spec, 3, 64, 2, 32)
  # 40 tokens in decode steps (== a prefill): the XLA step below is this
  # very program, so nothing compiles for the fill.
  xla_step = jax.jit(lambda c, *a: c.attend(*a, ROPE))
  q, k, v = _inputs(3, 40)
  for i in range(40):
    _, cache = xla_step(cache, q[:, i:i + 1], k[:, i:i + 1], v[:, i:i + 1],
                        jnp.full((3, 1), i, jnp.int32))
  # Per-sequence lengths: the storage segment [S, Q(n0 + 1)) the kernel reads
  # is [8, 38), [8, 22) and empty (n0 = 5 < S). The buffers are not a
  # streaming history for the rolled-back sequences, but both paths read
  # the same buffers, so they must agree.
  cache = cache.replace(length_B=jnp.array([40, 23, 5], jnp.int32))
  step = (*_inputs(3, 1, seed=4), cache.length_B[:, None])
  want, _ = xla_step(cache, *step)
  got, new_cache = _attend(
      _with(cache, attention_impl="pallas", interpret=True), *step)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(new_cache.length_B, [41, 24, 6])


def test_explicit_pallas_with_pre_rope_keys_raises():
  with pytest.raises(ValueError,
                     match="attention_impl='pallas'.*key_rope='pre'"):
    CacheSpec(k=INT4_G32, v=INT4_G32, key_rope="pre", attention_impl="pallas")
  # A LayerSpec built directly fails at trace time, saying why.
  spec = LayerSpec(k=INT4_G32, v=INT4_G32, key_rope="pre",
                   attention_impl="pallas", interpret=True)
  with pytest.raises(ValueError, match="implementation='pallas'.*RoPE"):
    _jaxpr(*_empty(spec))


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "int3"])
def test_explicit_pallas_with_unsupported_format_raises(fmt):
  spec = QuantSpec(fmt, "symmetric", "per_token")
  with pytest.raises(ValueError, match=f"format='{fmt}'"):
    CacheSpec(k=spec, v=spec, attention_impl="pallas")
  with pytest.raises(ValueError, match="one of k/v"):
    CacheSpec(k=INT4_G32, v=None, attention_impl="pallas")


@pytest.mark.parametrize("key_rope,k_spec,why", [
    ("pre", INT4_G32, "key_rope='pre'"),
    ("post", QuantSpec("fp8_e4m3", "symmetric", "per_token"), "fp8_e4m3"),
    ("post", QuantSpec("int3", "symmetric", "per_group", 32), "int3"),
])
def test_tuple_falls_back_to_xla_with_warning(key_rope, k_spec, why):
  spec = LayerSpec(k=k_spec, v=INT4_G32, key_rope=key_rope,
                   attention_impl=["pallas", "xla"], interpret=True)
  assert spec.attention_impl == ("pallas", "xla")
  cache, *step = _empty(spec)
  with pytest.warns(UserWarning, match=f"'pallas' is unavailable.*{why}"):
    got = _jaxpr(cache, *step)
  # The very same program as the XLA path.
  assert got == _jaxpr(_with(cache, attention_impl="xla"), *step)


@pytest.mark.skipif(not ON_CPU, reason="CPU-only behaviour.")
def test_interpret_auto_on_cpu_and_explicit_false_raises():
  cache, *step = _empty(LayerSpec(k=INT4_G32, v=INT4_G32,
                                  attention_impl="pallas"))
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    auto = _jaxpr(cache, *step)  # interpret=None -> the interpreter on CPU.
  assert "pallas_call" in auto and "interpret=True" in auto
  with pytest.raises(ValueError, match="only with interpret=True"):
    _jaxpr(_with(cache, interpret=False), *step)


@pytest.mark.parametrize("bad", ["triton", (), ("pallas", "cuda"), 3])
def test_bad_attention_impl_raises(bad):
  with pytest.raises(ValueError, match="attention_impl"):
    CacheSpec(k=INT4_G32, v=INT4_G32, attention_impl=bad)


def test_bad_interpret_raises():
  with pytest.raises(ValueError, match="interpret=1"):
    CacheSpec(k=INT4_G32, v=INT4_G32, interpret=1)


def test_spec_is_hashable_and_reaches_every_layer():
  spec = CacheSpec(k=INT4_G32, v=INT4_G32, attention_impl=["pallas", "xla"],
                   interpret=False,
                   layer_overrides=((1, INT8_TOKEN, INT8_TOKEN),))
  assert spec.attention_impl == ("pallas", "xla")
  assert hash(spec) == hash(dataclasses.replace(spec))
  for i in range(2):
    assert spec.layer(i).attention_impl == ("pallas", "xla")
    assert spec.layer(i).interpret is False


def test_runner_config_reaches_the_cache():
  config = base_config.get_config()
  config.cache.k.type = config.cache.v.type = "int"  # int4 g32 symmetric.
  config.attention.impl = "pallas"
  settings = settings_from_config(config)
  assert settings.cache_spec.attention_impl == "pallas"
  assert settings.cache_spec.layer(0).interpret is None  # Auto.
  config.cache.key_rope = "pre"
  with pytest.raises(ValueError, match="config.cache.*key_rope='pre'"):
    settings_from_config(config)
  assert isinstance(config, ml_collections.ConfigDict)
