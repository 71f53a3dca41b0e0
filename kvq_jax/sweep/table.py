"""The sweep's CSV: one row per grid/named point (skipped ones included)."""

from __future__ import annotations

import csv
import math
import os

COLUMNS = ("name", "source", "status", "bits_per_element", "bytes_per_token",
           "fixed_bytes_per_sequence", "ppl", "ppl_baseline", "delta_ppl",
           "kl_mean", "top1_agreement", "num_windows", "window_len",
           "num_scored_tokens", "pareto")


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
  floats = ("bits_per_element", "bytes_per_token", "fixed_bytes_per_sequence",
            "ppl", "ppl_baseline", "delta_ppl", "kl_mean", "top1_agreement")
  rows = []
  with open(path, newline="", encoding="utf-8") as f:
    for raw in csv.DictReader(f):
      row = dict(raw)
      for key in ints + floats:
        value = row[key]
        row[key] = None if value == "" else (
            int(value) if key in ints else float(value))
      row["pareto"] = row["pareto"] == "True"
      rows.append(row)
  return rows


def finite(value) -> bool:
  return value is not None and math.isfinite(value)
