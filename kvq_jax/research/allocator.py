"""Mixed-precision K/V formats per layer under a bits/element budget.

Additive damage model: the damage of an assignment (one format per tensor,
2L tensors: K and V of every layer) is the sum of the damages measured by
quantizing that tensor alone in that format (mode 'only' rows of the
sensitivity table, `metric` delta_ppl or kl_mean); full precision costs 0.
Cost: `kvq_jax.quant.cache_bits_per_element` (vectors of head_dim), full
precision `fp_bits` (the cache dtype's width, as the runner's
kv_bits_per_element counts it); the budget bounds the mean over the 2L
tensors (they hold equally many elements). With `FullPrecisionSlots` (the
sensitivity table's `meta.full_precision_slots`) a quantized format is
charged its effective bits at the table's context instead, as
`capacity.memory` counts them on a global layer: the sinks and the
window slots it keeps (R + F - 1, F its per-channel token group unless the
spec fixes a flush block) in the window dtype, the other tokens at its
stored bits; a per-channel format's window then costs what it holds (31
bfloat16 keys of a _pc32 format add 0.9 bits per element at 512 tokens).
Per-layer constants (calibrated levels and widths, the key affine) are
added with `constant_bits` and a format's fixed codebook, one copy per
model, with `fixed_tables` (`research.format_constants`: the arrays
`capacity.memory` charges); per-layer constants are rounded up to 1/1024
bit so the costs stay on one grid; without them they are left out (about 2 KiB per layer for calibrated keys: 0.17 bits
per key element at 512 tokens on SmolLM2).

`allocate` solves this multiple-choice knapsack exactly by dynamic
programming over the (rational, hence exactly discretized) bit costs; among
equal-damage optima it takes the cheapest.
"""

from __future__ import annotations

import dataclasses
import fractions
import itertools
import math
from typing import Mapping, Sequence

from absl import logging
import numpy as np

from kvq_jax.quant import cache_bits_per_element
from kvq_jax.settings.short_specs import parse_short_spec, short_name

FULL_PRECISION = "fp"
DAMAGE_METRICS = ("delta_ppl", "kl_mean")
MAX_STATES = 4_000_000
_CONSTANT_GRID = 1024  # Constants rounded up to 1/1024 bit.

DamageTable = Mapping[tuple[str, int, str], float]  # (tensor, layer, format)


@dataclasses.dataclass(frozen=True)
class FullPrecisionSlots:
  """The cache's full-precision slots and the context they are charged at.

  `flush_block` None: each format's own (its per-channel token group, 1
  for token-local formats), as `CacheSpec` resolves it.
  """

  context: int
  sink: int = 0
  residual: int = 0
  flush_block: int | None = None
  window_bits: float = 16.0

  def __post_init__(self):
    if not isinstance(self.context, int) or self.context < 1:
      raise ValueError(f"FullPrecisionSlots.context={self.context!r}: "
                       "allowed: a positive number of tokens.")

  def slots(self, name: str) -> int:
    """Full-precision slots of one tensor stored in format `name`."""
    spec = parse_short_spec(name)
    if spec is None:
      return 0
    flush = self.flush_block or (
        spec.group_size if spec.granularity == "per_channel" else 1)
    return self.sink + self.residual + flush - 1


def format_bits(name: str, head_dim: int, fp_bits: float,
                slots: FullPrecisionSlots | None = None) -> float:
  """Bits per element of the short-named format: stored bits, or with
  `slots` the effective bits at its context (module docstring)."""
  spec = parse_short_spec(name)
  if spec is None:
    return float(fp_bits)
  stored = cache_bits_per_element(spec, head_dim)
  if slots is None:
    return stored
  held = slots.slots(name)
  return (stored * max(0, slots.context - held)
          + held * slots.window_bits) / slots.context


def damage_table(table: dict, metric: str = "delta_ppl") -> dict:
  """{(tensor 'K'|'V', layer, format): damage} from a sensitivity table."""
  if metric not in DAMAGE_METRICS:
    raise ValueError(f"metric={metric!r}: allowed: "
                     f"{', '.join(DAMAGE_METRICS)}.")
  out = {}
  for row in table["rows"]:
    if row["mode"] != "only" or row["tensor"] not in ("K", "V"):
      continue
    fmt = row["k_format"] if row["tensor"] == "K" else row["v_format"]
    out.setdefault((row["tensor"], row["layer"], fmt), row[metric])
  return out


