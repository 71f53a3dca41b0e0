"""Per-channel key statistics from calibration windows -> `KeyAffine`s.

For one layer, with pre-RoPE keys k [.., K, H] and post-RoPE queries q
[.., N, H] (N = K * G query heads) recorded on the calibration windows
(`recording.record_qkv`):

  mu_c   = mean over tokens of k_c                           (per kv head)
  sd_c   = std over tokens of k_c
  qrms_c = sqrt(mean over tokens and the G query heads of the group of
           q_c^2), averaged over each RoPE pair (c, c + R/2) of the rotary
           channels (RoPE rotates a pair, so the query weight a pre-RoPE
           key channel meets is the pair's mean energy)
  s_c    = sd_c^alpha / qrms_c^beta, normalised to geometric mean 1 per head

and the cache stores (k - mu) / s (`kvq_jax.cache.key_affine`). For an
isotropic error on the stored key, (alpha, beta) = (0.5, 0.5) would
minimise E[(q . dk)^2]; the default (0.5, 0) was picked from a quick 4-window
comparison of a few exponent pairs on SmolLM2 (a prototype, not a landed
measurement: compare others with `experiments.calibrate_keys --alpha
--beta` and `experiments.run --config.cache.key_stats=DIR`).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from kvq_jax.cache.key_affine import KeyAffine
from kvq_jax.calibration.recording import LayerRecord

_EPS = 1e-6


@dataclasses.dataclass(frozen=True)
class KeyStatsOptions:
  """alpha, beta: the exponents of s (module docstring); shift: subtract
  the mean (False: mu = 0)."""

  alpha: float = 0.5
  beta: float = 0.0
  shift: bool = True


def _pair_mean(energy_KxH: np.ndarray, rotary_dim: int) -> np.ndarray:
  out = energy_KxH.copy()
  half = rotary_dim // 2
  pair = 0.5 * (energy_KxH[:, :half] + energy_KxH[:, half:rotary_dim])
  out[:, :half] = pair
  out[:, half:rotary_dim] = pair
  return out


def layer_affine(record: LayerRecord, rotary_dim: int,
                 options: KeyStatsOptions = KeyStatsOptions()) -> KeyAffine:
  """The `KeyAffine` of one layer (module docstring)."""
  k = np.asarray(record.k_pre_BxTxKxH, np.float64)
  q = np.asarray(record.q_BxTxNxH, np.float64)
  kh, h = k.shape[-2:]
  n = q.shape[-2]
  if n % kh or q.shape[-1] != h or not 0 < rotary_dim <= h \
      or rotary_dim % 2:
    raise ValueError(
        f"key stats: q {q.shape}, k {k.shape}, rotary_dim={rotary_dim}; "
        "allowed: N a multiple of K, the same head_dim, an even rotary_dim "
        "<= head_dim.")
  k = k.reshape(-1, kh, h)
  q = q.reshape(-1, kh, n // kh, h)
  mu = k.mean(axis=0) if options.shift else np.zeros((kh, h))
  sd = np.maximum(k.std(axis=0), _EPS)
  qrms = np.sqrt(np.maximum(
      _pair_mean(np.mean(q * q, axis=(0, 2)), rotary_dim), _EPS ** 2))
  s = sd ** options.alpha / qrms ** options.beta
  s = s / np.exp(np.mean(np.log(s), axis=-1, keepdims=True))
  return KeyAffine.from_arrays(mu, s)


def key_affines(records: Sequence[LayerRecord], rotary_dim: int,
                options: KeyStatsOptions = KeyStatsOptions()
                ) -> tuple[KeyAffine, ...]:
  """One `KeyAffine` per layer."""
  return tuple(layer_affine(r, rotary_dim, options) for r in records)
