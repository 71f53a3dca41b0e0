"""SelectiveLayerCache: exact against the real caches, choices as data."""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp
import numpy as np
import pytest

from kvq_jax.cache.key_affine import KeyAffine
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.facade import LoadedModel, window_forward
from kvq_jax.models.params import decoder_from_params, random_params
from kvq_jax.models.rope import Rope
from kvq_jax.quant import QuantSpec
from kvq_jax.research.selective_cache import (SelectiveLayerCache,
                                              SelectiveSpec, layer_specs)
from kvq_jax.research.selective_forward import SelectiveForward
from tests.cache.tiny_setup import transform_affine
from tests.models.tiny import TINY


CONFIG = TINY  # 2 layers, K=2 kv heads, H=16.
INT4_G8 = QuantSpec("int4", "symmetric", "per_group", 8)
INT2_G8_ASYM = QuantSpec("int2", "asymmetric", "per_group", 8)
INT8 = QuantSpec("int8", "symmetric", "per_token")
T = 24
OFF = [0, 0]

# Layer 1 overrides the format, so per-layer candidates differ.
POST = CacheSpec(k=INT4_G8, v=INT4_G8, layer_overrides=((1, None, INT8),))
PRE = CacheSpec(k=INT4_G8, v=INT2_G8_ASYM, key_rope="pre", hadamard_k=True,
                hadamard_v=True)
# Issue 14's formats: Lloyd-Max codes, seeded randomised Hadamard, a
# calibrated-style key affine per layer.
LM = CacheSpec(
    k=QuantSpec("int4", "lloyd_max", "per_token"),
    v=QuantSpec("int3", "lloyd_max", "per_token"), key_rope="pre",
    hadamard_k=True, hadamard_v=True, rotation_seed=4,
    key_affines=tuple(KeyAffine.from_arrays(
        np.full((2, 16), 0.1 * i), np.linspace(0.5, 1.5, 32).reshape(2, 16))
                      for i in range(2)))
# KVQuant-style: static keys in calibrated ranges with an outlier per vector,
# two bfloat16 sink tokens (rotated values: the sink path rotates too).
KQ = CacheSpec(
    k=QuantSpec("int3", "static", "per_token", outliers=1),
    v=QuantSpec("int4", "asymmetric", "per_group", 8, outliers=1),
    sink=2, hadamard_v=True, rotation_seed=2,
    key_rope="pre", key_affines=tuple(KeyAffine.from_arrays(
        np.full((2, 16), 0.05 * i), np.linspace(0.2, 0.6, 32).reshape(2, 16),
        mode="range") for i in range(2)))
# KIVI-style: per-channel keys over 4-token groups, a 2-token residual and
# four sinks (T = 24: Q_k(n) = 4 + 4 floor((n - 6) / 4), so queries read
# keys from storage, the mixed segment, the window and the sinks).
PC4 = QuantSpec("int2", "asymmetric", "per_channel", 4)
KIVI = CacheSpec(k=PC4, v=INT2_G8_ASYM, residual=2, sink=4)
# Token-local formats committed in flush blocks of 8 (Hadamard on V).
FLUSH = CacheSpec(k=INT4_G8, v=INT4_G8, flush_block=8, hadamard_v=True,
                  rotation_seed=1)
# Issue 14's method 4: the same with a calibrated-style rotation per head.
KQ_ROT = dataclasses.replace(KQ, key_affines=tuple(
    KeyAffine.from_arrays(*a.arrays(), mode="range",
                          rotation_KxHxH=np.stack([np.linalg.qr(
                              np.random.default_rng(i).standard_normal(
                                  (16, 16)))[0]] * 2))
    for i, a in enumerate(KQ.key_affines)))


@functools.lru_cache(maxsize=None)
def decoder():
  return decoder_from_params(CONFIG, random_params(CONFIG, seed=3, scale=0.2))


@functools.lru_cache(maxsize=None)
def forward(name: str) -> SelectiveForward:
  """Choice 1: the preset's own format; 2: int8 K / int2_g8_asym V."""
  spec = {"post": POST, "pre": PRE, "lm": LM, "kq": KQ,
          "kq_rot": KQ_ROT, "kivi": KIVI, "flush": FLUSH}[name]
  return SelectiveForward(decoder(), layer_specs(
      CONFIG, spec, extra_k=(INT8,), extra_v=(INT2_G8_ASYM,)))


def tokens(batch=2, seed=0):
  return np.random.default_rng(seed).integers(
      0, CONFIG.vocab_size, (batch, T)).astype(np.int32)


@functools.lru_cache(maxsize=None)
def _real_logits(spec: CacheSpec | None, ids_bytes: bytes, shape):
  ids = np.frombuffer(ids_bytes, np.int32).reshape(shape)
  model = LoadedModel(decoder=decoder(), tokenizer=None, source="tiny")
  return np.asarray(window_forward(model, spec, "float32")(ids))