@dataclasses.dataclass(frozen=True)
class Allocation:
  k_formats: tuple[str, ...]
  v_formats: tuple[str, ...]
  mean_bits: float
  budget: float
  predicted_damage: float
  metric: str

  def layer_pairs(self) -> list[tuple[str, str]]:
    return list(zip(self.k_formats, self.v_formats))


def _fraction(x: float) -> fractions.Fraction:
  return fractions.Fraction(x).limit_denominator(1 << 12)


def allocate(damage: DamageTable, num_layers: int,
             k_candidates: Sequence[str], v_candidates: Sequence[str],
             budget: float, *, head_dim: int, fp_bits: float,
             metric: str = "delta_ppl",
             clip_negative: bool = True,
             slots: FullPrecisionSlots | None = None,
             constant_bits: Mapping[tuple[str, int, str], float] | None = None,
             fixed_tables: Mapping[str, tuple[str, float]] | None = None
             ) -> Allocation:
  """Minimum predicted damage with mean bits <= `budget` (module docstring;
  `slots`: charge effective bits, else stored bits; `constant_bits`:
  {(tensor, layer, format): bits} added to a format's cost there;
  `fixed_tables`: {format: (table id, bits on the mean)}, a codebook
  charged once if any tensor uses it: each set of tables is tried with its
  cost paid up front and the formats of the other tables left out).

  `clip_negative`: a measured damage below 0 (noise: quantizing a tensor
  rarely helps) counts as 0, so it cannot pay for damage elsewhere.
  Raises ValueError when a candidate was not measured for some tensor or
  when even the cheapest candidates exceed the budget.
  """
  if not k_candidates or not v_candidates:
    raise ValueError("allocate: k_candidates and v_candidates must be "
                     "non-empty lists of short format names.")
  names = {f: short_name(parse_short_spec(f))
           for f in list(k_candidates) + list(v_candidates)}
  tables = {key: bits for f, (key, bits) in (fixed_tables or {}).items()
            if f in names.values()}
  best, cheapest = None, math.inf
  for r in range(len(tables) + 1):
    for paid in itertools.combinations(sorted(tables), r):
      def allowed(f, paid=paid):
        return names[f] not in (fixed_tables or {}) or (
            fixed_tables[names[f]][0] in paid)
      k_c = [f for f in k_candidates if allowed(f)]
      v_c = [f for f in v_candidates if allowed(f)]
      up_front = sum(tables[key] for key in paid)
      if not k_c or not v_c:
        continue
      try:
        a = _allocate(damage, num_layers, k_c, v_c, budget - up_front,
                      head_dim=head_dim, fp_bits=fp_bits, metric=metric,
                      clip_negative=clip_negative, slots=slots,
                      constant_bits=constant_bits)
      except _BudgetError as e:
        cheapest = min(cheapest, e.cheapest + up_front)
        continue
      a = dataclasses.replace(a, mean_bits=a.mean_bits + up_front,
                              budget=float(budget))
      if best is None or (a.predicted_damage, a.mean_bits) < (
          best.predicted_damage, best.mean_bits):
        best = a
  if best is None:
    raise ValueError(
        f"budget={budget} bits/element is below the cheapest assignment "
        f"({cheapest:.4g}); allowed: >= that, or add cheaper candidates.")
  return best


def _grid(options, den: int, budget_units: fractions.Fraction,
          round_up: bool = False):
  """Integer costs on a 1/den grid: (units, cheapest, limit, DP span);
  round_up: costs rounded up to the grid (else exact multiples)."""
  to_int = ((lambda c: math.ceil(c * den)) if round_up
            else (lambda c: int(c * den)))
  units = [[(f, to_int(c), d) for f, c, d in opts] for opts in options]
  base = sum(opts[0][1] for opts in units)
  limit = math.floor(budget_units * den + 1e-9)
  span = min(limit - base, sum(opts[-1][1] - opts[0][1] for opts in units))
  return units, base, limit, span


class _BudgetError(ValueError):
  """The budget is below the cheapest assignment (`cheapest` bits)."""

  def __init__(self, cheapest: float):
    super().__init__(f"cheapest assignment {cheapest:.4g} bits")
    self.cheapest = cheapest


