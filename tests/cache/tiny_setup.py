"""Tiny models, cache specs and run helpers shared by the cache tests.

Compiling is what costs time here, so everything is built once per session:
models and their `Runtime`s are cached, and the spec sweep uses only three
program shapes per spec (a T=40 prefill, T=7 chunks and the T=1 decode step).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from kvq_jax.cache.factory import init_cache
from kvq_jax.cache.key_affine import KeyAffine
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.models.config import ModelConfig
from kvq_jax.models.params import decoder_from_params, random_params
from kvq_jax.models.runtime import Runtime
from kvq_jax.quant import QuantSpec

from tests.models.tiny import TINY

TINY1 = dataclasses.replace(TINY, num_layers=1)
TINY2 = TINY
CONFIGS = {"tiny1": TINY1, "tiny2": TINY2}

SEQ_LEN = 40
CAPACITY = 48
BLOCK = 16  # Three blocks of the quantized storage scan at CAPACITY.
# Uneven chunks built from the two shapes the sweep compiles anyway (7 and
# the decode step), crossing flush boundaries at varying offsets.
MIXED_CHUNKS = (7, 1, 7, 7, 1, 1, 7, 1, 7, 1)
assert sum(MIXED_CHUNKS) == SEQ_LEN


def _q(fmt, scheme="symmetric", granularity="per_token", group=None):
  return QuantSpec(fmt, scheme, granularity, group)


INT8 = _q("int8")
INT4_G8 = _q("int4", granularity="per_group", group=8)
INT4_G8_ASYM = _q("int4", "asymmetric", "per_group", 8)
INT2_G8_ASYM = _q("int2", "asymmetric", "per_group", 8)
FP8 = _q("fp8_e4m3")
INT2_PC8_ASYM = _q("int2", "asymmetric", "per_channel", 8)
INT4_PC8_ASYM = _q("int4", "asymmetric", "per_channel", 8)
LM4 = _q("int4", "lloyd_max")
LM3 = _q("int3", "lloyd_max")
ST4_O1 = QuantSpec("int4", "static", "per_token", outliers=1)
ST3 = QuantSpec("int3", "static", "per_token")
VQ4 = _q("int4", "vector")
VQ2 = _q("int2", "vector")


def transform_affine(kv_heads: int = 2, head_dim: int = 16, seed: int = 0,
                     rotated: bool = True) -> KeyAffine:
  """A transform-mode key affine (issue 34): random orthogonal bases (none
  if not `rotated`: the components are the channels, as the ca presets'),
  component variances falling 2x a component (so the allocation is
  unequal: 6 bits down to 0 at a 3-bit budget), codebooks 1..8."""
  rng = np.random.default_rng(seed)
  basis = np.linalg.qr(rng.normal(size=(kv_heads, head_dim, head_dim)))[0]
  var = 2.0 ** -np.arange(head_dim)
  table = var[:, None] * 4.0 ** -np.arange(9)[None, :]
  books = {b: np.linspace(-2.5, 2.5, 2 ** b) for b in range(1, 9)}
  return KeyAffine.from_arrays(
      rng.normal(size=(kv_heads, head_dim)) * 0.3,
      np.sqrt(np.broadcast_to(var, (kv_heads, head_dim))) * 2.0,
      mode="transform", codebooks=books,
      rotation_KxHxH=np.swapaxes(basis, 1, 2) if rotated else None,
      distortion_Hx9=table)
INT4_G8_ASYM_O1 = QuantSpec("int4", "asymmetric", "per_group", 8, outliers=1)

# name -> (config name, CacheSpec). Kept short: every spec costs two
# compilations. Mixed K/V formats double as coverage of fp8, asymmetric int4
# and a plain (unquantized) V store next to per-channel K.
SWEEP = {
    "int8_per_token": ("tiny1", CacheSpec(k=INT8, v=INT8, block_size=BLOCK)),
    "int4_g8_sym": ("tiny1", CacheSpec(k=INT4_G8, v=INT4_G8,
                                       block_size=BLOCK)),
    "int2_g8_asym": ("tiny1", CacheSpec(k=INT2_G8_ASYM, v=INT2_G8_ASYM,
                                        block_size=BLOCK)),
    "mixed_fp8_k_int4_g8_asym_v": ("tiny1", CacheSpec(
        k=FP8, v=INT4_G8_ASYM, block_size=BLOCK)),
    "kivi_pc8_r8": ("tiny1", CacheSpec(k=INT2_PC8_ASYM, v=INT2_G8_ASYM,
                                       residual=8, block_size=BLOCK)),
    "pre_rope_hadamard_sinks": ("tiny1", CacheSpec(
        k=INT4_G8, v=INT4_G8, sink=4, residual=3, flush_block=4,
        key_rope="pre", hadamard_k=True, hadamard_v=True, block_size=BLOCK)),
    # Lloyd-Max codes after a seeded randomised Hadamard, calibrated-style
    # pre-RoPE key affine, sinks and a residual window (issue 14's formats).
    "lloyd_rotated_affine": ("tiny1", CacheSpec(
        k=LM4, v=LM3, sink=2, residual=3, key_rope="pre", hadamard_k=True,
        hadamard_v=True, rotation_seed=3, key_affines=(KeyAffine.from_arrays(
            np.linspace(-2, 2, 32).reshape(2, 16),
            np.linspace(0.5, 2, 32).reshape(2, 16)),),
        block_size=BLOCK)),
    # KVQuant-style: static keys in calibrated ranges (range-mode affine),
    # one outlier per key and value vector, committed as written, sinks.
    "static_k_outliers": ("tiny1", CacheSpec(
        k=ST4_O1, v=INT4_G8_ASYM_O1, sink=2, key_rope="pre",
        key_affines=(KeyAffine.from_arrays(
            np.linspace(-1, 1, 32).reshape(2, 16),
            np.linspace(0.3, 1.5, 32).reshape(2, 16), mode="range"),),
        block_size=BLOCK)),
    # Transform-coded keys (issue 34): a bfloat16 basis, a width per
    # component from the error table, no scale; sinks.
    "transform_coded_keys": ("tiny1", CacheSpec(
        k=ST3, v=LM3, sink=2, key_rope="pre",
        key_affines=(transform_affine(),), block_size=BLOCK)),
    # Vector codes (issue 34, method 3): K pairs, V quadruples, one 8-bit
    # index each, after a seeded randomised Hadamard.
    "vector_codes": ("tiny1", CacheSpec(
        k=VQ4, v=VQ2, hadamard_k=True, hadamard_v=True, rotation_seed=1,
        block_size=BLOCK)),
    # Layer 0 full precision (a DenseLayerCache); layer 1 per-channel int4 K
    # with a full-precision V store.
    "override_fp_layer0_k_only_pc8": ("tiny2", CacheSpec(
        k=INT4_PC8_ASYM, v=None, residual=4,
        layer_overrides=((0, None, None),), block_size=BLOCK)),
}
# Full-precision regions in float32: prefill and decode project K/V with
# float32 matmuls of different shapes, whose last-ulp differences a bfloat16
# window would sometimes round to different bf16 values (a real, documented
# effect, but not what these tests check: the flush and visibility logic).
SWEEP = {name: (config, dataclasses.replace(spec, window_dtype="float32"))
         for name, (config, spec) in SWEEP.items()}
# Specs also fed in uneven chunks (one extra compilation each).
MIXED_SWEEP = ("int4_g8_sym", "kivi_pc8_r8", "pre_rope_hadamard_sinks")


@functools.lru_cache(maxsize=None)
def runtime(config_name: str) -> Runtime:
  config = CONFIGS[config_name]
  return Runtime(decoder_from_params(config, random_params(config, seed=5,
                                                           scale=0.1)))


def token_ids(batch: int = 2, length: int = SEQ_LEN, seed: int = 0,
              vocab: int = TINY.vocab_size) -> jax.Array:
  return jnp.asarray(np.random.default_rng(seed).integers(
      0, vocab, (batch, length)), jnp.int32)


def run_chunks(rt: Runtime, cache: list, ids_BxT: jax.Array,
               chunks: Sequence[int]) -> tuple[np.ndarray, list]:
  """Feeds ids in `chunks` (1 = the decode step); logits [B, T, V]."""
  if sum(chunks) != ids_BxT.shape[1]:
    raise ValueError(f"chunks {chunks} do not sum to {ids_BxT.shape[1]}.")
  outs, pos = [], 0
  for size in chunks:
    if size == 1:
      logits, cache = rt.decode(ids_BxT[:, pos], cache)
      logits = logits[:, None]
    else:
      logits, cache = rt.prefill(ids_BxT[:, pos:pos + size], cache)
    outs.append(np.asarray(logits))
    pos += size
  return np.concatenate(outs, axis=1), cache


def fresh_cache(config_name: str, spec: CacheSpec | None, batch: int = 2,
                capacity: int = CAPACITY) -> list:
  return init_cache(CONFIGS[config_name], batch, capacity, spec)


def nll(logits_BxTxV: np.ndarray, ids_BxT) -> np.ndarray:
  """Per-token NLL of predicting ids[:, t + 1] from logits[:, t]: [B, T-1]."""
  logp = jax.nn.log_softmax(jnp.asarray(logits_BxTxV[:, :-1]), axis=-1)
  target = jnp.asarray(ids_BxT)[:, 1:, None]
  return -np.asarray(jnp.take_along_axis(logp, target, axis=-1))[..., 0]


@functools.lru_cache(maxsize=None)
def sweep_logits(name: str) -> dict[str, np.ndarray]:
  """Logits of SWEEP[name] on `token_ids()`: one prefill, decode (, mixed)."""
  config_name, spec = SWEEP[name]
  rt, ids = runtime(config_name), token_ids()
  out = {}
  out["prefill"], _ = run_chunks(rt, fresh_cache(config_name, spec), ids,
                                 (SEQ_LEN,))
  out["decode"], _ = run_chunks(rt, fresh_cache(config_name, spec), ids,
                                (1,) * SEQ_LEN)
  if name in MIXED_SWEEP:
    out["mixed"], _ = run_chunks(rt, fresh_cache(config_name, spec), ids,
                                 MIXED_CHUNKS)
  return out


@functools.lru_cache(maxsize=None)
def dense_logits(config_name: str) -> np.ndarray:
  logits, _ = run_chunks(runtime(config_name), fresh_cache(config_name, None),
                         token_ids(), (SEQ_LEN,))
  return logits
