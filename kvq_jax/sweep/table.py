"""The sweep's CSV (one row per grid/named point, skipped ones included) and
its printed table."""

from __future__ import annotations

import csv
import math
import os

from kvq_jax.eval.uncertainty_format import format_delta_ci, is_measurable

# Window-clustered paired statistics (`eval.paired`), from EvalResult.metrics.
PAIRED_COLUMNS = ("delta_ppl_ci95_low", "delta_ppl_ci95_high",
                  "delta_nll_mean", "delta_nll_stderr", "kl_stderr",
                  "top1_stderr")
COLUMNS = ("name", "source", "status", "bits_per_element",
           "stored_bits_per_element", "bits_per_element_at_4096",
           "bytes_per_token",
           "fixed_bytes_per_sequence", "ppl", "ppl_baseline", "delta_ppl",
           "kl_mean", "top1_agreement") + PAIRED_COLUMNS + (
               "num_windows", "window_len", "num_scored_tokens", "pareto",
               "full_precision")


def write_csv(path: str | os.PathLike, rows: list[dict]) -> None:
  """Writes `rows` (dicts keyed by COLUMNS; missing keys left empty)."""
  with open(path, "w", newline="", encoding="utf-8") as f:
    writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="raise")
    writer.writeheader()
    for row in rows:
      writer.writerow({k: row.get(k, "") for k in COLUMNS})


def read_csv(path: str | os.PathLike) -> list[dict]:
  """Rows back as dicts; numeric columns as float/int, '' as None."""
  ints = ("num_windows", "window_len", "num_scored_tokens")
  floats = ("bits_per_element", "stored_bits_per_element",
            "bits_per_element_at_4096", "bytes_per_token", "fixed_bytes_per_sequence",
            "ppl", "ppl_baseline", "delta_ppl", "kl_mean",
            "top1_agreement") + PAIRED_COLUMNS
  rows = []
  with open(path, newline="", encoding="utf-8") as f:
    for raw in csv.DictReader(f):
      row = dict(raw)
      for key in ints + floats:
        value = row.get(key, "")  # Paired columns: absent in older CSVs.
        row[key] = None if value == "" else (
            int(value) if key in ints else float(value))
      row["pareto"] = row["pareto"] == "True"
      rows.append(row)
  return rows


def finite(value) -> bool:
  return value is not None and math.isfinite(value)


def _delta_cells(row: dict) -> tuple[str, str]:
  """ΔPPL with its CI and whether the CI excludes 0, e.g.
  ('+0.08 [−0.02, +0.18]', 'no'); 'n/a' when there is no CI."""
  low, high = row.get("delta_ppl_ci95_low"), row.get("delta_ppl_ci95_high")
  if low is None or high is None:
    return f"{row['delta_ppl']:+.3f}", "n/a"
  if math.isnan(low) or math.isnan(high):
    return format_delta_ci(row["delta_ppl"], low, high), "n/a"
  return (format_delta_ci(row["delta_ppl"], low, high),
          "yes" if is_measurable(low, high) else "no")


def _optional(value, fmt: str) -> str:
  return "-" if value is None else fmt.format(value)


def text_table(rows: list[dict]) -> str:
  """The evaluated ('ok') rows as an aligned text table.

  dPPL is printed with its 95% CI (rounded to what the CI supports);
  'measurable' says whether that CI excludes 0.
  """
  cells = [(r["name"], f"{r['bits_per_element']:.2f}",
            _optional(r.get("stored_bits_per_element"), "{:.2f}"),
            f"{r['ppl']:.3f}",
            *_delta_cells(r), f"{r['kl_mean']:.4f}",
            f"{r['top1_agreement']:.3f}", "*" if r["pareto"] else "")
           for r in rows if r["status"] == "ok"]
  header = ("name", "eff. bits", "stored", "ppl", "dPPL [95% CI]",
            "measurable", "KL", "top1", "front")
  widths = [max(len(c[i]) for c in [header] + cells)
            for i in range(len(header))]
  lines = []
  for line in [header] + cells:
    lines.append("  ".join(
        c.ljust(w) if i in (0, 4, 5, 8) else c.rjust(w)
        for i, (c, w) in enumerate(zip(line, widths))).rstrip())
  lines.append("eff. bits: effective bits/element at the evaluated context "
               "(full-precision tokens charged); stored: codes + scales + "
               "zeros. dPPL: paired, 95% CI over windows; measurable: the CI "
               "excludes 0.")
  return "\n".join(lines)
