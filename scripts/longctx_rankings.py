"""Rank presets across the three long-context evaluations (issue 13).

  python scripts/longctx_rankings.py --curve=runs/issue13/curve_smollm2 \
      --passkey=runs/issue13/passkey_smollm2 \
      --agreement=runs/issue13/agreement_smollm2

Reads context_curve.csv, passkey.csv and agreement.csv from those workdirs
and prints one markdown table: per preset its rank (1 = closest to the
baseline) by ΔPPL at every context, by passkey retrieval (samples the
baseline answers that the preset also answers) and by mean per-step KL at
every agreement prefix length, each with the value it was ranked on. Ties
share a rank. Whether a rank change is real is for the reader to judge from
the CIs in each run's summary.md: this only lines the orders up.
"""

from __future__ import annotations

import argparse
import csv
import pathlib


def _read(path: pathlib.Path) -> list[dict]:
  with open(path, newline="", encoding="utf-8") as f:
    return list(csv.DictReader(f))


def _ranks(values: dict[str, float], lower_is_better: bool = True
           ) -> dict[str, int]:
  """Competition ranks (1, 2, 2, 4) of `values`."""
  ordered = sorted(values.values(), reverse=not lower_is_better)
  return {k: ordered.index(v) + 1 for k, v in values.items()}


def columns(curve_dir, passkey_dir, agreement_dir
            ) -> list[tuple[str, dict[str, str], dict[str, int]]]:
  """[(column title, preset -> shown value, preset -> rank)]."""
  out = []
  if curve_dir:
    rows = _read(pathlib.Path(curve_dir) / "context_curve.csv")
    for length in sorted({int(r["context"]) for r in rows}):
      at = {r["name"]: float(r["delta_ppl"]) for r in rows
            if int(r["context"]) == length}
      out.append((f"ΔPPL @{length}", {k: f"{v:+.3g}" for k, v in at.items()},
                  _ranks(at)))
  if passkey_dir:
    rows = [r for r in _read(pathlib.Path(passkey_dir) / "passkey.csv")
            if r["preset"] != "baseline"]
    both, base = {}, {}
    for r in rows:
      both[r["preset"]] = both.get(r["preset"], 0) + int(r["both_correct"])
      base[r["preset"]] = (base.get(r["preset"], 0)
                           + int(r["baseline_correct"]))
    kept = {k: both[k] / base[k] if base[k] else float("nan") for k in both}
    out.append(("passkey kept", {k: f"{both[k]}/{base[k]}" for k in both},
                _ranks(kept, lower_is_better=False)))
  if agreement_dir:
    rows = _read(pathlib.Path(agreement_dir) / "agreement.csv")
    for length in sorted({int(r["prefix_len"]) for r in rows}):
      at = {r["preset"]: float(r["kl_mean"]) for r in rows
            if int(r["prefix_len"]) == length}
      out.append((f"decode KL @{length}",
                  {k: f"{v:.3g}" for k, v in at.items()}, _ranks(at)))
  return out


def table(cols) -> str:
  presets = list(dict.fromkeys(k for _, shown, _ in cols for k in shown))
  lines = ["| preset | " + " | ".join(t for t, _, _ in cols) + " |",
           "|---|" + "---:|" * len(cols)]
  for p in presets:
    cells = [f"{rank[p]} ({shown[p]})" if p in shown else "–"
             for _, shown, rank in cols]
    lines.append(f"| {p} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--curve")
  parser.add_argument("--passkey")
  parser.add_argument("--agreement")
  args = parser.parse_args()
  print(table(columns(args.curve, args.passkey, args.agreement)))


if __name__ == "__main__":
  main()
