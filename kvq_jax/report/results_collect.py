"""Finding the quantized-cache results under a folder, as `ResultRow`s.

Files read (recursively, in sorted path order; nothing else is opened):

  * `metrics.json` (written by `experiments.run`,
    `kvq_jax.report.run_summary.write_run`): one row. Preset, model,
    `eval_data`, windows and scoring come from the file itself.
  * `sweep.csv` (written by `experiments.sweep`, `kvq_jax.sweep.runner`): one
    row per evaluated point (status 'ok'); the sweep writes one combined CSV,
    not a metrics.json per point. Windows come from the CSV; model and
    scoring from the `config.json` beside it; the data from the
    `run_info.json` beside it (`eval_data`, recorded by sweeps since issue
    16; older sweeps leave it unknown, None).

A file that is not a quantized run's results (unreadable, without the
expected keys or columns, a baseline-only run, a sweep.csv without its
config.json) is skipped with a one-line note; so are a sweep's points it
skipped itself (invalid grid combinations).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import pathlib

from kvq_jax.sweep.table import read_csv

METRICS_FILE = "metrics.json"
SWEEP_FILE = "sweep.csv"

# metrics.json keys every row needs; the optional ones are read with .get.
_METRICS_KEYS = ("model", "eval_data", "num_windows", "window_len", "scoring",
                 "ppl_baseline", "ppl_quant", "delta_ppl", "kl_mean",
                 "top1_agreement", "kv_bits_per_element_effective",
                 "kv_bytes_per_token")
# sweep.csv columns every 'ok' row needs.
_SWEEP_COLUMNS = ("name", "bits_per_element", "bytes_per_token", "ppl",
                  "ppl_baseline", "delta_ppl", "kl_mean", "top1_agreement",
                  "num_windows", "window_len")


@dataclasses.dataclass(frozen=True)
class ResultRow:
  """One quantized cache evaluated against its full-precision baseline.

  Optional fields are None where the file did not record them (files
  written before the key existed).
  """

  name: str  # Preset or sweep point.
  source: str  # The file it came from, relative to the folder searched.
  kind: str  # 'point' (a preset or named point) or 'grid' (sweep grid).
  model: str
  data: str | None  # Evaluation data as recorded; None: not recorded.
  num_windows: int
  window_len: int
  scoring: str
  ppl_baseline: float
  ppl: float
  delta_ppl: float
  kl_mean: float
  top1_agreement: float
  effective_bits: float  # At window_len, full-precision tokens charged.
  bytes_per_token: float
  ppl_baseline_stderr: float | None = None
  delta_ppl_ci95_low: float | None = None
  delta_ppl_ci95_high: float | None = None
  kl_stderr: float | None = None
  top1_stderr: float | None = None
  stored_bits: float | None = None
  bits_at_4096: float | None = None
  fixed_bytes_per_sequence: float | None = None


@dataclasses.dataclass(frozen=True)
class Collected:
  """Every row found, and one note per file (or sweep point) left out."""

  folder: str  # As given; rows' sources are relative to it.
  rows: tuple[ResultRow, ...]
  notes: tuple[str, ...]


class _NotResults(Exception):
  """A file that holds no quantized-cache results; the message says why."""


def _missing(keys, present) -> list[str]:
  return [k for k in keys if present.get(k) is None]


def _from_metrics(path: pathlib.Path, source: str) -> list[ResultRow]:
  try:
    metrics = json.loads(path.read_text(encoding="utf-8"))
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise _NotResults(f"not readable as JSON ({e})") from e
  if not isinstance(metrics, dict):
    raise _NotResults("not a JSON object")
  if ("ppl_baseline" in metrics and "ppl_quant" not in metrics
      and "delta_ppl" not in metrics):
    raise _NotResults("a baseline-only run (no quantized cache to compare)")
  missing = _missing(_METRICS_KEYS, metrics)
  if missing:
    raise _NotResults(f"not run metrics (missing {', '.join(missing)})")
  return [ResultRow(
      name=str(metrics.get("preset") or path.parent.name), source=source,
      kind="point", model=str(metrics["model"]),
      data=str(metrics["eval_data"]),
      num_windows=int(metrics["num_windows"]),
      window_len=int(metrics["window_len"]), scoring=str(metrics["scoring"]),
      ppl_baseline=metrics["ppl_baseline"], ppl=metrics["ppl_quant"],
      delta_ppl=metrics["delta_ppl"], kl_mean=metrics["kl_mean"],
      top1_agreement=metrics["top1_agreement"],
      effective_bits=metrics["kv_bits_per_element_effective"],
      bytes_per_token=metrics["kv_bytes_per_token"],
      ppl_baseline_stderr=metrics.get("ppl_baseline_stderr"),
      delta_ppl_ci95_low=metrics.get("delta_ppl_ci95_low"),
      delta_ppl_ci95_high=metrics.get("delta_ppl_ci95_high"),
      kl_stderr=metrics.get("kl_stderr"),
      top1_stderr=metrics.get("top1_stderr"),
      stored_bits=metrics.get("kv_bits_per_element"),
      bits_at_4096=metrics.get("kv_bits_per_element_at_4096"),
      fixed_bytes_per_sequence=metrics.get("kv_fixed_bytes_per_sequence"))]


def _read_json(path: pathlib.Path) -> dict | None:
  """The JSON object in `path`, or None when absent or not an object."""
  try:
    value = json.loads(path.read_text(encoding="utf-8"))
  except (OSError, UnicodeDecodeError, json.JSONDecodeError):
    return None
  return value if isinstance(value, dict) else None


def _from_sweep(path: pathlib.Path, source: str,
                notes: list[str]) -> list[ResultRow]:
  config = _read_json(path.parent / "config.json")
  eval_config = (config or {}).get("eval")
  if (not config or not config.get("model") or not isinstance(eval_config, dict)
      or not eval_config.get("scoring")):
    raise _NotResults("no config.json with model and eval.scoring beside it "
                      "(the sweep's model and scoring are unknown)")
  data = (_read_json(path.parent / "run_info.json") or {}).get("eval_data")
  try:
    raw = read_csv(path)
  except (OSError, UnicodeDecodeError, csv.Error, KeyError, ValueError) as e:
    raise _NotResults(f"not a sweep CSV ({type(e).__name__}: {e})") from e
  rows, skipped = [], 0
  for r in raw:
    if r.get("status") != "ok":
      skipped += 1
      continue
    missing = _missing(_SWEEP_COLUMNS, r)
    if missing:
      raise _NotResults(f"point {r.get('name')!r} lacks "
                        f"{', '.join(missing)}")
    rows.append(ResultRow(
        name=r["name"], source=source,
        kind="grid" if r.get("source") == "grid" else "point",
        model=str(config["model"]), data=None if data is None else str(data),
        num_windows=r["num_windows"], window_len=r["window_len"],
        scoring=str(eval_config["scoring"]), ppl_baseline=r["ppl_baseline"],
        ppl=r["ppl"], delta_ppl=r["delta_ppl"], kl_mean=r["kl_mean"],
        top1_agreement=r["top1_agreement"],
        effective_bits=r["bits_per_element"],
        bytes_per_token=r["bytes_per_token"],
        delta_ppl_ci95_low=r.get("delta_ppl_ci95_low"),
        delta_ppl_ci95_high=r.get("delta_ppl_ci95_high"),
        kl_stderr=r.get("kl_stderr"), top1_stderr=r.get("top1_stderr"),
        stored_bits=r.get("stored_bits_per_element"),
        bits_at_4096=r.get("bits_per_element_at_4096"),
        fixed_bytes_per_sequence=r.get("fixed_bytes_per_sequence")))
  if skipped:
    notes.append(f"`{source}`: {skipped} point(s) the sweep skipped itself "
                 "(invalid combinations, reasons in the CSV)")
  if not rows:
    raise _NotResults("no evaluated ('ok') point")
  return rows


def collect_results(folder: str | os.PathLike) -> Collected:
  """Every metrics.json and sweep.csv under `folder` (module docstring).

  Raises ValueError when `folder` is not a directory, or holds no results.
  """
  root = pathlib.Path(folder)
  if not root.is_dir():
    raise ValueError(f"runs folder {str(folder)!r}: no such directory; "
                     "allowed: a folder holding experiments.run or "
                     "experiments.sweep output.")
  files = sorted(p for p in root.rglob("*")
                 if p.name in (METRICS_FILE, SWEEP_FILE) and p.is_file())
  rows, notes = [], []
  for path in files:
    source = path.relative_to(root).as_posix()
    try:
      if path.name == METRICS_FILE:
        rows += _from_metrics(path, source)
      else:
        rows += _from_sweep(path, source, notes)
    except _NotResults as e:
      notes.append(f"`{source}`: skipped, {e}")
  if not rows:
    detail = "; ".join(notes) if notes else "none found"
    raise ValueError(
        f"runs folder {str(folder)!r}: no quantized-cache results; allowed: "
        f"a folder with {METRICS_FILE} (experiments.run) or {SWEEP_FILE} "
        f"(experiments.sweep) files, at any depth ({detail}).")
  return Collected(str(folder), tuple(rows), tuple(notes))
