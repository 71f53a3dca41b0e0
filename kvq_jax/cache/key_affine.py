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

With a calibrated rotation R (one orthogonal [H, H] matrix per kv head,
issue 14's method 4: `key_stats` fits it, e.g. the keys' principal axes
weighted by the queries that read them), the stored key is

    k_stored = R (k_pre - mu) / s,   read back as R^T (k_stored * s) + mu,

so s (and the static keys' ranges) live in the rotated coordinates. R is a
per-layer constant too, stored and charged in float32 (K H^2 values).

Mode "transform" (issue 34, transform coding): R the weighted principal
axes, mu the mean and s the standard deviation of each rotated component
(so the stored coordinates are centred, unit-variance), `codebooks` one
calibrated codebook per width 1..8 and `distortion` [H][9] the weighted
error of each component coded with 0..8 bits on the calibration keys
(summed over the kv heads). `CacheSpec.layer` turns the static key spec's
budget (bits x head_dim per vector) into one width per component with
`quant.bit_allocation.greedy_widths`. R is stored as int8 codes with one
float32 scale per row (absmax / 127) and charged so (about 1 byte a
value); writing and reading both use that stored R.

`storage` is the dtype the shift and scale are held (and charged) in:
float32, or float16 (rounded to nearest once, here; every read and write
uses the rounded values: half the bytes, a relative change below 2^-11).

`KeyAffine` is static configuration: hashable tuples, so it can live in the
frozen `CacheSpec` / `LayerSpec` and be baked into compiled programs.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

MODES = ("std", "range", "transform")
STORAGES = ("float32", "float16")
BOOK_MODES = ("range", "transform")  # modes whose static keys use codebooks


def int8_rows(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(codes, scales) of `matrix` [..., H] with one absmax / 127 scale per
  row: float32 arrays, codes integers in [-127, 127], scales [..., 1];
  codes * scales is the stored matrix."""
  m = np.asarray(matrix, np.float32)
  scale = np.maximum(np.max(np.abs(m), axis=-1, keepdims=True) / np.float32(
      127.0), np.float32(1e-30))
  return np.round(m / scale).astype(np.float32), scale.astype(np.float32)


@dataclasses.dataclass(frozen=True)
class KeyAffine:
  """shift / scale: [K][H] nested tuples of floats (kv heads x head_dim);
  mode: "std", "range" or "transform" (module docstring); codebooks: ((bits, levels),
  ...), calibrated levels of the normalised keys for static keys of that
  many bits (range mode; `QuantSpec.levels`), () for uniform levels;
  rotation: [K][H][H] orthogonal matrices (module docstring), () for
  none; storage: the dtype of shift and scale, one of `STORAGES`."""

  shift: tuple[tuple[float, ...], ...]
  scale: tuple[tuple[float, ...], ...]
  mode: str = "std"
  codebooks: tuple = ()
  rotation: tuple = ()
  distortion: tuple = ()
  storage: str = "float32"

  def __post_init__(self):
    if self.mode not in MODES:
      raise ValueError(f"KeyAffine.mode={self.mode!r}: allowed: "
                       f"{', '.join(MODES)}.")
    if self.storage not in STORAGES:
      raise ValueError(f"KeyAffine.storage={self.storage!r}: allowed: "
                       f"{', '.join(STORAGES)}.")
    shift = np.asarray(self.shift, np.float32)
    scale = np.asarray(self.scale, np.float32)
    if self.storage == "float16":
      with np.errstate(over="ignore"):
        shift, scale = (a.astype(np.float16).astype(np.float32)
                        for a in (shift, scale))
    if shift.ndim != 2 or shift.shape != scale.shape:
      raise ValueError(
          f"KeyAffine: shift {shift.shape} and scale {scale.shape}; allowed: "
          "two [num_kv_heads, head_dim] arrays of the same shape.")
    if not (np.all(np.isfinite(shift)) and np.all(np.isfinite(scale))
            and np.all(scale > 0)):
      raise ValueError("KeyAffine: shift must be finite and scale finite and "
                       f"> 0 everywhere (in storage {self.storage}).")
    books = tuple(sorted((int(b), tuple(np.asarray(c, np.float32).tolist()))
                         for b, c in dict(self.codebooks).items()))
    if books and self.mode not in BOOK_MODES:
      raise ValueError("KeyAffine.codebooks need mode='range' or "
                       "'transform' (they are levels of static keys).")
    if any(len(c) != 2 ** b for b, c in books):
      raise ValueError("KeyAffine.codebooks: allowed: (bits, 2^bits levels) "
                       "pairs.")
    object.__setattr__(self, "codebooks", books)
    self._check_distortion(shift.shape[1])
    if len(self.rotation):
      rot = np.asarray(self.rotation, np.float32)
      if self.mode == "transform":
        rot_codes, rot_scale = int8_rows(rot)
        rot = rot_codes * rot_scale
      kh, h = shift.shape
      if rot.shape != (kh, h, h):
        raise ValueError(
            f"KeyAffine.rotation has shape {rot.shape}; allowed: () or "
            f"[num_kv_heads, head_dim, head_dim] = {(kh, h, h)}.")
      gram = np.einsum("kab,kcb->kac", rot.astype(np.float64), rot)
      tol = 2e-2 if self.mode == "transform" else 1e-4  # int8 rows there.
      if not np.allclose(gram, np.eye(h), atol=tol):
        raise ValueError("KeyAffine.rotation: every head's matrix must be "
                         f"orthogonal (R R^T = I within {tol}).")
      object.__setattr__(self, "rotation", tuple(
          tuple(map(tuple, r)) for r in rot.tolist()))
    else:
      object.__setattr__(self, "rotation", ())
    object.__setattr__(self, "shift", tuple(map(tuple, shift.tolist())))
    object.__setattr__(self, "scale", tuple(map(tuple, scale.tolist())))

  def _check_distortion(self, head_dim: int) -> None:
    if not len(self.distortion):
      object.__setattr__(self, "distortion", ())
      return
    table = np.asarray(self.distortion, np.float64)
    if self.mode != "transform" or table.shape != (head_dim, 9) or not (
        np.all(np.isfinite(table)) and np.all(table >= 0)):
      raise ValueError(
          f"KeyAffine.distortion of shape {table.shape} in mode "
          f"{self.mode!r}; allowed: () or, in mode 'transform', finite "
          f"errors >= 0 of shape [head_dim, 9] = {(head_dim, 9)}.")
    object.__setattr__(self, "distortion",
                       tuple(map(tuple, table.tolist())))

  @classmethod
  def from_arrays(cls, shift_KxH, scale_KxH, mode: str = "std",
                  codebooks=(), rotation_KxHxH=None,
                  distortion_Hx9=None) -> KeyAffine:
    return cls(shift=np.asarray(shift_KxH, np.float32),
               scale=np.asarray(scale_KxH, np.float32), mode=mode,
               codebooks=tuple(dict(codebooks).items()),
               rotation=() if rotation_KxHxH is None else np.asarray(
                   rotation_KxHxH, np.float32),
               distortion=() if distortion_Hx9 is None else np.asarray(
                   distortion_Hx9, np.float64))

  @classmethod
  def stand_in(cls, num_kv_heads: int, head_dim: int, mode: str = "std",
               rotated: bool | None = None, codebook_bits=()) -> KeyAffine:
    """An identity of the given shape, not a calibration: zero shift, unit
    scale, uniform codebooks over [-1, 1] for `codebook_bits`, the identity
    rotation if `rotated` (None: only in mode 'transform', whose basis is
    the usual case; False there: widths per native channel, no basis).
    Mode 'transform' carries codebooks for widths 1..8 and an error table whose variances halve
    from one component to the next, so widths (and the codebooks charged)
    spread as calibrated ones do. For checks whose result does not depend
    on calibrated numbers: bytes, paged against contiguous."""
    shape = (num_kv_heads, head_dim)
    table = None
    if rotated is None:
      rotated = mode == "transform"
    if mode == "transform":
      codebook_bits = range(1, 9)
      table = (2.0 ** -np.arange(head_dim)[:, None]
               * 4.0 ** -np.arange(9)[None, :])
    eye = np.broadcast_to(np.eye(head_dim, dtype=np.float32),
                          shape + (head_dim,))
    return cls.from_arrays(
        np.zeros(shape), np.ones(shape), mode=mode,
        codebooks=tuple((b, np.linspace(-1.0, 1.0, 2**b))
                        for b in codebook_bits),
        rotation_KxHxH=eye if rotated else None, distortion_Hx9=table)

  def component_widths(self, bits: int) -> tuple[int, ...] | None:
    """Transform mode with a distortion table: the width of each component
    for a budget of `bits` per component on average; None otherwise."""
    if self.mode != "transform" or not self.distortion:
      return None
    from kvq_jax.quant.bit_allocation import greedy_widths  # pylint: disable=g-import-not-at-top
    return greedy_widths(self.distortion, bits * len(self.distortion))

  def levels(self, bits: int) -> tuple[float, ...]:
    """The calibrated levels for `bits`-bit static keys, () if none."""
    return dict(self.codebooks).get(bits, ())

  @property
  def shape(self) -> tuple[int, int]:
    return (len(self.shift), len(self.shift[0]))

  def rotation_array(self) -> np.ndarray | None:
    """R as float32 [K, H, H] (rows: the rotated axes), None without."""
    return np.asarray(self.rotation, np.float32) if self.rotation else None

  def arrays(self) -> list[np.ndarray]:
    """[shift, scale] as [K, H] in `storage`, plus R [K, H, H] if rotated
    (what the cache holds per layer; a codebook in use is charged with the
    key spec, `QuantSpec.levels`)."""
    out = [np.asarray(self.shift, self.storage),
           np.asarray(self.scale, self.storage)]
    if not self.rotation:
      return out
    if self.mode == "transform":  # Stored (and charged) as int8 rows.
      codes, scale = int8_rows(self.rotation_array())
      return out + [codes.astype(np.int8), scale[..., 0]]
    return out + [self.rotation_array()]

  def _rotation(self, rotation_KxHxH):
    return (self.rotation_array() if rotation_KxHxH is None
            else rotation_KxHxH)

  def normalize(self, k_BxKxTxH: jax.Array,
                rotation_KxHxH: jax.Array | None = None) -> jax.Array:
    """R (k - mu) / s, float32, for heads-major keys; `rotation_KxHxH`
    replaces the stored R (the KL fit's rotation being learned)."""
    shift, scale = (jnp.asarray(a, jnp.float32)[:, None, :]
                    for a in self.arrays()[:2])
    x = k_BxKxTxH.astype(jnp.float32) - shift
    rotation = self._rotation(rotation_KxHxH)
    if rotation is not None:
      x = jnp.einsum("kch,bkth->bktc", rotation, x,
                     precision=jax.lax.Precision.HIGHEST)
    return x / scale

  def denormalize(self, k_BxKxTxH: jax.Array,
                  rotation_KxHxH: jax.Array | None = None) -> jax.Array:
    """R^T (k * s) + mu: the inverse of `normalize`."""
    shift, scale = (jnp.asarray(a, jnp.float32)[:, None, :]
                    for a in self.arrays()[:2])
    x = k_BxKxTxH.astype(jnp.float32) * scale
    rotation = self._rotation(rotation_KxHxH)
    if rotation is not None:
      x = jnp.einsum("kch,bktc->bkth", rotation, x,
                     precision=jax.lax.Precision.HIGHEST)
    return x + shift
