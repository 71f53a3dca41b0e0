"""Per-layer sensitivity sweep: which layers' K/V can take which format.

Probes (each a per-layer choice vector for `SelectiveForward`):
  * mode 'all':         every layer quantized with the base preset (K and V);
  * mode 'only':        one layer quantized, K only / V only / K and V, with
                        the base preset's format of that layer;
  * mode 'all_but_one': every layer but one quantized (K and V);
  * mode 'only' with an extra format: one layer's K (or V) in that format
                        (`formats`), the inputs of the allocator.
All probes share one compiled forward (choices are data) and one baseline
pass per batch (`eval.evaluate.evaluate_many`); each row records ΔPPL, KL
and top-1 agreement against the full-precision baseline.

Every probe computes what the real cache computes for the window:
token-local, per-channel (KIVI), codebook, static and outlier formats,
sinks, residual windows and flush blocks alike (`research.selective_cache`,
equal to 1e-4 in the logits on the tiny test model). It is not bit-exact:
the two paths round in different orders, a value at a rounding boundary
flips its code, and 30 layers amplify the flips. `run_sweep`'s reference
check measures the gap on every run; for SmolLM2 the all-layers KL was
0.00959 against the real cache's 0.00974 (kivi4 without residual) and
0.0807 against 0.0797 (kq3). The allocator's additive model over
one-layer probes is a further approximation, so an allocation is verified
end to end by `experiments.run` on the preset it writes.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Sequence

import numpy as np

from kvq_jax.eval.evaluate import Forward, evaluate_many
from kvq_jax.research.selective_forward import SelectiveForward
from kvq_jax.settings.short_specs import parse_short_spec, short_name

MODES = ("all", "only", "all_but_one")
TENSORS = ("K", "V", "KV")
METRICS = ("delta_ppl", "delta_ppl_ci95_low", "delta_ppl_ci95_high",
           "kl_mean", "top1_agreement", "ppl_quant", "ppl_quant_stderr")


@dataclasses.dataclass(frozen=True)
class Probe:
  """One measured configuration; `layer` is -1 for mode 'all'."""

  mode: str
  tensor: str
  layer: int
  k_format: str  # Short name of the format K gets where it is quantized.
  v_format: str
  k_choice_L: tuple[int, ...]
  v_choice_L: tuple[int, ...]

  @property
  def name(self) -> str:
    fmt = {"K": self.k_format, "V": self.v_format}.get(
        self.tensor, f"{self.k_format}/{self.v_format}")
    where = "" if self.layer < 0 else f"_L{self.layer}"
    return f"{self.mode}_{self.tensor}{where}_{fmt}"


def check_formats(formats: Sequence[str]) -> tuple[str, ...]:
  """Normalized short names of the extra formats (ValueError if invalid)."""
  out = []
  for text in formats:
    spec = parse_short_spec(text)
    if spec is None:
      raise ValueError(
          f"--formats entry {text!r}: full precision needs no measurement; "
          "allowed: quantized formats such as int8, int4_g32, int2_g32_asym, "
          "int2_pc32_asym.")
    out.append(short_name(spec))
  if len(set(out)) != len(out):
    raise ValueError(f"--formats={list(formats)} names a format twice.")
  return tuple(out)


def plan_probes(base_k: Sequence[str], base_v: Sequence[str],
                formats: Sequence[str] = (), all_but_one: bool = True, *,
                v_formats: Sequence[str] | None = None) -> list[Probe]:
  """The sweep for per-layer base formats `base_k`/`base_v` (short names).

  Choice 1 of layer i is the base format there; choice 2 + j is
  `formats[j]` for K and `v_formats[j]` for V (None: the same list, e.g.
  static formats are for keys only). Probes that would quantize nothing (a
  full-precision base layer) and extra-format probes that repeat a base
  probe are left out.
  """
  v_formats = formats if v_formats is None else v_formats
  num_layers = len(base_k)
  if len(base_v) != num_layers:
    raise ValueError(
        f"plan_probes: {len(base_k)} K formats but {len(base_v)} V formats.")
  off = (0,) * num_layers

  def one_hot(layer, choice):
    return tuple(choice if i == layer else 0 for i in range(num_layers))

  probes = [Probe("all", "KV", -1, "base", "base", (1,) * num_layers,
                  (1,) * num_layers)]
  for i in range(num_layers):
    k_on, v_on = base_k[i] != "fp", base_v[i] != "fp"
    if k_on:
      probes.append(Probe("only", "K", i, base_k[i], "fp", one_hot(i, 1), off))
    if v_on:
      probes.append(Probe("only", "V", i, "fp", base_v[i], off, one_hot(i, 1)))
    if k_on and v_on:
      probes.append(Probe("only", "KV", i, base_k[i], base_v[i],
                          one_hot(i, 1), one_hot(i, 1)))
  if all_but_one:
    for i in range(num_layers):
      rest = tuple(0 if j == i else 1 for j in range(num_layers))
      probes.append(Probe("all_but_one", "KV", i, "base", "base", rest, rest))
  for j, fmt in enumerate(formats):
    for i in range(num_layers):
      if fmt != base_k[i]:
        probes.append(Probe("only", "K", i, fmt, "fp", one_hot(i, 2 + j), off))
  for j, fmt in enumerate(v_formats):
    for i in range(num_layers):
      if fmt != base_v[i]:
        probes.append(Probe("only", "V", i, "fp", fmt, off, one_hot(i, 2 + j)))
  return probes


@dataclasses.dataclass(frozen=True)
class SweepResult:
  rows: list[dict]          # One per probe: Probe fields + METRICS.
  baseline: dict            # ppl_baseline, stderr, num_windows, ...
  timing: dict              # compile_s, sweep_s, num_forwards (baseline
                            # included), s_per_forward, retraces.
  checks: dict              # Only when a reference forward was given.


def run_sweep(forward: SelectiveForward, baseline: Forward,
              windows_WxT: np.ndarray, mask_T: np.ndarray,
              probes: Sequence[Probe], *, batch_size: int = 1,
              reference: Forward | None = None,
              progress: Callable[[int, int], None] | None = None
              ) -> SweepResult:
  """Evaluates every probe on the same windows (one compiled forward).

  `reference` (e.g. the real quantized cache of the base preset) is
  evaluated too and compared with the 'all' probe: `checks` holds the
  largest |logit difference| on the first batch and both ΔPPLs.
  """
  first = windows_WxT[:batch_size]
  start = time.perf_counter()
  np.asarray(forward(first, probes[0].k_choice_L, probes[0].v_choice_L))
  np.asarray(baseline(first))
  compile_s = time.perf_counter() - start
  traces_before = forward.num_traces
  total = len(probes) * -(-len(windows_WxT) // batch_size)
  calls = [0]

  def make(probe):
    def fn(batch):
      calls[0] += 1
      if progress is not None:
        progress(calls[0], total)
      return forward(batch, probe.k_choice_L, probe.v_choice_L)
    return fn

  quants = {p.name: make(p) for p in probes}
  if len(quants) != len(probes):
    raise ValueError("run_sweep: two probes share a name.")
  checks = {}
  if reference is not None:
    all_probe = next(p for p in probes if p.mode == "all")
    got = np.asarray(forward(first, all_probe.k_choice_L,
                             all_probe.v_choice_L))
    checks["max_abs_logit_diff_vs_real_cache"] = float(
        np.abs(got - np.asarray(reference(first))).max())
    quants["__reference__"] = reference
  start = time.perf_counter()
  results = evaluate_many(windows_WxT, mask_T, baseline, quants,
                          batch_size=batch_size)
  sweep_s = time.perf_counter() - start
  rows = []
  for p in probes:
    metrics = results[p.name].metrics()
    row = {"mode": p.mode, "tensor": p.tensor, "layer": p.layer,
           "k_format": p.k_format, "v_format": p.v_format}
    row.update({m: metrics[m] for m in METRICS})
    rows.append(row)
  any_result = results[probes[0].name].metrics()
  baseline_metrics = {k: any_result[k] for k in (
      "ppl_baseline", "ppl_baseline_stderr", "num_windows", "window_len",
      "num_scored_tokens")}
  if reference is not None:
    ref = results["__reference__"].metrics()
    all_row = next(r for r in rows if r["mode"] == "all")
    checks.update({"delta_ppl_real_cache": ref["delta_ppl"],
                   "delta_ppl_selective_all": all_row["delta_ppl"],
                   "kl_mean_real_cache": ref["kl_mean"],
                   "kl_mean_selective_all": all_row["kl_mean"]})
  forwards = (len(quants) + 1) * -(-len(windows_WxT) // batch_size)
  timing = {"compile_s": compile_s, "sweep_s": sweep_s,
            "num_probes": len(probes), "num_forwards": forwards,
            "s_per_forward": sweep_s / max(forwards, 1),
            "retraces_during_sweep": forward.num_traces - traces_before}
  return SweepResult(rows=rows, baseline=baseline_metrics, timing=timing,
                     checks=checks)
