"""Chooses the decode-attention implementation (levanter-style fallback).

`implementation` is "xla", "pallas", or an ordered tuple of them. A single
explicit choice that cannot run raises ValueError saying why; a tuple tries
each in order and warns (`warnings.warn`) with the reason for every skipped
one. "xla" (dequantize the cache, then attention in jnp) always runs.
"""

from __future__ import annotations

from typing import Sequence
import warnings

import jax

from kvq_jax.kernels.decode_attention import (
    DEFAULT_BLOCK_K, decode_attention, decode_attention_dense,
    decode_attention_dense_supported, decode_attention_supported)
from kvq_jax.kernels.reference import decode_attention_reference

IMPLEMENTATIONS = ("xla", "pallas")


def _normalize(implementation: str | Sequence[str]) -> tuple[str, ...]:
  choices = ((implementation,) if isinstance(implementation, str)
             else tuple(implementation))
  if not choices or any(c not in IMPLEMENTATIONS for c in choices):
    raise ValueError(
        f"implementation={implementation!r} is not supported; allowed: one of "
        f"{IMPLEMENTATIONS} or a non-empty ordered tuple of them.")
  return choices


def pallas_unsupported_reason(q_BxKxGxH, k, v, length_B, *, interpret: bool,
                              block_k: int = DEFAULT_BLOCK_K,
                              k_splits: int | None = None) -> str | None:
  """Why the Pallas kernel cannot run here, or None."""
  backend = jax.default_backend()
  if backend == "cpu" and not interpret:
    return ("Pallas has no CPU lowering: on the cpu backend the kernel runs "
            "only with interpret=True (the Pallas interpreter, for tests).")
  if hasattr(k, "data"):
    return decode_attention_supported(q_BxKxGxH, k, v, length_B,
                                      block_k=block_k, k_splits=k_splits)
  return decode_attention_dense_supported(q_BxKxGxH, k, v, length_B,
                                          block_k=block_k, k_splits=k_splits)


def quantized_decode_attention(q_BxKxGxH: jax.Array, k, v,
                               length_B: jax.Array, *,
                               implementation: str | Sequence[str] = (
                                   "pallas", "xla"),
                               interpret: bool | None = None,
                               block_k: int = DEFAULT_BLOCK_K,
                               k_splits: int | None = None,
                               return_lse: bool = False):
  """Decode attention over a packed (or plain) heads-major KV cache.

  Args:
    q_BxKxGxH: queries of the one new token, G query heads per KV head.
    k, v: QuantizedArray caches [B, K, S, H] (or plain arrays).
    length_B: int [B] valid slots per sequence.
    implementation: "xla", "pallas" or an ordered tuple (fallback order).
    interpret: run Pallas in interpret mode (None: False).
    block_k, k_splits: kernel tiling (see `decode_attention`).
    return_lse: also return the log-sum-exp [B, K, G] of the scaled scores.

  Returns:
    out [B, K, G, H] float32 (and lse if asked).
  """
  choices = _normalize(implementation)
  interpret = bool(interpret)
  reasons = []
  for choice in choices:
    if choice == "xla":
      chosen = lambda: decode_attention_reference(
          q_BxKxGxH, k, v, length_B, return_lse=return_lse)
      reason = None
    else:
      reason = pallas_unsupported_reason(
          q_BxKxGxH, k, v, length_B, interpret=interpret, block_k=block_k,
          k_splits=k_splits)
      kernel = decode_attention if hasattr(k, "data") else (
          decode_attention_dense)
      chosen = lambda: kernel(q_BxKxGxH, k, v, length_B, block_k=block_k,
                              k_splits=k_splits, interpret=interpret,
                              return_lse=return_lse)
    if reason is None:
      for skipped, why in reasons:
        warnings.warn(
            f"quantized_decode_attention: implementation {skipped!r} is "
            f"unavailable ({why}); falling back to {choice!r}.")
      return chosen()
    if len(choices) == 1:
      raise ValueError(
          f"quantized_decode_attention: implementation={choice!r} is "
          f"unsupported here: {reason}")
    reasons.append((choice, reason))
  raise ValueError(
      "quantized_decode_attention: no implementation in "
      f"{choices!r} can run: " + "; ".join(f"{c}: {r}" for c, r in reasons))
