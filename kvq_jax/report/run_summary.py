"""Writing a run's results: config.json, metrics.json, summary.md."""

from __future__ import annotations

import json
import math
import pathlib
from typing import Callable

from kvq_jax.eval.uncertainty_format import (describe_delta_ci,
                                             format_mean_stderr)

# A cell: a str.format pattern for metrics[key], or a function
# (metrics, key) -> str for cells that combine several keys.
Format = str | Callable[[dict, str], str]


def _delta_ppl(metrics: dict, key: str) -> str:
  """'+0.08 [−0.02, +0.18], no measurable change' (95% CI) when the CI keys
  are there, else the bare delta (metrics written before they existed)."""
  low, high = (metrics.get("delta_ppl_ci95_low"),
               metrics.get("delta_ppl_ci95_high"))
  if low is None or high is None:
    return f"{metrics[key]:+.4f}"
  return describe_delta_ci(metrics[key], low, high)


def _with_stderr(stderr_key: str, fallback: str, signed: bool = False
                 ) -> Callable[[dict, str], str]:
  """'mean ± window stderr', or `fallback` when the stderr key is absent."""
  def cell(metrics: dict, key: str) -> str:
    if metrics.get(stderr_key) is None:
      return fallback.format(metrics[key])
    return format_mean_stderr(metrics[key], metrics[stderr_key], signed)
  return cell


# (label, baseline key, quantized key, format). A row appears when at least
# one of its keys is in the metrics.
ROWS: tuple[tuple[str, str | None, str | None, Format], ...] = (
    ("PPL", "ppl_baseline", "ppl_quant", "{:.4f}"),
    ("PPL stderr (per token, as llama.cpp)", "ppl_baseline_stderr",
     "ppl_quant_stderr", "{:.4f}"),
    ("ΔPPL", None, "delta_ppl", _delta_ppl),
    ("ΔNLL / token ± stderr", None, "delta_nll_mean",
     _with_stderr("delta_nll_stderr", "{:+.5f}", signed=True)),
    ("KL(base‖quant) mean ± stderr", None, "kl_mean",
     _with_stderr("kl_stderr", "{:.5f}")),
    ("top-1 agreement ± stderr", None, "top1_agreement",
     _with_stderr("top1_stderr", "{:.4f}")),
    ("stored bits / element (codes+scales+zeros)", None,
     "kv_bits_per_element", "{:.3f}"),
    ("effective bits / element at window_len (incl. full-precision tokens)",
     None, "kv_bits_per_element_effective", "{:.3f}"),
    ("effective bits / element at 4,096 tokens", None,
     "kv_bits_per_element_at_4096", "{:.3f}"),
    ("effective bits / element at 32,768 tokens", None,
     "kv_bits_per_element_at_32768", "{:.3f}"),
    ("KV bytes / token (global layers; local rings are fixed bytes)",
     "kv_bytes_per_token_baseline", "kv_bytes_per_token", "{:.1f}"),
    ("KV bytes of the sliding-window layers' rings (fixed)", None,
     "kv_local_bytes_per_sequence", "{:,.0f}"),
    ("KV bytes / sequence at window_len", "kv_bytes_per_sequence_baseline",
     "kv_bytes_per_sequence", "{:,.0f}"),
    ("compression vs bf16", None, "compression_vs_bf16", "{:.2f}x"),
    ("max context in budget", "max_context_tokens_baseline",
     "max_context_tokens_quant", "{:,}"),
    ("decode speed-up, memory-bound model", None, "speedup_estimate",
     "{:.2f}x"),
    ("decode speed-up, measured", None, "decode_speedup_measured", "{:.2f}x"),
    ("decode tokens/s (measured)", "decode_tokens_per_s_baseline",
     "decode_tokens_per_s_quant", "{:.1f}"),
    ("evaluation s / window (both passes, compile incl.)", None,
     "eval_seconds_per_window", "{:.2f}"),
    ("peak RSS after evaluation, GiB", None, "peak_rss_gib_eval", "{:.2f}"),
)

# Free-text metrics printed under the table, in this order, when present.
NOTES = (("full precision", "full_precision_note"),
         ("speed", "speed_note"))


def _cell(metrics: dict, key: str | None, fmt: Format) -> str:
  if key is None or metrics.get(key) is None:
    return ""
  return fmt(metrics, key) if callable(fmt) else fmt.format(metrics[key])


def _uncertainty_note(metrics: dict) -> str | None:
  """How the quantized-vs-baseline uncertainties were computed."""
  if "delta_ppl_ci95_low" not in metrics:
    return None
  windows = metrics["num_windows"]
  text = ("uncertainties: ΔPPL [low, high] is a 95% CI, rounded to two "
          "significant digits of its half-width; 'no measurable change' when "
          "it contains 0. It and the ± stderrs come from paired per-token "
          f"differences, clustered over the {windows} windows (tokens of a "
          "window are correlated).")
  low = metrics["delta_ppl_ci95_low"]
  if low is None or math.isnan(low):
    text += (f" With {windows} window the standard errors and the CI are "
             "undefined (NaN): evaluate at least 2 windows.")
  return text


def summary_markdown(name: str, metrics: dict, machine: str) -> str:
  lines = [
      f"# {name}",
      "",
      f"model `{metrics['model']}`, data `{metrics['eval_data']}`: "
      f"{metrics['num_windows']} windows x {metrics['window_len']} tokens, "
      f"scoring `{metrics['scoring']}` ({metrics['num_scored_tokens']} "
      "scored predictions)",
      "",
      "| metric | baseline | quantized |",
      "|---|---|---|",
  ]
  for label, base_key, quant_key, fmt in ROWS:
    base, quant = _cell(metrics, base_key, fmt), _cell(metrics, quant_key, fmt)
    if base or quant:
      lines.append(f"| {label} | {base} | {quant} |")
  notes = [_uncertainty_note(metrics)] + [
      f"{title}: {metrics[key]}" for title, key in NOTES if metrics.get(key)]
  for note in notes:
    if note:
      lines += ["", note]
  lines += ["", f"machine: {machine}", ""]
  return "\n".join(lines)


def write_run(workdir: str | pathlib.Path, config_json: str, metrics: dict,
              summary: str) -> pathlib.Path:
  out = pathlib.Path(workdir)
  out.mkdir(parents=True, exist_ok=True)
  (out / "config.json").write_text(config_json)
  (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
  (out / "summary.md").write_text(summary)
  return out
