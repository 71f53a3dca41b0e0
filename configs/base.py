"""Shared defaults every preset starts from (not a preset itself).

Fields (override any with --config.FIELD=VALUE):
  model            named model or path (the --model flag wins over it)
  made_for         '' (any model), or the model an allocation preset was
                   allocated for (its per-layer formats are that model's):
                   a run of it with another model is refused
  dtype            compute and parameter dtype (float32 | bfloat16 | float16)
  quantize         False: evaluate the baseline only
  eval.*           num_windows (0 = all), window_len, scoring (all |
                   second_half, llama.cpp's rule | last_N, the last N
                   predictions of a window), batch_size (windows/step),
                   prefill_chunk (tokens per prefill call where a window is
                   prefilled in pieces, as a server would: context_curve)
  cache.k, cache.v type (none | int | fp8_e4m3 | fp8_e5m2), bits (int: 8, 5,
                   4, 3, 2), scheme (symmetric: all 2^bits levels, q4_0's
                   rule | symmetric_narrow: 2^bits - 1 levels, q8_0's |
                   asymmetric | lloyd_max | vector: one 8-bit index per
                   8 // bits elements into a 256-vector codebook, int4 and
                   int2 | static: no scale, calibrated
                   key ranges, see configs/methods/kq4.py), granularity (per_token
                   | per_group | per_channel), group_size (0 = none),
                   clip_ratio, scale_dtype, rounding (kvq: scales rounded
                   up, the project's rule | ggml: llama.cpp's arithmetic,
                   needs float16 scales and clip_ratio 1; see
                   configs/formats/q4_0.py), outliers (values per head vector kept
                   exactly with their index; 0 = none); or, set in a
                   preset, a short spec string (c.cache.k =
                   'int4_g32_asym'; 'fp' = none: kvq_jax/settings/
                   short_specs.py)
  cache.dtype      full-precision cache dtype ('' = dtype); bf16/fp16 presets
  cache.residual, cache.flush_block (0 = auto), cache.sink, cache.key_rope
                   (post | pre), cache.hadamard_k, cache.hadamard_v,
                   cache.rotation_seed (-1: plain Hadamard; N >= 0: random
                   signs per layer from seed N, the randomised Hadamard),
                   cache.key_stats ('' = none; a directory written by
                   experiments.calibrate_keys, or a recipe 'auto[:name=
                   value,...]' built on first use for the model being run
                   (kvq_jax/calibration/auto_key_stats.py): calibrated
                   per-channel shift and scale of the pre-RoPE keys, needs
                   key_rope='pre'), cache.key_affine_dtype (float32 |
                   float16: how that shift and scale are held and charged),
                   cache.block_size, cache.layer_overrides ('0,29:fp/fp;...'),
                   cache.window_dtype (bfloat16 | float16 | float32: storage
                   of the full-precision residual/flush window and sinks),
                   cache.component_allocation (greedy | equal: transform-
                   coded keys' widths from the calibrated error tables, or
                   k.bits for every component; see configs/methods/tc3.py)
  attention.impl   xla | pallas (decode attention over the packed cache)
  attention.code_read  dequantize | lookup (how the XLA path reads vector
                   codes: lookup scores q . centroid tables and sums the
                   centroids, no dense copy; kvq_jax/cache/code_lookup.py)
  memory.*         budget_gib (total GiB for weights + KV cache; 0 = auto:
                   the weights plus 1 GiB for the cache, so every model
                   fits) and weight_dtype for the context-that-fits and
                   speed-up estimates
  decode_bench.*   batch_size, context, steps of the decode-speed measurement
"""

from __future__ import annotations

import ml_collections

from kvq_jax.quant.ggml import ggml_spec


def kv(type: str = "none", bits: int = 4, scheme: str = "symmetric",  # pylint: disable=redefined-builtin
       granularity: str = "per_group", group_size: int = 32,
       clip_ratio: float = 1.0, scale_dtype: str = "bfloat16",
       rounding: str = "kvq", outliers: int = 0) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
      type=type, bits=bits, scheme=scheme, granularity=granularity,
      group_size=group_size, clip_ratio=clip_ratio, scale_dtype=scale_dtype,
      rounding=rounding, outliers=outliers))


def ggml_kv(name: str) -> ml_collections.ConfigDict:
  """`kv(...)` of llama.cpp cache type `name` (q8_0, q4_0, q4_1, q5_0,
  q5_1): the fields of `kvq_jax.quant.ggml_spec(name)`."""
  spec = ggml_spec(name)
  return kv(type="int", bits=spec.bits, scheme=spec.scheme,
            group_size=spec.group_size, scale_dtype=spec.scale_dtype,
            rounding=spec.rounding)


def _kv_or_short() -> ml_collections.FieldReference:
  """cache.k / cache.v: `kv()`, and a preset may set a `kv(...)` or a short
  spec string instead (`c.cache.k = 'int4_g32_asym'`)."""
  return ml_collections.FieldReference(kv(), field_type=object)


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.model = "smollm2-135m"
  c.made_for = ""
  c.dtype = "float32"
  c.quantize = True
  c.eval = ml_collections.ConfigDict(dict(
      num_windows=8, window_len=512, scoring="second_half", batch_size=2,
      prefill_chunk=512))
  c.cache = ml_collections.ConfigDict(dict(
      k=_kv_or_short(), v=_kv_or_short(), dtype="", residual=0,
      flush_block=0, sink=0, key_rope="post", hadamard_k=False,
      hadamard_v=False, rotation_seed=-1, key_stats="",
      key_affine_dtype="float32", block_size=256,
      layer_overrides="", window_dtype="bfloat16",
      component_allocation="greedy"))
  c.attention = ml_collections.ConfigDict(dict(impl="xla",
                                                code_read="dequantize"))
  c.memory = ml_collections.ConfigDict(dict(
      budget_gib=0.0, weight_dtype="bfloat16"))
  c.decode_bench = ml_collections.ConfigDict(dict(
      batch_size=8, context=1024, steps=8))
  return c


