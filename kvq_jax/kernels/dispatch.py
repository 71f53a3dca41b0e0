"""Chooses the decode-attention implementation (levanter-style fallback).

`implementation` is "xla", "pallas", or an ordered tuple of them. A single
explicit choice that cannot run raises ValueError saying why; a tuple tries
each in order and warns (`warnings.warn`) with the reason for every skipped
one. "xla" (dequantize the cache, then attention in jnp) always runs.

`choose_implementation` is that rule on its own, for callers with their own
"xla" path and extra reasons (the quantized KV cache uses it, with
`pallas_unsupported_reason`; the paged cache with
`paged_pallas_unsupported_reason`).
"""

from __future__ import annotations

from typing import Callable, Sequence
import warnings

import jax

from kvq_jax.kernels.decode_attention import (
    DEFAULT_BLOCK_K, decode_attention, decode_attention_dense,
    decode_attention_dense_supported, decode_attention_supported)
from kvq_jax.kernels.paged_decode_attention import (
    paged_decode_attention_supported)
from kvq_jax.kernels.reference import decode_attention_reference

IMPLEMENTATIONS = ("xla", "pallas")


def normalize_implementation(implementation: str | Sequence[str],
                             field: str = "implementation"
                             ) -> tuple[str, ...]:
  """"xla" | "pallas" | an ordered sequence of them -> a non-empty tuple."""
  choices = ((implementation,) if isinstance(implementation, str)
             else tuple(implementation))
  if not choices or any(c not in IMPLEMENTATIONS for c in choices):
    raise ValueError(
        f"{field}={implementation!r} is not supported; allowed: one of "
        f"{IMPLEMENTATIONS} or a non-empty ordered tuple of them.")
  return choices


def resolve_interpret(interpret: bool | None) -> bool:
  """None (auto) -> interpret exactly when the default backend is the CPU."""
  if interpret is None:
    return jax.default_backend() == "cpu"
  return bool(interpret)


def choose_implementation(implementation: str | Sequence[str],
                          unsupported_reason: Callable[[str], str | None], *,
                          caller: str) -> str:
  """The first implementation whose `unsupported_reason(name)` is None.

  Args:
    implementation: "xla", "pallas" or an ordered tuple (fallback order).
    unsupported_reason: name -> why it cannot run here, or None.
    caller: prefix of warnings and errors.

  Raises:
    ValueError: a single explicit choice cannot run, or none of a tuple can.
  """
  choices = normalize_implementation(implementation)
  skipped = []
  for choice in choices:
    reason = unsupported_reason(choice)
    if reason is None:
      for name, why in skipped:
        warnings.warn(
            f"{caller}: implementation {name!r} is unavailable ({why}); "
            f"falling back to {choice!r}.", stacklevel=3)
      return choice
    if len(choices) == 1:
      raise ValueError(
          f"{caller}: implementation={choice!r} is unsupported here: {reason}")
    skipped.append((choice, reason))
  raise ValueError(
      f"{caller}: no implementation in {choices!r} can run: "
      + "; ".join(f"{c}: {r}" for c, r in skipped))


def backend_reason(interpret: bool) -> str | None:
  """Why no Pallas kernel can run on this backend, or None."""
  if jax.default_backend() == "cpu" and not interpret:
    return ("Pallas has no CPU lowering: on the cpu backend the kernel runs "
            "only with interpret=True (the Pallas interpreter, for tests).")
  return None


def pallas_unsupported_reason(q_BxKxGxH, k, v, length_B, *, interpret: bool,
                              start_B=None,
                              block_k: int = DEFAULT_BLOCK_K,
                              k_splits: int | None = None) -> str | None:
  """Why the Pallas kernel cannot run here, or None."""
  reason = backend_reason(interpret)
  if reason:
    return reason
  # The platform's own limits (Triton's dot sizes, TPU tiling) apply to
  # compiled runs on this backend; the interpreter has none.
  check = (decode_attention_supported if hasattr(k, "data")
           else decode_attention_dense_supported)
  return check(q_BxKxGxH, k, v, length_B, start_B=start_B, block_k=block_k,
               k_splits=k_splits, interpret=interpret)


def paged_pallas_unsupported_reason(q_BxKxGxH, k_pool, v_pool,
                                    block_table_BxM, end_B, *,
                                    interpret: bool, page_size: int,
                                    start_B=None) -> str | None:
  """Why the paged Pallas kernel cannot run here, or None."""
  return backend_reason(interpret) or paged_decode_attention_supported(
      q_BxKxGxH, k_pool, v_pool, block_table_BxM, end_B, start_B=start_B,
      page_size=page_size, interpret=interpret)


def quantized_decode_attention(q_BxKxGxH: jax.Array, k, v,
                               length_B: jax.Array, *,
                               start_B: jax.Array | None = None,
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
    length_B: int [B]; slots >= length_b are masked.
    start_B: int [B] or None (zeros); slots < start_b are masked.
    implementation: "xla", "pallas" or an ordered tuple (fallback order).
    interpret: run Pallas in interpret mode (None: False).
    block_k, k_splits: kernel tiling (see `decode_attention`).
    return_lse: also return the log-sum-exp [B, K, G] of the scaled scores.

  Returns:
    out [B, K, G, H] float32 (and lse if asked).
  """
  interpret = bool(interpret)

  def reason(choice: str) -> str | None:
    if choice == "xla":
      return None
    return pallas_unsupported_reason(
        q_BxKxGxH, k, v, length_B, interpret=interpret, start_B=start_B,
        block_k=block_k, k_splits=k_splits)

  choice = choose_implementation(implementation, reason,
                                 caller="quantized_decode_attention")
  if choice == "xla":
    return decode_attention_reference(q_BxKxGxH, k, v, length_B,
                                      return_lse=return_lse, start_B=start_B)
  kernel = decode_attention if hasattr(k, "data") else decode_attention_dense
  return kernel(q_BxKxGxH, k, v, length_B, start_B=start_B, block_k=block_k,
                k_splits=k_splits, interpret=interpret, return_lse=return_lse)