def real_logits(spec: CacheSpec | None, ids):
  """The real caches' logits (memoized: one compile per spec and ids)."""
  ids = np.ascontiguousarray(ids, np.int32)
  return _real_logits(spec, ids.tobytes(), ids.shape)


# KQ itself is not a case here (one real-cache compile less): its keys
# (choice 1, no rotation) are test_sinks_with_keys_quantized_..., its values
# and both together the kq_rot case (KQ plus a rotation).
@pytest.mark.parametrize("name, choice, real", [
    ("post", 1, POST),
    ("pre", 1, PRE),
    ("lm", 1, LM),
    ("kq_rot", 1, KQ_ROT),
    ("kivi", 1, KIVI),
    ("flush", 1, FLUSH),
])
def test_all_choices_on_match_the_real_quantized_cache(name, choice, real):
  ids = tokens()
  got = np.asarray(forward(name)(ids, [choice] * 2, [choice] * 2))
  want = real_logits(real, ids)
  np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
  base = real_logits(None, ids)
  assert np.abs(want - base).max() > 1e-2  # The quantization is visible.


def test_all_choices_off_match_the_dense_cache():
  ids = tokens()
  for name in ("post", "pre"):
    got = np.asarray(forward(name)(ids, OFF, OFF))
    np.testing.assert_allclose(got, real_logits(None, ids), atol=1e-5,
                               rtol=0)


def test_one_layer_on_changes_only_that_layer_and_later():
  ids = tokens()
  _, off = forward("post").with_cache(ids, OFF, OFF)
  for layer in range(CONFIG.num_layers):
    choice = [int(i == layer) for i in range(CONFIG.num_layers)]
    _, on = forward("post").with_cache(ids, choice, choice)
    for i in range(CONFIG.num_layers):
      same = all(np.array_equal(np.asarray(getattr(on[i], field)),
                                np.asarray(getattr(off[i], field)))
                 for field in ("k_BxSxKxH", "v_BxSxKxH"))
      assert same == (i < layer), (layer, i)


def test_sweep_does_not_recompile():
  ids = tokens()
  fwd = forward("pre")  # Every layer quantizes K and V (no fp override).
  fwd(ids, OFF, OFF)
  traces = fwd.num_traces
  outs = []
  for layer in range(CONFIG.num_layers):
    for choice in (1, 2):
      k = [choice if i == layer else 0 for i in range(CONFIG.num_layers)]
      outs.append(np.asarray(fwd(ids, k, OFF)))
      outs.append(np.asarray(fwd(ids, k, k)))
    # V choice 2 (int2_g8_asym) repeats PRE's own V format: choice 1 only.
    v = [int(i == layer) for i in range(CONFIG.num_layers)]
    outs.append(np.asarray(fwd(ids, OFF, v)))
  assert fwd.num_traces == traces
  assert len({o.tobytes() for o in outs}) == len(outs)  # All distinct.
  fwd(tokens(batch=1), [1, 1], [1, 1])  # A new batch shape traces.
  assert fwd.num_traces == traces + 1


@pytest.mark.parametrize("k_choice, v_choice, real", [
    # K per-channel and V full precision: V keeps its window in bfloat16.
    ([1, 1], [0, 0], dataclasses.replace(KIVI, v=None)),
    # Layer 0 quantized, layer 1 full precision (a dense layer).
    ([1, 0], [1, 0], dataclasses.replace(
        KIVI, layer_overrides=((1, None, None),))),
])
def test_kivi_mixes_match_the_real_cache(k_choice, v_choice, real):
  ids = tokens()
  got = np.asarray(forward("kivi")(ids, k_choice, v_choice))
  np.testing.assert_allclose(got, real_logits(real, ids), atol=1e-4, rtol=0)


def test_per_channel_extra_format_on_a_token_local_base():
  """--formats=int2_pc8_asym on an int4_g8 preset: the probe of K in the
  per-channel format (F = 8 tokens, up to 7 keys in bfloat16) is the real
  cache with that K (the probe refused per-channel formats before)."""
  extra = QuantSpec("int2", "asymmetric", "per_channel", 8)
  base = CacheSpec(k=INT4_G8, v=INT4_G8)
  probe = SelectiveForward(decoder(), layer_specs(CONFIG, base,
                                                  extra_k=(extra,)))
  ids = tokens()
  got = np.asarray(probe(ids, [2, 2], [1, 1]))
  want = real_logits(dataclasses.replace(base, k=extra), ids)
  np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
  assert np.abs(got - np.asarray(probe(ids, [1, 1], [1, 1]))).max() > 1e-3