def lloyd_max_kv(bits: int) -> ml_collections.ConfigDict:
  """`kv(...)` of `intB_lm`: Lloyd-Max codes + one scale per head vector."""
  return kv(type="int", bits=bits, scheme="lloyd_max",
            granularity="per_token", group_size=0)


def rotated_codebook_config(k_bits: int, v_bits: int,
                            key_stats: str = "auto"
                            ) -> ml_collections.ConfigDict:
  """The tq presets: K and V `int{k_bits}_lm` / `int{v_bits}_lm` after a
  randomised Hadamard (seed 0), keys stored before RoPE and shifted/scaled
  by the calibrated statistics in `key_stats` (experiments.calibrate_keys)."""
  c = get_config()
  c.cache.k = lloyd_max_kv(k_bits)
  c.cache.v = lloyd_max_kv(v_bits)
  c.cache.key_rope = "pre"
  c.cache.hadamard_k = True
  c.cache.hadamard_v = True
  c.cache.rotation_seed = 0
  c.cache.key_stats = key_stats
  return c


def static_keys_config(k_bits: int, v_bits: int, key_stats: str,
                       k_outliers: int = 0) -> ml_collections.ConfigDict:
  """The kq presets (KVQuant-style keys): K `int{k_bits}_st[_oN]`, static
  codes in calibrated per-channel ranges before RoPE (key stats from
  `experiments.calibrate_keys --mode=range`, in `key_stats`), no scale;
  the first token (the attention sink) kept in bfloat16 for K and V; V
  `int{v_bits}_lm` after a randomised Hadamard (seed 0)."""
  c = get_config()
  c.cache.k = kv(type="int", bits=k_bits, scheme="static",
                 granularity="per_token", group_size=0, outliers=k_outliers)
  c.cache.v = lloyd_max_kv(v_bits)
  c.cache.key_rope = "pre"
  c.cache.hadamard_v = True
  c.cache.rotation_seed = 0
  c.cache.key_stats = key_stats
  c.cache.sink = 1
  return c


def static_keys_mix(bits: int, layer_overrides: str) -> ml_collections.ConfigDict:
  """The kqmix presets: `static_keys_config(bits, bits)` with one outlier
  per key vector on kq3's key ranges (p = 0.99), per-layer K/V formats from
  `experiments.allocate` in `layer_overrides`."""
  c = static_keys_config(bits, bits, "auto:mode=range,range_quantile=0.99",
                         k_outliers=1)
  c.cache.layer_overrides = layer_overrides
  return c


TRANSFORM_STATS = "auto:mode=transform,rotation=pca"
# Transform-mode statistics without a basis: the components are the native
# channels (the ca presets: the allocation without the rotation).
CHANNEL_STATS = "auto:mode=transform"


def transform_keys_config(k_bits: int, v_bits: int,
                          key_stats: str = TRANSFORM_STATS,
                          k_outliers: int = 0) -> ml_collections.ConfigDict:
  """The tc presets (issue 34, transform coding): the kq layout
  (`static_keys_config`: pre-RoPE static keys, no scale, the first token in
  bfloat16, V `int{v_bits}_lm` after a randomised Hadamard) with keys in
  the weighted principal axes of the calibration keys, each component
  centred and scaled by its calibration std, and `k_bits` x head_dim bits
  per key vector spread over the components by the calibrated error
  tables (`KeyAffine.component_widths`), each width with its own codebook."""
  return static_keys_config(k_bits, v_bits, key_stats, k_outliers=k_outliers)


def channel_widths_config(k_bits: int, v_bits: int
                          ) -> ml_collections.ConfigDict:
  """The ca presets (issue 34): `transform_keys_config` without the basis.
  The keys' components are their native pre-RoPE channels, each centred
  and scaled by its calibration mean and std, and `k_bits` x head_dim bits
  per key vector spread over the channels by the calibrated (query-
  weighted) error tables, each width with its own codebook; no rotation
  is stored or charged."""
  return transform_keys_config(k_bits, v_bits, key_stats=CHANNEL_STATS)


def channel_widths_mix(layer_overrides: str,
                       key_affine_dtype: str = "float32"
                       ) -> ml_collections.ConfigDict:
  """The cvmix presets (issue 34): ca3 (`channel_widths_config(3, 3)`)
  with per-layer K/V formats from `experiments.allocate` in
  `layer_overrides`: keys among int4_st..int2_st (a width per channel),
  values among int4_vq, int3_lm, int2_vq and int1_vq (vector codes after
  the randomised Hadamard; `_se5m2`: an 8-bit scale), the key affines
  held in `key_affine_dtype`."""
  c = channel_widths_config(3, 3)
  c.cache.layer_overrides = layer_overrides
  c.cache.key_affine_dtype = key_affine_dtype
  return c
