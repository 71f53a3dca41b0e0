"""Expanding format x group size x scheme x residual into cache specs.

Every grid point quantizes K and V alike; the other cache settings (key_rope,
Hadamard rotations, sink, block size, attention_impl) come from the base
preset. A combination that cannot exist (fp8 with an asymmetric scheme, a
group size that does not divide head_dim, int3 codes that do not pack along
head_dim, ...) is skipped with the reason the library itself gives.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from kvq_jax.cache.spec import CacheSpec
from kvq_jax.capacity.kinds import check_head_dim
from kvq_jax.quant import FORMATS, QuantSpec
from kvq_jax.settings.short_specs import short_name

SCHEME_NAMES = {"sym": "symmetric", "symmetric": "symmetric",
                "narrow": "symmetric_narrow",
                "symmetric_narrow": "symmetric_narrow",
                "asym": "asymmetric", "asymmetric": "asymmetric"}


@dataclasses.dataclass(frozen=True)
class SweepPoint:
  """One configuration to evaluate: a display name and its cache spec."""

  name: str
  spec: CacheSpec
  source: str = "grid"  # "grid" or "point" (an explicitly named point).


@dataclasses.dataclass(frozen=True)
class Skipped:
  name: str
  reason: str


def _kv_spec(fmt: str, group_size: int, scheme: str) -> QuantSpec:
  if group_size == 0:
    return QuantSpec(format=fmt, scheme=scheme, granularity="per_token")
  return QuantSpec(format=fmt, scheme=scheme, granularity="per_group",
                   group_size=group_size)


def point_name(spec: CacheSpec) -> str:
  """'int4_g32' (K == V) or 'int8/int4_g32', plus ':rN' for a residual."""
  k, v = short_name(spec.k), short_name(spec.v)
  name = k if k == v else f"{k}/{v}"
  if spec.residual:
    name += f":r{spec.residual}"
  return name


def expand_grid(base: CacheSpec | None, formats: Sequence[str],
                group_sizes: Sequence[int], schemes: Sequence[str],
                residuals: Sequence[int], *, head_dim: int,
                num_layers: int) -> tuple[list[SweepPoint], list[Skipped]]:
  """The valid grid points (in grid order) and the skipped combinations.

  Args:
    base: the base preset's cache spec (its non-format settings are kept);
      None means the CacheSpec defaults.
    formats: QuantSpec formats (int8, int4, int3, int2, fp8_e4m3, fp8_e5m2).
    group_sizes: elements per group along head_dim; 0 means per_token.
    schemes: sym | narrow | asym (or symmetric | symmetric_narrow |
      asymmetric).
    residuals: full-precision residual windows (KIVI), 0 for none.
    head_dim, num_layers: the model's, to reject groups that cannot apply.
  """
  for fmt in formats:
    if fmt not in FORMATS:
      raise ValueError(f"--formats: {fmt!r} is not a format; allowed: "
                       f"{', '.join(FORMATS)}.")
  for scheme in schemes:
    if scheme not in SCHEME_NAMES:
      raise ValueError(
          f"--schemes: {scheme!r}; allowed: sym, narrow, asym.")
  for g in group_sizes:
    if isinstance(g, bool) or not isinstance(g, int) or g < 0:
      raise ValueError(f"--group_sizes: {g!r}; allowed: integers >= 1, or 0 "
                       "for per_token.")
  for r in residuals:
    if isinstance(r, bool) or not isinstance(r, int) or r < 0:
      raise ValueError(f"--residuals: {r!r}; allowed: integers >= 0.")
  base = base if base is not None else CacheSpec()
  points, skipped = [], []
  for fmt in formats:
    for g in group_sizes:
      for scheme in schemes:
        for residual in residuals:
          label = (f"{fmt}_{'tok' if g == 0 else f'g{g}'}_{scheme}"
                   f"{f':r{residual}' if residual else ''}")
          try:
            kv = _kv_spec(fmt, g, SCHEME_NAMES[scheme])
            spec = dataclasses.replace(base, k=kv, v=kv, layer_overrides=(),
                                       residual=residual, flush_block=None)
            check_head_dim(spec, head_dim, num_layers)
          except ValueError as e:
            skipped.append(Skipped(label, str(e)))
            continue
          points.append(SweepPoint(point_name(spec), spec))
  return points, skipped
