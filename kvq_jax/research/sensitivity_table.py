"""The sensitivity table: rows <-> CSV/JSON, matrices and a text summary.

JSON layout (`sensitivity.json`):
  {"meta": {preset, model, num_layers, head_dim, cache_dtype, fp_bits,
            base_k, base_v (per-layer short names), formats, config, ...},
   "baseline": {ppl_baseline, ...}, "timing": {...}, "checks": {...},
   "rows": [{mode, tensor, layer, k_format, v_format, delta_ppl,
             delta_ppl_ci95_low, delta_ppl_ci95_high, kl_mean,
             top1_agreement, ppl_quant, ppl_quant_stderr}, ...]}
(tables written before the CI existed have no delta_ppl_ci95_* entries).
"""

from __future__ import annotations

import csv
import json
import pathlib

import numpy as np

from kvq_jax.eval.uncertainty_format import describe_delta_ci
from kvq_jax.research.sensitivity import METRICS

CSV_FIELDS = ("mode", "tensor", "layer", "k_format", "v_format") + METRICS


def write_csv(path: str | pathlib.Path, rows: list[dict]) -> None:
  with open(path, "w", newline="", encoding="utf-8") as f:
    writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
    writer.writeheader()
    for row in rows:
      writer.writerow({k: row[k] for k in CSV_FIELDS})


def write_json(path: str | pathlib.Path, table: dict) -> None:
  pathlib.Path(path).write_text(json.dumps(table, indent=2), encoding="utf-8")


def load_json(path: str | pathlib.Path) -> dict:
  table = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
  for key in ("meta", "rows"):
    if key not in table:
      raise ValueError(
          f"sensitivity table {str(path)!r} has no {key!r} entry; allowed: "
          "the sensitivity.json written by experiments.layer_sensitivity.")
  return table


_SHARED_META = ("model", "eval_data", "scoring", "num_layers", "head_dim",
                "cache_dtype", "fp_bits", "full_precision_slots")
_SHARED_BASELINE = ("num_windows", "window_len")


def merge_tables(tables: list[dict], paths: list[str]) -> dict:
  """One table from sweeps of several presets on the same model and windows.

  The allocator then chooses among the formats of all of them (e.g. the
  int4_g32 sweep's int4_g32 probes beside an int2_g32_asym sweep's). Probes
  of one (tensor, layer, format) measured twice keep the first table's.
  Raises ValueError when the tables were measured differently.
  """
  if len(tables) != len(paths) or not tables:
    raise ValueError(f"merge_tables: {len(tables)} tables and {len(paths)} "
                     "paths; allowed: one path per table, at least one.")
  first = tables[0]
  for table, path in zip(tables[1:], paths[1:]):
    for section, keys in (("meta", _SHARED_META),
                          ("baseline", _SHARED_BASELINE)):
      for key in keys:
        if table[section].get(key) != first[section].get(key):
          raise ValueError(
              f"sensitivity tables {paths[0]!r} and {path!r} differ in "
              f"{section}.{key} ({first[section].get(key)!r} vs "
              f"{table[section].get(key)!r}); allowed: tables measured on "
              "the same model, text, windows, cache dtype and full-precision "
              "slots (sinks, residual, flush block).")
    a, b = first["baseline"]["ppl_baseline"], table["baseline"]["ppl_baseline"]
    if not np.isclose(a, b, rtol=1e-5, atol=0.0):
      raise ValueError(
          f"sensitivity tables {paths[0]!r} and {path!r} have baselines "
          f"{a:.6g} and {b:.6g}; allowed: the same windows (equal baseline).")
  if len(tables) == 1:
    return first
  meta = dict(first["meta"])
  meta["preset"] = "+".join(t["meta"]["preset"] for t in tables)
  meta["formats"] = sorted({f for t in tables for f in t["meta"]["formats"]})
  meta["extra_formats"] = sorted(
      {f for t in tables for f in t["meta"]["extra_formats"]})
  return {"meta": meta, "baseline": first["baseline"],
          "rows": [row for t in tables for row in t["rows"]]}