def _allocate(damage: DamageTable, num_layers: int,
              k_candidates: Sequence[str], v_candidates: Sequence[str],
              budget: float, *, head_dim: int, fp_bits: float,
              metric: str, clip_negative: bool,
              slots: FullPrecisionSlots | None,
              constant_bits: Mapping[tuple[str, int, str], float] | None
              ) -> Allocation:
  """`allocate` for one set of candidates (its fixed tables paid)."""
  names = {}
  for fmt in list(k_candidates) + list(v_candidates):
    names[fmt] = short_name(parse_short_spec(fmt))
  bits = {f: format_bits(f, head_dim, fp_bits, slots) for f in names}
  options = []  # per tensor: [(format, cost Fraction, damage)]
  for tensor, candidates in (("K", k_candidates), ("V", v_candidates)):
    for layer in range(num_layers):
      opts = []
      for fmt in candidates:
        canonical = names[fmt]
        if canonical == FULL_PRECISION:
          d = 0.0
        elif (tensor, layer, canonical) in damage:
          d = float(damage[(tensor, layer, canonical)])
        else:
          raise ValueError(
              f"allocate: no measured damage for {tensor} of layer {layer} "
              f"in format {canonical!r}; measure it with "
              f"experiments.layer_sensitivity --formats={canonical} or drop "
              "it from the candidates.")
        if clip_negative:
          d = max(d, 0.0)
        cost = _fraction(bits[fmt])
        if constant_bits and canonical != FULL_PRECISION:
          cost += fractions.Fraction(math.ceil(
              constant_bits[(tensor, layer, canonical)] * _CONSTANT_GRID - 1e-9),
              _CONSTANT_GRID)
        opts.append((canonical, cost, d))
      options.append(sorted(opts, key=lambda o: o[1]))
  den = math.lcm(*[o[1].denominator for opts in options for o in opts])
  budget_units = fractions.Fraction(budget).limit_denominator(1 << 20) * (
      2 * num_layers)
  units, base, limit, span = _grid(options, den, budget_units)
  if span + 1 > MAX_STATES:
    # Exact costs with a large common denominator (e.g. head_dim 256 with
    # per-layer constants): round every cost UP to a coarser power-of-two
    # grid, so an assignment that fits the rounded budget fits the exact
    # one; the achieved mean below is from the exact costs.
    grid = 1 << 20
    while grid > 1:
      units, base, limit, span = _grid(options, grid, budget_units,
                                       round_up=True)
      if span + 1 <= MAX_STATES:
        break
      grid //= 2
    logging.info("allocate: costs with denominator %d rounded up to 1/%d "
                 "bit (%d states)", den, grid, span + 1)
  if limit < base:
    raise _BudgetError(float(sum(opts[0][1] for opts in options))
                       / (2 * num_layers))
  if span + 1 > MAX_STATES:
    raise ValueError(
        f"allocate: {span + 1} cost states (bit costs with denominator "
        f"{den}) exceed {MAX_STATES}; use formats with coarser costs.")
  dp = np.full(span + 1, np.inf)
  dp[0] = 0.0
  choices = []
  for opts in units:
    new = np.full_like(dp, np.inf)
    pick = np.full(dp.shape, -1, np.int16)
    for j, (_, cost, d) in enumerate(opts):
      extra = cost - opts[0][1]
      if extra > span:
        continue
      cand = np.full_like(dp, np.inf)
      cand[extra:] = dp[:span + 1 - extra] + d
      better = cand < new
      new[better], pick[better] = cand[better], j
    dp = new
    choices.append(pick)
  best = np.min(dp)
  state = int(np.flatnonzero(dp <= best + 1e-12 * max(1.0, abs(best)))[0])
  chosen = []
  for opts, pick in zip(reversed(units), reversed(choices)):
    j = int(pick[state])
    chosen.append(opts[j])
    state -= opts[j][1] - opts[0][1]
  chosen.reverse()
  formats = [f for f, _, _ in chosen]
  total = sum(dict((f, c) for f, c, _ in opts)[f]
              for opts, f in zip(options, formats))
  return Allocation(
      k_formats=tuple(formats[:num_layers]),
      v_formats=tuple(formats[num_layers:]),
      mean_bits=float(total) / (2 * num_layers), budget=float(budget),
      predicted_damage=float(sum(d for _, _, d in chosen)), metric=metric)
