"""Sliding-window (local) layers: ring-buffer caches against a banded reference.

A local layer of window W lets query token i see the tokens j with
i - W < j <= i. The reference is the very same cache kind without the ring:
the linear `DenseLayerCache` / `QuantizedLayerCache` (capacity for every
token) whose visibility is narrowed to that band (`BandDenseLayerCache`,
`BandQuantizedLayerCache` below; the quantized one with the spec's sinks
dropped, as on a local layer). The ring caches must give the same outputs on
a prefill longer than the window and on a long decode that wraps the ring
several times, and any chunking must equal token-by-token decode.

Layer-level tests (random q, k, v through `attend`) keep compilations small;
one model-level test runs a two-layer decoder with one local layer through
`init_cache` and `Runtime`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from configs.formats import kivi2, kivi4
from kvq_jax.cache import check_capacity, init_dense_cache
from kvq_jax.cache.attention import attention_mask, band_mask, gqa_attention
from kvq_jax.cache.dense import DenseLayerCache, write_slots
from kvq_jax.cache.factory import init_cache
from kvq_jax.cache.key_affine import KeyAffine
from kvq_jax.cache.quantized import QuantizedLayerCache
from kvq_jax.cache.sliding import SlidingDenseLayerCache, ring_tokens
from kvq_jax.cache.sliding_quantized import (SlidingQuantizedLayerCache,
                                             local_layer_spec, ring_slots)
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.models.config import ModelConfig
from kvq_jax.models.params import decoder_from_params, random_params
from kvq_jax.models.rope import Rope
from kvq_jax.models.runtime import Runtime
from kvq_jax.quant import QuantSpec
from kvq_jax.settings.experiment_settings import settings_from_config

B, K, N, H = 2, 2, 4, 16
TOTAL = 40  # Tokens fed: five wraps of an 8-token window.
CAPACITY = 48  # The linear references' capacity.
ROPE = Rope(theta=10000.0, rotary_dim=H)
# Chunks of two sizes (each size compiles once), two longer than any window
# below (the first from an empty ring, the last mid-ring); the small one
# starts mid-ring (token 19) and crosses no wrap or one, depending on the
# window.
CHUNKS = (19, 2, 19)
assert sum(CHUNKS) == TOTAL


def _q(fmt, scheme="symmetric", granularity="per_token", group=None):
  return QuantSpec(fmt, scheme, granularity, group)


INT4_G8 = _q("int4", granularity="per_group", group=8)
INT8 = _q("int8")
FP8 = _q("fp8_e4m3")
INT2_PC4_ASYM = _q("int2", "asymmetric", "per_channel", 4)
INT4_PC4_ASYM = _q("int4", "asymmetric", "per_channel", 4)
INT2_G8_ASYM = _q("int2", "asymmetric", "per_group", 8)

# name -> (window W, CacheSpec or None for the dense cache).
# KIVI-style: per-channel K over 4-token groups (F_k = 4), per-group V
# (F_v = 1), residual 2: the mixed segment (K full precision, V not). Its
# ring is checked through the model (MODEL_SPECS) and kivi_r8_w6 below,
# not as a CASES entry of its own (CI budget).
KIVI_PC4_R2 = CacheSpec(k=INT2_PC4_ASYM, v=INT2_G8_ASYM, residual=2)
CASES = {
    "dense": (7, None),
    "int4_g8": (8, CacheSpec(k=INT4_G8, v=INT4_G8)),
    # Static keys in calibrated ranges with an outlier per vector (codes and
    # outliers, no scale, on the ring), fp8 values.
    "static_outliers_fp8v": (8, CacheSpec(
        k=QuantSpec("int4", "static", "per_token", outliers=1), v=FP8,
        key_rope="pre", key_affines=(KeyAffine.from_arrays(
            np.zeros((K, H)), np.linspace(0.5, 2.0, K * H).reshape(K, H),
            mode="range"),))),
    # Pre-RoPE Hadamard keys, sinks (dropped on the local layer), a residual
    # flushed in blocks of 4.
    "pre_rope_hadamard_sinks": (6, CacheSpec(
        k=INT4_G8, v=INT8, sink=4, residual=3, flush_block=4, key_rope="pre",
        hadamard_k=True, hadamard_v=True)),
    # Per-channel K, a plain full-precision V store; the residual covers
    # most of the window.
    "k_only_pc4_r5": (7, CacheSpec(k=INT4_PC4_ASYM, v=None, residual=5)),
    # W <= R: every visible token is still full precision; the rings (one
    # group) are never read.
    "kivi_r8_w6": (6, CacheSpec(k=INT2_PC4_ASYM, v=INT2_G8_ASYM,
                                residual=8)),
    # Lloyd-Max codes after a seeded randomised Hadamard, pre-RoPE keys with
    # a key affine (issue 14's formats) on a ring.
    "lloyd_rotated_affine": (7, CacheSpec(
        k=_q("int4", "lloyd_max"), v=_q("int3", "lloyd_max"), residual=2,
        key_rope="pre", hadamard_k=True, hadamard_v=True, rotation_seed=1,
        key_affines=(KeyAffine.from_arrays(
            np.linspace(-1, 1, K * H).reshape(K, H),
            np.linspace(0.5, 2.0, K * H).reshape(K, H)),))),
}
ATOL = 2e-5


@struct.dataclass
class BandDenseLayerCache(DenseLayerCache):
  """Reference: the linear dense cache, attention narrowed to the band."""

  band: int = struct.field(pytree_node=False, default=1)

  def attend(self, q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, positions_BxT, rope):
    t = q_BxTxNxH.shape[1]
    k_all = write_slots(self.k_BxSxKxH, rope(k_BxTxKxH, positions_BxT),
                        self.length_B)
    v_all = write_slots(self.v_BxSxKxH, v_BxTxKxH, self.length_B)
    mask = attention_mask(self.length_B, t, self.capacity, window=self.band)
    return gqa_attention(q_BxTxNxH, k_all, v_all, mask), self.replace(
        k_BxSxKxH=k_all, v_BxSxKxH=v_all, length_B=self.length_B + t)


@struct.dataclass
class BandQuantizedLayerCache(QuantizedLayerCache):
  """Reference: the linear quantized cache, every segment's mask narrowed
  to the band (the XLA path: the Pallas kernel does not read `_visible`).

  `band` is data (an int32 leaf), not a static field: with band >= every
  token's index it is the plain causal cache, from the same compiled
  program as the banded reference (one compile less per case)."""

  band: jax.Array = 1

  def _visible(self, key_tok_BxL, query_tok_BxT):
    return band_mask(key_tok_BxL, query_tok_BxT, self.band)


def _band(window: int) -> jax.Array:
  return jnp.asarray(window, jnp.int32)


def _caches(name: str):
  """(ring cache, banded linear reference, causal linear cache)."""
  window, spec = CASES[name]
  if spec is None:
    ring = SlidingDenseLayerCache.create(B, CAPACITY, K, H,
                                         sliding_window=window)
    linear = DenseLayerCache.create(B, CAPACITY, K, H)
    return ring, BandDenseLayerCache.create(B, CAPACITY, K, H).replace(
        band=window), linear
  layer = local_layer_spec(spec.layer(0))
  ring = SlidingQuantizedLayerCache.create(spec.layer(0), B, CAPACITY, K, H,
                                           sliding_window=window)
  assert ring.spec == layer
  reference = BandQuantizedLayerCache.create(layer, B, CAPACITY, K, H)
  # A band wider than the capacity: every earlier token visible (causal).
  return (ring, reference.replace(band=_band(window)),
          reference.replace(band=_band(CAPACITY)))


@functools.lru_cache(maxsize=None)
def _inputs(seed: int = 0, total: int = TOTAL):
  rng = np.random.default_rng(seed)
  x = lambda heads: jnp.asarray(rng.standard_normal((B, total, heads, H)),
                                jnp.float32)
  return x(N), x(K), x(K)


@jax.jit
def _attend(cache, q, k, v, positions):
  return cache.attend(q, k, v, positions, ROPE)


def _run(cache, chunks, seed: int = 0):
  """Feeds the inputs in `chunks`; (outputs [B, TOTAL, N, H], cache)."""
  q, k, v = _inputs(seed, sum(chunks))
  outs, pos = [], 0
  for size in chunks:
    positions = jnp.broadcast_to(jnp.arange(pos, pos + size), (B, size))
    out, cache = _attend(cache, q[:, pos:pos + size], k[:, pos:pos + size],
                         v[:, pos:pos + size], positions)
    outs.append(np.asarray(out))
    pos += size
  return np.concatenate(outs, axis=1), cache


@functools.lru_cache(maxsize=None)
def _outputs(name: str) -> dict[str, np.ndarray]:
  # Compiles count here (CI budget): the ring's prefill longer than the
  # window is CHUNKS' first chunk (19 tokens from an empty ring), not a
  # separate 40-token program, and the reference runs as one prefill (its
  # own prefill == decode is tests/cache/test_streaming_consistency.py's).
  ring, reference, linear = _caches(name)
  return {
      "ring_decode": _run(ring, (1,) * TOTAL)[0],
      "ring_chunks": _run(ring, CHUNKS)[0],
      "reference_prefill": _run(reference, (TOTAL,))[0],
      "causal_prefill": _run(linear, (TOTAL,))[0],
  }


@pytest.mark.parametrize("name", list(CASES))
def test_ring_matches_banded_reference(name):
  out = _outputs(name)
  window = CASES[name][0]
  np.testing.assert_allclose(out["ring_chunks"], out["reference_prefill"],
                             atol=ATOL, rtol=0)
  np.testing.assert_allclose(out["ring_decode"], out["reference_prefill"],
                             atol=ATOL, rtol=0)
  # The band matters: past the window the causal cache sees more tokens.
  causal, banded = out["causal_prefill"], out["reference_prefill"]
  np.testing.assert_allclose(causal[:, :window], banded[:, :window],
                             atol=ATOL, rtol=0)
  assert np.abs(causal[:, window:] - banded[:, window:]).max() > 1e-2


@pytest.mark.parametrize("name", list(CASES))
def test_chunked_prefill_equals_token_by_token(name):
  out = _outputs(name)
  np.testing.assert_allclose(out["ring_chunks"], out["ring_decode"],
                             atol=ATOL, rtol=0)


def test_ragged_batch_matches_single_sequences():
  """Sequences at different lengths in one batch (rings at different
  phases): concatenate two B=1 caches, decode, compare with each alone."""
  window, spec = CASES["k_only_pc4_r5"]
  make = lambda: SlidingQuantizedLayerCache.create(spec.layer(0), 1,
                                                   CAPACITY, K, H,
                                                   sliding_window=window)
  q, k, v = _inputs(seed=3)
  step = lambda cache, b, i: _attend(
      cache, q[b:b + 1, i:i + 1], k[b:b + 1, i:i + 1], v[b:b + 1, i:i + 1],
      jnp.full((1, 1), i, jnp.int32))
  alone = [make(), make()]
  for b, length in enumerate((5, 19)):  # Decode steps: no prefill compiles.
    for i in range(length):
      _, alone[b] = step(alone[b], b, i)
  both = jax.tree_util.tree_map(lambda x, y: jnp.concatenate([x, y]), *alone)
  for i in range(12):
    outs = []
    for b, length in enumerate((5, 19)):
      out, alone[b] = step(alone[b], b, length + i)
      outs.append(out)
    tokens = jnp.asarray([5 + i, 19 + i])
    got, both = _attend(both, jnp.stack([q[0, 5 + i], q[1, 19 + i]])[:, None],
                        jnp.stack([k[0, 5 + i], k[1, 19 + i]])[:, None],
                        jnp.stack([v[0, 5 + i], v[1, 19 + i]])[:, None],
                        tokens[:, None])
    np.testing.assert_allclose(np.asarray(got),
                               np.concatenate([np.asarray(o) for o in outs]),
                               atol=ATOL, rtol=0)
  np.testing.assert_array_equal(np.asarray(both.length_B), [17, 31])


def test_quantization_is_active_on_the_ring():
  """The quantized rings really serve dequantized tokens (vs dense)."""
  dense = _outputs("dense")["ring_decode"]
  error = np.abs(_outputs("k_only_pc4_r5")["ring_decode"] - dense).max()
  assert error > 1e-2


def test_ring_state_after_wraps():
  """Ring slot r holds token j = r mod R (the newest), whatever the chunks."""
  cache = SlidingDenseLayerCache.create(B, CAPACITY, K, H, sliding_window=7)
  _, k, v = _inputs()
  for chunks in ((TOTAL,), CHUNKS):
    _, ring = _run(cache, chunks)
    tokens = np.asarray(ring_tokens(jnp.int32(TOTAL), 7))
    np.testing.assert_array_equal(tokens, [35, 36, 37, 38, 39, 33, 34])
    np.testing.assert_array_equal(np.asarray(ring.v_BxRxKxH),
                                  np.asarray(v)[:, tokens])
    np.testing.assert_array_equal(np.asarray(ring.length_B), [TOTAL] * B)


def test_dense_window_2_by_hand():
  """W = 2, four tokens, against numpy: query i sees tokens i - 1 and i."""
  rng = np.random.default_rng(7)
  q = rng.standard_normal((1, 4, 1, 2)).astype(np.float32)
  k = rng.standard_normal((1, 4, 1, 2)).astype(np.float32)
  v = rng.standard_normal((1, 4, 1, 2)).astype(np.float32)
  want = np.zeros((4, 2))
  for i in range(4):
    seen = [j for j in (i - 1, i) if j >= 0]
    logits = np.array([q[0, i, 0] @ k[0, j, 0] for j in seen]) / np.sqrt(2)
    p = np.exp(logits - logits.max())
    want[i] = (p / p.sum()) @ v[0, seen, 0]
  rope = Rope(theta=10000.0, rotary_dim=2)
  # Jitted: two small programs compile faster than op-by-op dispatch.
  attend = jax.jit(lambda c, *args: c.attend(*args, rope))
  zeros = jnp.zeros((1, 4), jnp.int32)  # Position 0: RoPE is the identity.
  cache = SlidingDenseLayerCache.create(1, 4, 1, 2, sliding_window=2)
  got, ring = attend(cache, *map(jnp.asarray, (q, k, v)), zeros)
  np.testing.assert_allclose(np.asarray(got)[0, :, 0], want, rtol=1e-5,
                             atol=1e-6)
  steps = cache
  for i in range(4):
    out, steps = attend(steps, q[:, i:i + 1], k[:, i:i + 1], v[:, i:i + 1],
                        zeros[:, :1])
    np.testing.assert_allclose(np.asarray(out)[0, 0, 0], want[i], rtol=1e-5,
                               atol=1e-6)
  for final in (ring, steps):  # Tokens 2 and 3 in slots 0 and 1.
    np.testing.assert_array_equal(np.asarray(final.k_BxRxKxH)[0, :, 0],
                                  k[0, 2:4, 0])
    np.testing.assert_array_equal(np.asarray(final.length_B), [4])


# -- init_cache, capacity, bytes ----------------------------------------------

LH = 32  # head_dim of LOCAL: the presets' 32-wide groups fit.
LOCAL = ModelConfig(vocab_size=97, hidden_size=64, intermediate_size=128,
                    num_layers=3, num_heads=N, num_kv_heads=K, head_dim=LH,
                    sliding_window=8, local_layers=(0, 2))
GLOBAL = dataclasses.replace(LOCAL, sliding_window=None, local_layers=())
KIVI2 = settings_from_config(kivi2.get_config()).cache_spec
KIVI4 = settings_from_config(kivi4.get_config()).cache_spec
BYTE_SPECS = {
    "dense": None,
    "int4_g8": CacheSpec(k=INT4_G8, v=INT4_G8),
    "kivi2_preset": KIVI2,
    "kivi4_preset": KIVI4,
    "pre_rope_hadamard_sinks": CASES["pre_rope_hadamard_sinks"][1],
    "fp8_mixed_fp_layer": CacheSpec(k=FP8, v=INT8,
                                    layer_overrides=((2, None, None),)),
}


def _nbytes(tree) -> int:
  return sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize
             for x in jax.tree_util.tree_leaves(tree))


def _abstract(config, capacity, spec, batch=1):
  return jax.eval_shape(lambda: init_cache(config, batch, capacity, spec))


@pytest.mark.parametrize("name", list(BYTE_SPECS))
def test_local_layer_bytes_do_not_grow_with_capacity(name):
  spec = BYTE_SPECS[name]
  small, large = _abstract(LOCAL, 64, spec), _abstract(LOCAL, 8192, spec)
  for i in (0, 2):  # Local layers: the same leaves whatever the capacity.
    assert isinstance(small[i], (SlidingDenseLayerCache,
                                 SlidingQuantizedLayerCache))
    assert small[i].sliding_window == 8
    assert [x.shape for x in jax.tree_util.tree_leaves(small[i])] == \
        [x.shape for x in jax.tree_util.tree_leaves(large[i])]
    assert _nbytes(small[i]) == _nbytes(large[i])
  # The global layer grows: >= 2 bits per K/V element of every added slot
  # (capacity 64 -> 8192; a quantized one allocates whole 256-slot blocks).
  assert _nbytes(large[1]) - _nbytes(small[1]) >= (
      (8192 - 256) * 2 * K * LH * 2 / 8)
  # O(W + full-precision window): per tensor at most W + R + F - 1 tokens
  # (R <= 128, F <= 32 here) plus a group of rounding, at 4 bytes per
  # element (float32, the widest dtype here), doubled for scales and zeros.
  bound = 2 * (8 + 128 + 31 + 32) * K * LH * 4 * 2
  assert _nbytes(large[0]) <= bound


def test_ring_sizes():
  layer = KIVI2.layer(0)  # K per-channel g32 (F 32), V per-group (F 1), R 128.
  assert ring_slots(layer, "k", 512) == 384 and ring_slots(layer, "v", 512) \
      == 384
  assert ring_slots(layer, "k", 100) == 32  # W <= R: one group, never read.
  int4 = CacheSpec(k=INT4_G8, v=INT4_G8).layer(0)
  assert ring_slots(int4, "k", 512) == 512
  assert ring_slots(local_layer_spec(
      CASES["pre_rope_hadamard_sinks"][1].layer(0)), "k", 6) == 3


@pytest.mark.parametrize("spec", [None, CacheSpec(k=INT4_G8, v=INT8),
                                  CacheSpec(k=FP8, v=FP8, sink=2, residual=4,
                                            layer_overrides=((1, None,
                                                              None),))],
                         ids=["dense", "int4_int8", "fp8_sink_fp_layer"])
def test_config_without_local_layers_builds_todays_caches(spec):
  got = init_cache(GLOBAL, 2, 40, spec)
  for i, layer in enumerate(got):
    layer_spec = None if spec is None else spec.layer(i)
    if layer_spec is None or layer_spec.is_full_precision:
      want = DenseLayerCache.create(2, 40, K, LH)
    else:
      want = QuantizedLayerCache.create(layer_spec, 2, 40, K, LH)
    assert type(layer) is type(want)
    assert jax.tree_util.tree_structure(layer) == \
        jax.tree_util.tree_structure(want)
    for a, b in zip(jax.tree_util.tree_leaves(layer),
                    jax.tree_util.tree_leaves(want)):
      assert a.shape == b.shape and a.dtype == b.dtype
  dense = init_dense_cache(GLOBAL, 2, 40)
  assert all(type(layer) is DenseLayerCache for layer in dense)


def test_init_dense_cache_rings_on_local_layers():
  cache = init_dense_cache(LOCAL, 2, 40, jnp.bfloat16)
  assert [type(c).__name__ for c in cache] == [
      "SlidingDenseLayerCache", "DenseLayerCache", "SlidingDenseLayerCache"]
  assert cache[0].k_BxRxKxH.shape == (2, 8, K, LH)
  assert cache[0].dtype == jnp.bfloat16 and cache[0].capacity == 40


def test_local_layer_spec_drops_sinks_and_sizes_windows():
  spec = CASES["pre_rope_hadamard_sinks"][1]
  cache = init_cache(LOCAL, 1, 40, spec)
  assert cache[0].spec.sink == 0 and cache[1].spec.sink == 4
  assert cache[0].spec == local_layer_spec(spec.layer(0))
  # Window R + F - 1 = 3 + 3 tokens per tensor, no sink buffer at all.
  assert cache[0].window_k.shape == (1, K, 6, LH)
  assert not hasattr(cache[0], "sink_k")


def test_check_capacity_skips_local_layers():
  cache = init_dense_cache(LOCAL, 1, 5)
  cache = [layer.replace(length_B=jnp.asarray([1000], jnp.int32))
           if i != 1 else layer for i, layer in enumerate(cache)]
  check_capacity(cache, 5)  # Local layers far past "capacity": fine.
  with pytest.raises(ValueError, match="layer 1"):
    check_capacity(cache, 6)
  all_local = dataclasses.replace(LOCAL, local_layers=(0, 1, 2))
  cache = [layer.replace(length_B=jnp.asarray([1000], jnp.int32))
           for layer in init_cache(all_local, 1, 5, KIVI2)]
  check_capacity(cache, 10**6)


def test_bad_window_rejected():
  with pytest.raises(ValueError, match="sliding_window=0"):
    SlidingDenseLayerCache.create(1, 8, 1, 8, sliding_window=0)
  with pytest.raises(ValueError, match="sliding_window=True"):
    SlidingQuantizedLayerCache.create(CacheSpec(k=INT8, v=INT8).layer(0), 1,
                                      8, 1, 8, sliding_window=True)


# -- Pallas dispatch ----------------------------------------------------------

INT4_G32 = _q("int4", granularity="per_group", group=32)


def _decode_jaxpr(cache) -> str:
  q, k, v = (jnp.zeros((1, 1, heads, 32)) for heads in (2, 1, 1))
  return str(jax.make_jaxpr(lambda c: c.attend(
      q, k, v, jnp.zeros((1, 1), jnp.int32), Rope(10000.0, 32))[0])(cache))


def test_explicit_pallas_on_local_layer_raises():
  config = dataclasses.replace(LOCAL, num_heads=2, num_kv_heads=1,
                               head_dim=32)
  spec = CacheSpec(k=INT4_G32, v=INT4_G32, attention_impl="pallas")
  with pytest.raises(ValueError,
                     match="attention_impl='pallas'.*sliding-window.*ring"):
    init_cache(config, 1, 64, spec)
  # A cache whose spec was switched afterwards fails at the decode step.
  cache = init_cache(config, 1, 64, dataclasses.replace(
      spec, attention_impl="xla"))[0]
  cache = cache.replace(spec=dataclasses.replace(cache.spec,
                                                 attention_impl="pallas"))
  with pytest.raises(ValueError, match="implementation='pallas'.*ring"):
    _decode_jaxpr(cache)


def test_pallas_tuple_falls_back_with_warning_on_local_layer():
  config = dataclasses.replace(LOCAL, num_heads=2, num_kv_heads=1,
                               head_dim=32)
  spec = CacheSpec(k=INT4_G32, v=INT4_G32, attention_impl=("pallas", "xla"),
                   interpret=True)
  cache = init_cache(config, 1, 64, spec)
  assert isinstance(cache[0], SlidingQuantizedLayerCache)
  with pytest.warns(UserWarning, match="'pallas' is unavailable.*ring"):
    got = _decode_jaxpr(cache[0])
  assert "pallas_call" not in got
  xla = cache[0].replace(spec=dataclasses.replace(cache[0].spec,
                                                  attention_impl="xla"))
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    assert _decode_jaxpr(xla) == got  # The very same program as XLA.
  # The global layer still uses the kernel.
  assert "pallas_call" in _decode_jaxpr(cache[1])


# -- A whole model: init_cache and Runtime --------------------------------------

MODEL = ModelConfig(vocab_size=97, hidden_size=64, intermediate_size=128,
                    num_layers=2, num_heads=N, num_kv_heads=K, head_dim=H,
                    sliding_window=8, local_layers=(0,))
MODEL_SPECS = {
    "dense": None,
    "kivi_pc4_r2": dataclasses.replace(KIVI_PC4_R2,
                                       window_dtype="float32"),
}


@functools.lru_cache(maxsize=None)
def _runtime():
  return Runtime(decoder_from_params(MODEL, random_params(MODEL, seed=5,
                                                          scale=0.1)))


def _model_run(cache, ids, chunks):
  rt, outs, pos = _runtime(), [], 0
  for size in chunks:
    if size == 1:
      logits, cache = rt.decode(ids[:, pos], cache)
      logits = logits[:, None]
    else:
      logits, cache = rt.prefill(ids[:, pos:pos + size], cache)
    outs.append(np.asarray(logits))
    pos += size
  return np.concatenate(outs, axis=1), cache


@pytest.mark.parametrize("name", list(MODEL_SPECS))
def test_model_with_a_local_layer(name):
  """Layer 0 local (a ring of 8), layer 1 global; the Runtime donates the
  cache, so every run starts from a fresh one."""
  spec = MODEL_SPECS[name]
  ids = jnp.asarray(np.random.default_rng(1).integers(0, 97, (B, TOTAL)),
                    jnp.int32)

  def fresh(reference: bool = False):
    cache = init_cache(MODEL, B, CAPACITY, spec)
    if not reference:
      return cache
    if spec is None:
      band = BandDenseLayerCache.create(B, CAPACITY, K, H).replace(band=8)
    else:
      band = BandQuantizedLayerCache.create(
          local_layer_spec(spec.layer(0)), B, CAPACITY, K, H).replace(
              band=_band(8))
    return [band, cache[1]]

  assert isinstance(fresh()[0], (SlidingDenseLayerCache,
                                 SlidingQuantizedLayerCache))
  want, _ = _model_run(fresh(reference=True), ids, (TOTAL,))
  # Prefills longer than the window (from an empty ring and mid-ring) and
  # decode steps between them: the ring's one-prefill case is the layer
  # tests' (one model compile less).
  got, final = _model_run(fresh(), ids, (19, 1, 1, 19))
  np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
  np.testing.assert_array_equal(np.asarray(final[0].length_B), [TOTAL] * B)
