"""Writing a run's results: config.json, metrics.json, summary.md."""

from __future__ import annotations

import json
import pathlib

ROWS = (
    ("PPL", "ppl_baseline", "ppl_quant", "{:.4f}"),
    ("PPL stderr", "ppl_baseline_stderr", "ppl_quant_stderr", "{:.4f}"),
    ("ΔPPL", None, "delta_ppl", "{:+.4f}"),
    ("KL(base‖quant) mean", None, "kl_mean", "{:.5f}"),
    ("top-1 agreement", None, "top1_agreement", "{:.4f}"),
    ("bits / element", None, "kv_bits_per_element", "{:.3f}"),
    ("KV bytes / token (all layers)", "kv_bytes_per_token_baseline",
     "kv_bytes_per_token", "{:.1f}"),
    ("compression vs bf16", None, "compression_vs_bf16", "{:.2f}x"),
    ("max context in budget", "max_context_tokens_baseline",
     "max_context_tokens_quant", "{:,}"),
    ("decode speed-up estimate", None, "speedup_estimate", "{:.2f}x"),
    ("decode tokens/s (measured)", "decode_tokens_per_s_baseline",
     "decode_tokens_per_s_quant", "{:.1f}"),
)


def _cell(metrics: dict, key: str | None, fmt: str) -> str:
  if key is None or metrics.get(key) is None:
    return ""
  return fmt.format(metrics[key])


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
    lines.append(f"| {label} | {_cell(metrics, base_key, fmt)} | "
                 f"{_cell(metrics, quant_key, fmt)} |")
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