def test_unemulable_formats_raise():
  with pytest.raises(ValueError, match="axis"):
    SelectiveSpec(k_formats=(dataclasses.replace(PC4, axis=-1),),
                  v_formats=())
  with pytest.raises(ValueError, match="flush_block=2"):
    SelectiveSpec(k_formats=(dataclasses.replace(PC4, axis=-2),),
                  v_formats=(), flush_block=2)
  with pytest.raises(ValueError, match="granularity"):
    SelectiveSpec(k_formats=(QuantSpec("int8", "symmetric", "per_tensor"),),
                  v_formats=())


def test_a_second_attend_raises():
  spec = SelectiveSpec(k_formats=(INT4_G8,), v_formats=(INT4_G8,))
  cache = SelectiveLayerCache.create(spec, 1, 8, 2, 16, 1, 1)
  assert not cache.written
  q = jnp.zeros((1, 1, 2, 16))
  pos = jnp.zeros((1, 1), jnp.int32)
  rope = Rope(theta=10000.0, rotary_dim=16)
  _, written = cache.attend(q, q, q, pos, rope)
  assert written.written
  with pytest.raises(ValueError, match="called once"):
    written.attend(q, q, q, pos, rope)


def test_bad_choice_raises():
  spec = SelectiveSpec(k_formats=(INT4_G8,), v_formats=(INT4_G8,))
  with pytest.raises(ValueError, match="k_choice=2"):
    SelectiveLayerCache.create(spec, 1, 8, 2, 16, k_choice=2)
  with pytest.raises(ValueError, match="v_choice_L"):
    forward("post")(tokens(), OFF, [0, 5])


def test_sliding_window_layers_match_the_real_ring_caches():
  """A local layer's band (window 5 < T = 24) is honoured by the probe."""
  config = dataclasses.replace(CONFIG, sliding_window=5, local_layers=(0,))
  local = decoder_from_params(config, random_params(config, seed=3,
                                                    scale=0.2))
  ids = tokens()
  model = LoadedModel(decoder=local, tokenizer=None, source="tiny-local")
  for base in (POST, KIVI):  # KIVI: per-channel keys, residual, no sinks.
    probe = SelectiveForward(local, layer_specs(config, base))
    for choice, spec in ((1, base), (0, None)):
      got = np.asarray(probe(ids, [choice] * 2, [choice] * 2))
      want = np.asarray(window_forward(model, spec, "float32")(ids))
      np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
  # The window matters: the same weights without it give other logits.
  assert np.abs(got - real_logits(None, ids)).max() > 1e-3


def test_sinks_with_keys_quantized_and_values_full_precision():
  """K quantized, V choice 0: the real cache keeps a plain V store, and its
  sink tokens of V still in bfloat16, as the selective cache does."""
  ids = tokens()
  got = np.asarray(forward("kq")(ids, [1, 1], [0, 0]))
  want = real_logits(dataclasses.replace(KQ, v=None), ids)
  np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
  no_sink = real_logits(dataclasses.replace(KQ, v=None, sink=0), ids)
  assert np.abs(want - no_sink).max() > 1e-3  # The sinks are visible.


@pytest.mark.parametrize("mode", ["transform", "range"])
def test_extra_static_keys_get_the_layers_widths_and_codebooks(mode):
  """An extra static-key format is probed as the layer stores it as an
  override: per-component widths and their codebooks under a transform
  affine (ca presets), the calibrated codebook under a range affine (kq).
  Before, the probe ran the bare uniform format (int4_st measured worse
  than the base int3_st on Qwen2.5-Coder-0.5B, 0.45 against 0.03 summed KL),
  and allocations built on it were wrong."""
  if mode == "transform":
    affines = tuple(transform_affine(seed=i, rotated=False) for i in range(2))
  else:
    books = {b: tuple(np.linspace(-0.9, 0.9, 2 ** b)) for b in (2, 3)}
    affines = tuple(KeyAffine.from_arrays(
        np.full((2, 16), 0.05 * i), np.linspace(0.2, 0.6, 32).reshape(2, 16),
        mode="range", codebooks=books) for i in range(2))
  st3, st2 = (QuantSpec(f"int{b}", "static", "per_token") for b in (3, 2))
  base = CacheSpec(k=st3, v=INT4_G8, key_rope="pre", key_affines=affines)
  specs = layer_specs(CONFIG, base, extra_k=(st2,))
  override = dataclasses.replace(base, layer_overrides=tuple(
      (i, st2, INT4_G8) for i in range(2)))
  for i in range(2):
    assert specs[i].k_formats[1] == override.layer(i).k
    assert specs[i].k_formats[1] != dataclasses.replace(
        st2, group_size=specs[i].k_formats[1].group_size)
  ids = tokens()
  got = np.asarray(SelectiveForward(decoder(), specs)(ids, [2, 2], [1, 1]))
  np.testing.assert_allclose(got, real_logits(override, ids), atol=1e-4,
                             rtol=0)
