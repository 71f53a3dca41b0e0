"""Calibrated per-channel shift and scale of pre-RoPE keys (KVQuant-style).

Pre-RoPE keys share a large per-channel offset across tokens and their
channels differ in spread by orders of magnitude; per-token quantization
spends its levels on both. A `KeyAffine` stores, per kv head and channel, a
shift mu (the calibration mean) and a scale s, and the cache quantizes

    k_stored = (k_pre - mu) / s            (then the optional rotation)

and reads back k_pre = k_stored * s + mu before RoPE, so the reconstruction
is exact up to the quantization error of k_stored, whose error then lands
on channel c with weight s_c (`kvq_jax.calibration.key_stats` chooses mu
and s from calibration windows). Both are per-layer constants charged in the
effective bits (`constant_leaves`); they need key_rope='pre' (a shift does
not commute with RoPE).

Two modes, from the calibration (`KeyStatsOptions.mode`): "std" (s a
relative spread, normalised to geometric mean 1 per head: for formats with
their own per-token scale) and "range" (mu the centre and s the half-width
of the calibrated range, so that range becomes [-1, 1]: for scheme='static'
keys, which store no scale at all).

`KeyAffine` is static configuration: hashable tuples, so it can live in the
frozen `CacheSpec` / `LayerSpec` and be baked into compiled programs.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

MODES = ("std", "range")


@dataclasses.dataclass(frozen=True)
class KeyAffine:
  """shift / scale: [K][H] nested tuples of floats (kv heads x head_dim);
  mode: "std" or "range" (module docstring); codebooks: ((bits, levels),
  ...), calibrated levels of the normalised keys for static keys of that
  many bits (range mode; `QuantSpec.levels`), () for uniform levels."""

  shift: tuple[tuple[float, ...], ...]
  scale: tuple[tuple[float, ...], ...]
  mode: str = "std"
  codebooks: tuple = ()

  def __post_init__(self):
    if self.mode not in MODES:
      raise ValueError(f"KeyAffine.mode={self.mode!r}: allowed: "
                       f"{', '.join(MODES)}.")
    shift = np.asarray(self.shift, np.float32)
    scale = np.asarray(self.scale, np.float32)
    if shift.ndim != 2 or shift.shape != scale.shape:
      raise ValueError(
          f"KeyAffine: shift {shift.shape} and scale {scale.shape}; allowed: "
          "two [num_kv_heads, head_dim] arrays of the same shape.")
    if not (np.all(np.isfinite(shift)) and np.all(np.isfinite(scale))
            and np.all(scale > 0)):
      raise ValueError("KeyAffine: shift must be finite and scale finite and "
                       "> 0 everywhere.")
    books = tuple(sorted((int(b), tuple(np.asarray(c, np.float32).tolist()))
                         for b, c in dict(self.codebooks).items()))
    if books and self.mode != "range":
      raise ValueError("KeyAffine.codebooks need mode='range' (they are "
                       "levels of static keys).")
    if any(len(c) != 2 ** b for b, c in books):
      raise ValueError("KeyAffine.codebooks: allowed: (bits, 2^bits levels) "
                       "pairs.")
    object.__setattr__(self, "codebooks", books)
    object.__setattr__(self, "shift", tuple(map(tuple, shift.tolist())))
    object.__setattr__(self, "scale", tuple(map(tuple, scale.tolist())))

  @classmethod
  def from_arrays(cls, shift_KxH, scale_KxH, mode: str = "std",
                  codebooks=()) -> KeyAffine:
    return cls(shift=np.asarray(shift_KxH, np.float32),
               scale=np.asarray(scale_KxH, np.float32), mode=mode,
               codebooks=tuple(dict(codebooks).items()))

  def levels(self, bits: int) -> tuple[float, ...]:
    """The calibrated levels for `bits`-bit static keys, () if none."""
    return dict(self.codebooks).get(bits, ())

  @property
  def shape(self) -> tuple[int, int]:
    return (len(self.shift), len(self.shift[0]))

  def arrays(self) -> list[np.ndarray]:
    """[shift, scale] as float32 [K, H] (what the cache holds per layer; a
    codebook in use is charged with the key spec, `QuantSpec.levels`)."""
    return [np.asarray(self.shift, np.float32),
            np.asarray(self.scale, np.float32)]

  def normalize(self, k_BxKxTxH: jax.Array) -> jax.Array:
    """(k - mu) / s, float32, for heads-major keys."""
    shift, scale = (jnp.asarray(a)[:, None, :] for a in self.arrays())
    return (k_BxKxTxH.astype(jnp.float32) - shift) / scale

  def denormalize(self, k_BxKxTxH: jax.Array) -> jax.Array:
    """k * s + mu: the inverse of `normalize`."""
    shift, scale = (jnp.asarray(a)[:, None, :] for a in self.arrays())
    return k_BxKxTxH.astype(jnp.float32) * scale + shift