def only_matrix(rows: list[dict], num_layers: int, metric: str,
                tensor: str, fmt: str | None = None) -> np.ndarray:
  """[L] metric of the mode='only' probes of `tensor` (NaN: not measured).

  `fmt` None takes the base preset's probes (the first row per layer).
  """
  out = np.full(num_layers, np.nan)
  for row in rows:
    if row["mode"] != "only" or row["tensor"] != tensor:
      continue
    name = {"K": row["k_format"], "V": row["v_format"]}.get(tensor)
    if fmt is not None and name != fmt:
      continue
    if np.isnan(out[row["layer"]]):
      out[row["layer"]] = row[metric]
  return out


def all_but_one_vector(rows: list[dict], num_layers: int,
                       metric: str) -> np.ndarray:
  out = np.full(num_layers, np.nan)
  for row in rows:
    if row["mode"] == "all_but_one":
      out[row["layer"]] = row[metric]
  return out


def _ranked(values: np.ndarray, count: int, largest: bool) -> str:
  order = [i for i in np.argsort(values) if not np.isnan(values[i])]
  if largest:
    order = order[::-1]
  return ", ".join(f"L{i} ({values[i]:+.4g})" for i in order[:count])


def summary(table: dict, count: int = 3) -> str:
  """Human-readable findings: ranking, K vs V, additivity, recovery."""
  meta, rows = table["meta"], table["rows"]
  n = meta["num_layers"]
  lines = [f"Layer sensitivity of {meta['preset']} on {meta['model']} "
           f"({table['baseline']['num_windows']} windows x "
           f"{table['baseline']['window_len']}, ppl_baseline "
           f"{table['baseline']['ppl_baseline']:.4f})"]
  full = next(r for r in rows if r["mode"] == "all")
  if full.get("delta_ppl_ci95_low") is None:  # Older tables: no CI.
    dppl = f"{full['delta_ppl']:+.4f}"
  else:
    dppl = describe_delta_ci(full["delta_ppl"], full["delta_ppl_ci95_low"],
                             full["delta_ppl_ci95_high"]) + " (95% CI)"
  lines.append(f"  all layers quantized: dPPL {dppl}, "
               f"KL {full['kl_mean']:.5f}")
  for metric in ("delta_ppl", "kl_mean"):
    kv = only_matrix(rows, n, metric, "KV")
    if np.all(np.isnan(kv)):
      continue
    lines.append(f"  [{metric}] one layer K+V quantized:")
    lines.append(f"    most sensitive:  {_ranked(kv, count, True)}")
    lines.append(f"    least sensitive: {_ranked(kv, count, False)}")
    k, v = only_matrix(rows, n, metric, "K"), only_matrix(rows, n, metric, "V")
    both = ~np.isnan(k) & ~np.isnan(v)
    if both.any():
      lines.append(
          f"    K vs V: mean K-only {np.mean(k[both]):+.4g}, mean V-only "
          f"{np.mean(v[both]):+.4g}; K hurts more in "
          f"{int(np.sum(k[both] > v[both]))}/{int(both.sum())} layers")
    lines.append(f"    additivity: sum over layers of K+V-only "
                 f"{np.nansum(kv):+.4g} vs all layers {full[metric]:+.4g}")
  abo = all_but_one_vector(rows, n, "delta_ppl")
  if not np.all(np.isnan(abo)):
    lines.append("  all but one (K+V), keeping this layer full precision "
                 "leaves the lowest dPPL: " + _ranked(abo, count, False))
  for name, value in table.get("checks", {}).items():
    lines.append(f"  check {name}: {value:.3g}")
  timing = table.get("timing", {})
  if timing:
    lines.append(
        f"  time: compile {timing['compile_s']:.1f} s, sweep "
        f"{timing['sweep_s']:.1f} s ({timing['num_probes']} probes, "
        f"{timing['num_forwards']} forwards, {timing['s_per_forward']:.2f} "
        f"s each; {timing['retraces_during_sweep']} retraces)")
  return "\n".join(lines)
