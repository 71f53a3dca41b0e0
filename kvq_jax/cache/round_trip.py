"""Quantize -> dequantize round trips of one layer's K/V tokens.

The cache's write path computed without a cache, for the code that emulates
it: the sensitivity probe (`research.selective_cache`) and the KL fit of
static keys (`calibration.kl_fit`).

A token-local spec (per_token or per_group along head_dim) quantizes every
token independently, so rounding the K/V of a chunk once, at write time,
gives exactly what `QuantizedLayerCache` reads back -- provided no token
waits in full precision (no residual window or flush blocks; the KL fit
relies on this, `check_emulable`). A per_channel spec quantizes groups of
tokens: `round_trip` quantizes the complete groups of a whole window at
once (`quantize_dequantize`), which is what the cache stores once those
groups close; `research.selective_cache` decides, per query token, which
tokens it reads quantized and which from the full-precision window. Sinks
and window tokens (kept in the window dtype) are emulated with
`window_dtype`: the same path with the quantize -> dequantize step replaced
by a cast to the window dtype. Each function here mirrors the quantized
cache's write path step by step:

  keys, key_rope='post':  rope -> [Hadamard] -> cast to the cache dtype ->
                          quantize -> dequantize (float32) -> [Hadamard back]
  keys, key_rope='pre':   [Hadamard] -> cast -> quantize -> dequantize ->
                          [Hadamard back] -> rope
  values:                 [Hadamard] -> cast -> quantize -> dequantize ->
                          [Hadamard back]

The full-precision choice reproduces `DenseLayerCache` (rope, then a cast to
the cache dtype). All outputs are float32, [B, T, K, H].
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kvq_jax.cache import hadamard
from kvq_jax.cache.key_affine import KeyAffine
from kvq_jax.cache.spec import LayerSpec
from kvq_jax.models.rope import Rope
from kvq_jax.quant import QuantSpec, dequantize, quantize

TOKEN_LOCAL = ("per_token", "per_group")


def check_emulable(layer: LayerSpec, where: str) -> None:
  """Raises ValueError unless write-time fake quantization is exact."""
  for name, spec in (("k", layer.k), ("v", layer.v)):
    check_token_local(spec, f"{where}.{name}")
  for name, value in (("residual", layer.residual),
                      ("flush_block - 1", layer.flush_block - 1)):
    if value:
      raise ValueError(
          f"{where}.{name}={value}: the selective (fake-quant) cache quantizes "
          "every token at write time and cannot emulate full-precision "
          "residual windows or flush blocks; allowed: residual=0, "
          "flush_block=1 (sinks are emulated).")


def check_token_local(spec: QuantSpec | None, where: str) -> None:
  if spec is not None and spec.granularity not in TOKEN_LOCAL:
    raise ValueError(
        f"{where}.granularity={spec.granularity!r}: the selective "
        "(fake-quant) cache is exact only for token-local groups; allowed: "
        f"{', '.join(TOKEN_LOCAL)} (per_channel groups span tokens).")


def quantize_dequantize(x: jax.Array, spec: QuantSpec,
                        token_start: int = 0) -> jax.Array:
  """dequantize(quantize(x, spec)) in float32, cache layout [..., T, H].

  A per_channel `spec` (axis -2) groups `spec.group_size` tokens per channel,
  aligned at `token_start` (the cache's sinks precede its first group):
  only the complete groups of tokens [token_start, T) are quantized; the
  tokens before and after them come back unchanged, as the cache never
  reads them quantized (they are sinks or still in its full-precision
  window).
  """
  if spec.granularity != "per_channel":
    return dequantize(quantize(x, spec), jnp.float32)
  t = x.shape[-2]
  end = token_start + (t - token_start) // spec.group_size * spec.group_size
  if end <= token_start:
    return x.astype(jnp.float32)
  body = dequantize(quantize(x[..., token_start:end, :], spec), jnp.float32)
  return jnp.concatenate([x[..., :token_start, :].astype(jnp.float32), body,
                          x[..., end:, :].astype(jnp.float32)], axis=-2)


def round_trip(x: jax.Array, spec: QuantSpec | None, dtype,
               rotate: bool, key: hadamard.RotationKey = None,
               window_dtype=None, pre_round=None,
               token_start: int = 0) -> jax.Array:
  """x rounded to `dtype`, then (if `spec`) quantized and dequantized.

  `rotate`: Hadamard-rotate head_dim before and undo it after (only when
  `spec` quantizes or a window dtype rounds; a full-precision tensor is
  otherwise never rotated); `key` the randomised rotation's (seed, layer),
  None for the plain Hadamard.
  `window_dtype` (a sink or window token of a quantized layer): cast to it
  instead of quantizing, rotation included, as the cache stores them.
  `pre_round` (a tensor that keeps a full-precision window): round to this
  window dtype first, as a token waits there before it is quantized (or,
  `spec` None, stored). Layout [..., T, H] (tokens on axis -2) when `spec`
  is per_channel, whose groups start at `token_start`.
  """
  x = x.astype(jnp.float32)
  if spec is None and window_dtype is None and pre_round is None:
    return x.astype(dtype).astype(jnp.float32)
  if rotate:
    x = hadamard.rotate(x, key)
  if pre_round is not None:
    x = x.astype(dtype).astype(pre_round).astype(jnp.float32)
  if window_dtype is not None:
    y = x.astype(dtype).astype(window_dtype).astype(jnp.float32)
  elif spec is None:
    y = x.astype(dtype).astype(jnp.float32)
  else:
    y = quantize_dequantize(x.astype(dtype), spec, token_start)
  return hadamard.unrotate(y, key) if rotate else y


def _token_major(fn):
  """`fn` on [B, K, T, H] (the cache layout round trips run in) applied to
  a [B, T, K, H] tensor."""
  return lambda x_BxTxKxH: jnp.swapaxes(fn(jnp.swapaxes(x_BxTxKxH, 1, 2)),
                                        1, 2)


def keys(k_BxTxKxH: jax.Array, positions_BxT: jax.Array, rope: Rope,
         spec: QuantSpec | None, dtype, key_rope: str,
         rotate: bool, key: hadamard.RotationKey = None,
         affine: KeyAffine | None = None, window_dtype=None,
         pre_round=None, token_start: int = 0) -> jax.Array:
  """Post-RoPE keys as the cache would read them back (float32); `affine`
  (pre-RoPE only) shifts and scales the keys around the round trip;
  `window_dtype`, `pre_round`, `token_start`: as in `round_trip`."""
  trip = lambda x: round_trip(x, spec, dtype, rotate, key, window_dtype,
                              pre_round, token_start)
  plain = spec is None and window_dtype is None and pre_round is None
  if plain or key_rope == "post":
    return _token_major(trip)(rope(k_BxTxKxH, positions_BxT))
  if affine is None:
    return rope(_token_major(trip)(k_BxTxKxH), positions_BxT)
  k_BxKxTxH = affine.normalize(jnp.swapaxes(k_BxTxKxH, 1, 2))
  k_BxKxTxH = affine.denormalize(trip(k_BxKxTxH))
  return rope(jnp.swapaxes(k_BxKxTxH, 1, 2), positions_BxT)


def values(v_BxTxKxH: jax.Array, spec: QuantSpec | None, dtype,
           rotate: bool, key: hadamard.RotationKey = None,
           window_dtype=None, pre_round=None,
           token_start: int = 0) -> jax.Array:
  return _token_major(lambda x: round_trip(
      x, spec, dtype, rotate, key, window_dtype, pre_round, token_start))(
          v_BxTxKxH)
