"""Passkey retrieval's tables (`longctx/passkey.py`): the CSV's rows, one
per preset x context x depth, and summary.md, one context x depth table per
preset with the cells the baseline fails marked."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from kvq_jax.longctx import decoding

if TYPE_CHECKING:
  from kvq_jax.longctx.passkey import PasskeyRequest

DAGGER = "\u2020"  # Marks a cell the baseline fails.


def cell_rows(samples: Sequence[dict], presets: Sequence[str]
              ) -> list[dict]:
  """One row per preset x context x depth (the baseline's rows first).

  Every row carries the baseline's score of the same cell; both_correct
  counts the samples the preset and the baseline both got right.
  """
  by_key: dict[tuple, list[dict]] = {}
  for s in samples:
    by_key.setdefault((s["preset"], s["context"], s["depth"]), []).append(s)
  cells = sorted({(s["context"], s["depth"]) for s in samples})
  rows = []
  for preset in presets:
    for context, depth in cells:
      # Empty for a preset run only where the baseline is right
      # (--presets_on=baseline_correct) in a cell the baseline fails.
      mine = by_key.get((preset, context, depth), [])
      base = by_key[(decoding.BASELINE, context, depth)]
      base_ok = {s["index"] for s in base if s["correct"]}
      correct = sum(s["correct"] for s in mine)
      rows.append({
          "preset": preset, "context": context, "depth": depth,
          "needle_depth": float(np.mean([s["needle_depth"] for s in base])),
          "correct": correct, "total": len(mine),
          "accuracy": correct / len(mine) if mine else float("nan"),
          "baseline_correct": len(base_ok), "baseline_total": len(base),
          "baseline_accuracy": len(base_ok) / len(base),
          "both_correct": sum(s["correct"] and s["index"] in base_ok
                              for s in mine),
          "baseline_fails": len(base_ok) < len(base)})
  return rows


def _cell_table(rows: Sequence[dict], preset: str,
                request: PasskeyRequest) -> list[str]:
  by_cell = {(r["context"], r["depth"]): r for r in rows
             if r["preset"] == preset}
  lines = ["| context \\ depth | " + " | ".join(
      f"{d}%" for d in request.depths) + " |",
           "|---:|" + "---:|" * len(request.depths)]
  for c in request.contexts:
    cells = []
    for d in request.depths:
      r = by_cell[(c, d)]
      failed = r["baseline_fails"] and preset != decoding.BASELINE
      mark = f" {DAGGER}" if failed else ""
      cells.append(f"{r['correct']}/{r['total']}{mark}" if r["total"]
                   else "—")
    lines.append(f"| {c} | " + " | ".join(cells) + " |")
  return lines


def summary_markdown(rows: Sequence[dict], presets: Sequence[str],
                     request: PasskeyRequest, header: dict,
                     info: dict) -> str:
  """summary.md: one context x depth table per preset, baseline first."""
  lines = [
      f"# Passkey retrieval: {header['model']}", "",
      f"Filler: {header['filler']}; {request.keys_per_cell} keys per cell "
      f"(seed {request.seed}); greedy answer of {request.answer_tokens} "
      "tokens, exact match of the 5 digits; prompts prefilled in chunks of "
      f"{request.prefill_chunk}, then one decode step per token.",
      "Cells: correct/total; rows: context (tokens, BOS included), columns: "
      "depth of the key sentence (percent of the filler).", ""]
  if request.presets_on == "baseline_correct":
    lines[-1:-1] = [
        "Presets answer only the prompts the baseline answers correctly "
        "(--presets_on=baseline_correct): a preset's k/n is k of those n; "
        "— marks a cell where the baseline answers none."]
  lines += decoding.info_lines(info)
  failed = [r for r in rows
            if r["preset"] == decoding.BASELINE and r["baseline_fails"]]
  for preset in presets:
    lines += ["", f"## {preset}", ""]
    lines += _cell_table(rows, preset, request)
    mine = [r for r in rows if r["preset"] == preset]
    correct = sum(r["correct"] for r in mine)
    total = sum(r["total"] for r in mine)
    lines += ["", f"Overall {correct}/{total}."]
    if preset != decoding.BASELINE:
      base_ok = sum(r["baseline_correct"] for r in mine)
      both = sum(r["both_correct"] for r in mine)
      lines.append(f"Of the {base_ok} samples the baseline answers "
                   f"correctly, {preset} answers {both}.")
  lines += [""]
  if failed:
    cells = ", ".join(f"{r['context']} tokens at {r['depth']}% "
                      f"({r['correct']}/{r['total']})" for r in failed)
    lines.append(
        f"{DAGGER} The baseline (full-precision cache) itself fails these "
        f"cells: {cells}. There a preset's score tells nothing about the "
        "cache (a preset that answers where the baseline does not only "
        "differs from it).")
  else:
    lines.append("The baseline answers every sample correctly.")
  return "\n".join(lines) + "\n"
