"""The --config flag, the presets in configs/, and dotted overrides."""

from __future__ import annotations

from absl import flags
import pytest

from kvq_jax.cache.spec import CacheSpec
from kvq_jax.capacity.memory import cache_bytes, theoretical_bits
from kvq_jax.cli.config_flag import DEFINE_preset_config
from kvq_jax.settings.experiment_settings import settings_from_config
from kvq_jax.settings.presets import CONFIG_DIR, available_presets
from tests.fixtures.preset_specs import (load_preset, preset_settings,
                                        synthetic_key_stats)
from tests.fixtures.smollm2 import SMOLLM2

# Bits per element each preset's docstring promises at head_dim 64 (None:
# full precision, no CacheSpec).
PRESET_BITS = {
    "baseline": None, "bf16": None, "fp16": None,
    "fp8_e4m3": 8.25, "fp8_e5m2": 8.25, "int8": 8.25,
    "int4_g32": 4.5, "int4_g32_asym": 5.0, "int4_g128": 4.25,
    "int2_g32_asym": 3.0, "k8v4": 6.5, "kivi2": 3.0, "kivi4": 5.0,
    "kvq4": 5.0,
    # llama.cpp's cache types: float16 d (and m) per 32 elements.
    "q8_0": 8.5, "q4_0": 4.5, "q4_1": 5.0, "q5_0": 5.5, "q5_1": 6.0,
    # Measured here on SmolLM2's shapes (H=64): 27 layers at 5 bits, layers
    # 5, 11, 17 at int8 per token (8 + 16/64).
    "gemma3_int4_global8": (27 * 5.0 + 3 * 8.25) / 30,
    # Lloyd-Max codes + one bfloat16 scale per 64-element head vector; kvq4
    # keys (5.0) with int4_lm values (4.25).
    "tq4": 4.25, "tq3": 3.25, "tq2": 2.25, "kvq4_lmv": (5.0 + 4.25) / 2,
    # Allocated mixes of int5_lm..int2_lm (b + 0.25 bits): the allocator's
    # achieved means.
    "tqmix500": 4.9167, "tqmix425": 4.1667, "tqmix325": 3.1667,
    "tqmix250": 2.4167,
    # Static keys (no scale; kq3: + one bfloat16 outlier and its uint8 index
    # per 64-element vector) with int{b}_lm values.
    "kq4": (4.0 + 4.25) / 2, "kq3": (3.0 + 24 / 64 + 3.25) / 2,
    "kq4kl": (4.0 + 4.25) / 2, "kq4klcb": (4.0 + 4.25) / 2,
    # Allocated kq mixes: the allocator's achieved means.
    "kqmix325": 3.15, "kqmix250": 2.3979,
    # Transform-coded keys: b x 64 bits per key vector spread over its
    # components (8b bytes) with int{b}_lm values.
    "tc4": (4.0 + 4.25) / 2, "tc3": (3.0 + 3.25) / 2, "tc2": (2.0 + 2.25) / 2,
    # The same widths per native channel (no basis).
    "ca4": (4.0 + 4.25) / 2, "ca3": (3.0 + 3.25) / 2, "ca2": (2.0 + 2.25) / 2,
    # ca keys with allocated values (int4_vq / int3_lm / int2_vq: b + 0.25
    # with a bfloat16 scale, b + 0.125 with an 8-bit one, _se5m2).
    # cvmix325: K 20 layers at 3 bits, 10 at 4; V 8 int3_lm, 3 int4_vq, 8
    # int2_vq_se5m2, 10 int3_lm_se5m2, 1 int2_vq.
    "cvmix325": ((20 * 3.0 + 10 * 4.0) / 30
                 + (8 * 3.25 + 3 * 4.25 + 8 * 2.125 + 10 * 3.125 + 2.25) / 30
                 ) / 2,
    # cvmix250: K 16 layers at 2 bits, 13 at 3, 1 at 4; V 1 int4_vq, 4
    # int3_lm_se5m2, 25 int2_vq_se5m2.
    "cvmix250": ((16 * 2.0 + 13 * 3.0 + 4.0) / 30
                 + (4.25 + 4 * 3.125 + 25 * 2.125) / 30) / 2,
    # cvmix200: K 2 layers at 3 bits, 28 at 2; V 11 int2_vq_se5m2, 1
    # int3_lm, 5 int2_vq, 12 int1_vq_se5m2 (1.125), 1 int1_vq (1.25).
    "cvmix200": ((2 * 3.0 + 28 * 2.0) / 30
                 + (11 * 2.125 + 3.25 + 5 * 2.25 + 12 * 1.125 + 1.25) / 30
                 ) / 2,
    # The Gemma 3 presets (18 layers) on SmolLM2's 30: layers 18-29 keep
    # ca3's int3_st / int3_lm. gemma_cvmix325: K 3 int4_st, 14 int3_st, 1
    # int2_st; V 4 int3_lm, 2 int4_vq, 8 int3_lm_se5m2, 2 int4_vq_se5m2, 2
    # int2_vq_se5m2. gemma_cvmix250: K 1 int4_st, 7 int3_st, 10 int2_st; V
    # 11 int2_vq, 4 int3_lm, 3 int2_vq_se5m2. gemma_cvmix200: K 2 int3_st,
    # 16 int2_st; V 10 int2_vq, 1 int2_vq_se5m2, 4 int1_vq, 3
    # int1_vq_se5m2.
    "gemma_cvmix325": ((3 * 4.0 + 14 * 3.0 + 2.0 + 12 * 3.0) / 30
                       + (4 * 3.25 + 2 * 4.25 + 8 * 3.125 + 2 * 4.125
                          + 2 * 2.125 + 12 * 3.25) / 30) / 2,
    "gemma_cvmix250": ((4.0 + 7 * 3.0 + 10 * 2.0 + 12 * 3.0) / 30
                       + (11 * 2.25 + 4 * 3.25 + 3 * 2.125 + 12 * 3.25) / 30
                       ) / 2,
    "gemma_cvmix200": ((2 * 3.0 + 16 * 2.0 + 12 * 3.0) / 30
                       + (10 * 2.25 + 2.125 + 4 * 1.25 + 3 * 1.125
                          + 12 * 3.25) / 30) / 2,
    # The Qwen2.5-Coder-0.5B presets (24 layers): layers 24-29 keep ca3's
    # int3_st / int3_lm. qwen_cvmix425: K int4_st; V 21 int4_vq, 3
    # int4_vq_se5m2. qwen_cvmix325: K 1 int2_st, 19 int3_st, 4 int4_st; V 2
    # int3_lm, 18 int3_lm_se5m2, 2 int2_vq_se5m2, 2 int4_vq. qwen_cvmix250:
    # K 13 int2_st, 11 int3_st; V 18 int2_vq_se5m2, 4 int3_lm_se5m2, 1
    # int2_vq, 1 int3_lm. qwen_cvmix200: K int2_st; V 11 int2_vq_se5m2, 4
    # int2_vq, 9 int1_vq_se5m2.
    "qwen_cvmix425": ((24 * 4.0 + 6 * 3.0) / 30
                      + (21 * 4.25 + 3 * 4.125 + 6 * 3.25) / 30) / 2,
    "qwen_cvmix325": ((2.0 + 19 * 3.0 + 4 * 4.0 + 6 * 3.0) / 30
                      + (2 * 3.25 + 18 * 3.125 + 2 * 2.125 + 2 * 4.25
                         + 6 * 3.25) / 30) / 2,
    "qwen_cvmix250": ((13 * 2.0 + 11 * 3.0 + 6 * 3.0) / 30
                      + (18 * 2.125 + 4 * 3.125 + 2.25 + 3.25 + 6 * 3.25) / 30
                      ) / 2,
    "qwen_cvmix200": ((24 * 2.0 + 6 * 3.0) / 30
                      + (11 * 2.125 + 4 * 2.25 + 9 * 1.125 + 6 * 3.25) / 30
                      ) / 2,
}
# Fixed (capacity-independent) cache bytes per sequence, by hand: 30 layers x
# 3 KV heads x 64 dims x 2 bytes (bfloat16 full-precision regions) x the
# full-precision slots of K and V. KIVI (residual R=128, per-channel K groups
# of 32 so K flushes in blocks of F=32, token-local V flushes every token):
# K keeps R + 31 = 159 slots, V keeps R = 128. kvq4 (R=0): K 31, V 0.
# Every other preset quantizes each token as it is written: 0.
_PER_SLOT = 30 * 3 * 64 * 2
PRESET_FIXED_BYTES = {"kivi2": _PER_SLOT * (159 + 128),
                      "kivi4": _PER_SLOT * (159 + 128),
                      "kvq4": _PER_SLOT * 31,
                      # + the int4_lm V codebook (16 float32), once.
                      "kvq4_lmv": _PER_SLOT * 31 + 16 * 4}
