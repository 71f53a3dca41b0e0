"""The context curve's CSV (one row per point and context) and summary.md."""

from __future__ import annotations

import csv
import math
import os

from kvq_jax.eval.uncertainty_format import (describe_delta_ci,
                                             format_mean_stderr)

# Paired statistics (`eval.paired`) come from EvalResult.metrics under these
# names; `seconds` is the point's own forward at that context (compilation
# included), `baseline_seconds` the shared baseline's, `peak_rss_gib` the
# process's peak while evaluating that context (all its caches; the
# resident model included; `bench.process_memory`).
COLUMNS = (
    "name", "source", "context", "num_windows", "num_scored_tokens",
    "scoring", "prefill_chunk", "bits_per_element", "stored_bits_per_element",
    "ppl_quant", "ppl_quant_stderr", "ppl_baseline", "ppl_baseline_stderr",
    "delta_ppl", "delta_ppl_ci95_low", "delta_ppl_ci95_high",
    "delta_nll_mean", "delta_nll_stderr", "kl_mean", "kl_stderr",
    "top1_agreement", "top1_stderr", "seconds", "baseline_seconds",
    "peak_rss_gib", "full_precision")


def write_csv(path: str | os.PathLike, rows: list[dict]) -> None:
  """Writes `rows` (dicts with exactly the keys of COLUMNS)."""
  with open(path, "w", newline="", encoding="utf-8") as f:
    writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="raise")
    writer.writeheader()
    for row in rows:
      writer.writerow({k: row[k] for k in COLUMNS})


def _uncertainty_note(rows: list[dict]) -> str:
  text = ("ΔPPL [low, high]: paired per-token difference against the shared "
          "baseline, 95% CI clustered over windows, rounded to two "
          "significant digits of its half-width; 'no measurable change' when "
          "it contains 0. KL (nats) and top-1 agreement: mean ± window-"
          "clustered stderr. Baseline PPL: ± llama.cpp's per-token stderr.")
  if any(math.isnan(r["delta_ppl_ci95_low"]) for r in rows):
    text += (" A context with one window has no CI or stderr (NaN): the text "
             "held only one window of that length, or --num_windows=1.")
  return text


def summary_markdown(meta: dict, baseline: list[dict], rows: list[dict]
                     ) -> str:
  """Baseline per context, then every point's row per context (grouped by
  point, contexts ascending), the notes and the machine."""
  lines = [
      "# Perplexity vs context", "",
      f"model `{meta['model']}`, data `{meta['eval_data']}`; scoring "
      f"`{meta['scoring']}`; every window prefilled in chunks of "
      f"{meta['prefill_chunk']} tokens into an empty cache of the window's "
      "length; one baseline (full-precision cache) pass per window, shared "
      "by every preset.", "",
      "## Baseline (full-precision cache)", "",
      "| context | windows | scored | PPL | seconds | peak RSS (GiB) |",
      "|---|---|---|---|---|---|"]
  for b in baseline:
    lines.append(
        f"| {b['context']} | {b['num_windows']} | {b['num_scored_tokens']} | "
        f"{format_mean_stderr(b['ppl'], b['ppl_stderr'])} | "
        f"{b['seconds']:.1f} | {b['peak_rss_gib']:.2f} |")
  lines += [
      "", "## Quantized caches", "",
      "| preset | context | eff. bits | PPL | ΔPPL [95% CI] | KL | top-1 | "
      "seconds | peak RSS (GiB) |",
      "|---|---|---|---|---|---|---|---|---|"]
  order = {name: i for i, name in enumerate(dict.fromkeys(
      r["name"] for r in rows))}
  for r in sorted(rows, key=lambda r: (order[r["name"]], r["context"])):
    delta = describe_delta_ci(r["delta_ppl"], r["delta_ppl_ci95_low"],
                              r["delta_ppl_ci95_high"])
    lines.append(
        f"| {r['name']} | {r['context']} | {r['bits_per_element']:.2f} | "
        f"{r['ppl_quant']:.4g} | {delta} | "
        f"{format_mean_stderr(r['kl_mean'], r['kl_stderr'])} | "
        f"{format_mean_stderr(r['top1_agreement'], r['top1_stderr'])} | "
        f"{r['seconds']:.1f} | {r['peak_rss_gib']:.2f} |")
  lines += [
      "", _uncertainty_note(rows), "",
      "eff. bits: effective bits per cached K/V element at that context "
      "(codes, scales, zeros and every full-precision token charged). "
      "seconds: wall time of that cache's forward passes at that context, "
      "compilation included. peak RSS: the process's peak while evaluating "
      "that context (every cache at that context, the resident model "
      "included; the previous context's compiled programs and freed heap "
      "released first).", "",
      f"total evaluation: {meta['eval_seconds']:.1f} s, peak RSS "
      f"{meta['peak_rss_gib']:.2f} GiB", "",
      f"machine: {meta['machine']}", ""]
  return "\n".join(lines)