# Fixed tables (the Lloyd-Max codebook of a b-bit 64-element group, the
# 256-codeword vector table) are one copy per model, however many layers
# and tensors use them. tq: K and V share the 2^b-entry float32 Lloyd-Max
# table (stored once); per layer the key affine's float32 shift and scale
# [3, 64].
for _b in (4, 3, 2):
  PRESET_FIXED_BYTES[f"tq{_b}"] = 2 ** _b * 4 + 30 * 2 * 3 * 64 * 4
# kq: the first token of K and V in bfloat16, the V codebook (once) and the
# key ranges (float32 centre and half-width [3, 64]) per layer.
# (The synthetic range stats of these tests carry no key codebook; kq4klcb's
# real stats add 16 float32 levels per layer.)
for _name, _b in (("kq4", 4), ("kq3", 3), ("kq4kl", 4), ("kq4klcb", 4)):
  PRESET_FIXED_BYTES[_name] = 2 * _PER_SLOT + 2 ** _b * 4 + 30 * 2 * 3 * 64 * 4


def _table_bytes(spec: CacheSpec) -> int:
  """One float32 copy of each distinct fixed table the layers use: 2^b
  Lloyd-Max levels, or 256 codewords of 8 // b elements (scheme vector)."""
  tables = {(s.scheme, s.bits) for i in range(30)
            for s in (spec.layer(i).k, spec.layer(i).v)
            if s.is_codebook and not s.levels and not s.component_bits}
  return sum(4 * (256 * (8 // b) if scheme == "vector" else 2 ** b)
             for scheme, b in tables)


def _mix_constants(spec: CacheSpec) -> int:
  """The fixed Lloyd-Max tables (once) + the key statistics per layer (+ the
  bfloat16 sink token of K and V)."""
  return (_table_bytes(spec) + 30 * 2 * 3 * 64 * 4
          + 2 * _PER_SLOT * spec.sink)


def test_available_presets_is_every_config_but_base():
  assert available_presets() == sorted(PRESET_BITS)


def _transform_constants(spec: CacheSpec, basis: bool,
                         affine_bytes: int = 4) -> int:
  """tc, ca and cvmix presets: the V tables (once); per layer the key mean
  and std [3, 64] (`affine_bytes` a value: float32, or float16 for the
  cvmix presets), tc's basis as int8 [3, 64, 64] with a float32 scale
  per row (ca has none), one uint8 width per component and a float32
  codebook per width in use (which widths the allocator chose is read
  from the spec); + the bfloat16 sink token of K and V."""
  total = 2 * _PER_SLOT + _table_bytes(spec)
  for i in range(30):
    layer = spec.layer(i)
    k = layer.k
    assert len(k.component_bits) == 64 and sum(k.component_bits) == 64 * k.bits
    assert {w for w, _ in k.width_levels} == set(k.component_bits) - {0}
    assert bool(layer.key_affine.rotation) == basis
    total += (2 * 3 * 64 * affine_bytes
              + (3 * 64 * 64 + 3 * 64 * 4 if basis else 0)
              + 64 + sum(4 * 2 ** w for w, _ in k.width_levels))
  return total


@pytest.fixture(scope="module", name="key_stats_dir")
def _key_stats_dir(tmp_path_factory):
  return synthetic_key_stats(tmp_path_factory.mktemp("ks"))


@pytest.mark.parametrize("name", sorted(PRESET_BITS))
def test_preset_loads_locked_and_converts(name, key_stats_dir):
  config, settings = preset_settings(name, key_stats_dir)
  assert config.is_locked
  with pytest.raises(AttributeError):
    config.cache.k.nope = 1
  bits = PRESET_BITS[name]
  assert settings.quantize == (name != "baseline")
  if bits is None:
    assert settings.cache_spec is None
    return
  spec = settings.cache_spec
  assert isinstance(spec, CacheSpec)
  spec.layer(0)  # Per-layer specs rewrite into the cache layout.
  assert theoretical_bits(SMOLLM2, spec, settings.cache_dtype) == pytest.approx(
      bits, abs=1e-4)
  # The real cache pytree stores exactly the theoretical bytes per token.
  per_token, fixed = cache_bytes(SMOLLM2, spec, settings.cache_dtype)
  assert per_token == pytest.approx(
      bits * 2 * SMOLLM2.num_layers * SMOLLM2.num_kv_heads
      * SMOLLM2.head_dim / 8, rel=1e-4)
  # Fixed bytes: the full-precision windows and sinks, and the per-layer
  # constants (codebooks, key statistics), by hand.
  if name.startswith(("tqmix", "kqmix")):
    assert fixed == _mix_constants(spec)
  elif name.startswith(("tc", "ca", "cvmix", "gemma_cvmix", "qwen_cvmix")):
    assert fixed == _transform_constants(
        spec, basis=name.startswith("tc"),
        affine_bytes=2 if "cvmix" in name else 4)  # float16 affines.
  else:
    assert fixed == PRESET_FIXED_BYTES.get(name, 0)


def test_full_precision_presets_use_their_cache_dtype():
  assert settings_from_config(load_preset("bf16")).cache_dtype == "bfloat16"
  assert settings_from_config(load_preset("fp16")).cache_dtype == "float16"
  assert settings_from_config(load_preset("baseline")).cache_dtype == "float32"


def _parse(argv):
  values = flags.FlagValues()
  holder = DEFINE_preset_config("config", flag_values=values, sys_argv=argv)
  values(argv)
  return holder.value


def test_override_on_the_command_line():
  config = _parse(["prog", "--config=int4_g32", "--config.cache.k.bits=8",
                   "--config.eval.window_len=64"])
  assert config.cache.k.bits == 8 and config.cache.v.bits == 4
  assert config.eval.window_len == 64
  spec = settings_from_config(config).cache_spec
  assert spec.k.format == "int8" and spec.v.format == "int4"


def test_equal_allocation_override_reaches_the_layers(key_stats_dir):
  config = load_preset("tc3")
  config.cache.key_stats = key_stats_dir["transform"]
  config.cache.component_allocation = "equal"
  k = settings_from_config(config).cache_spec.layer(0).k
  assert k.component_bits == () and k.bits == 3 and len(k.levels) == 8
  config.cache.component_allocation = "even"
  with pytest.raises(ValueError, match="allowed: greedy, equal"):
    settings_from_config(config)


def test_preset_given_by_path():
  path = str(CONFIG_DIR / "formats" / "kivi2.py")
  assert _parse(["prog", f"--config={path}"]).cache.residual == 128


def test_unknown_override_key_is_a_flag_error():
  with pytest.raises(flags.IllegalFlagValueError,
                     match=r"--config\.cache\.k\.nope"):
    _parse(["prog", "--config=int4_g32", "--config.cache.k.nope=1"])


def test_unknown_preset_is_a_flag_error():
  with pytest.raises(flags.IllegalFlagValueError, match="available: baseline"):
    _parse(["prog", "--config=nonexistent"])
