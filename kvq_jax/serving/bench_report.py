"""serve_bench's outputs: the table, serve.json, serve.md and two PNGs.

serve.json: {"machine", "workload", "budget_bytes", "rows": [per kind: every
`bench.serve_kind` figure and `compare_to_baseline` ratio, the concurrency
trace, and per request its new tokens, TTFT and preemptions]}.
`experiments.report` lists it beside the quality results
(`report.task_sections`).
"""

from __future__ import annotations

import json
import pathlib
from typing import Sequence

from kvq_jax.bench.timing import machine_description

SERVE_FILE = "serve.json"

COLUMNS = (
    ("kind", "kind", "{}"),
    ("B/token", "effective_bytes_per_token", "{:.0f}"),
    ("pages", "pages_in_budget", "{}"),
    ("slots", "slots", "{}"),
    ("conc max", "max_concurrency", "{}"),
    ("conc mean", "mean_concurrency", "{:.2f}"),
    ("preempt", "preemptions", "{}"),
    ("req/s", "requests_per_s", "{:.3f}"),
    ("out tok/s", "output_tokens_per_s", "{:.1f}"),
    ("TTFT p50", "ttft_p50_s", "{:.2f}"),
    ("TTFT p99", "ttft_p99_s", "{:.2f}"),
    ("ITL p50 ms", "itl_p50_s", "{:.1f}", 1e3),
    ("ITL p99 ms", "itl_p99_s", "{:.1f}", 1e3),
    ("peak KV MiB", "peak_kv_bytes", "{:.2f}", 2 ** -20),
    ("RSS GiB", "peak_rss_gib", "{:.2f}"),
    ("compile s", "compile_s", "{:.1f}"),
    ("capacity x", "capacity_ratio", "{:.2f}"),
    ("conc x", "mean_concurrency_ratio", "{:.2f}"),
    ("req/s x", "requests_per_s_ratio", "{:.2f}"),
    ("predicted x", "predicted_speedup", "{:.2f}"),
    ("match", "output_match", "{:.3f}"),
    ("tok to div", "mean_tokens_to_divergence", "{:.1f}"),
)


def _cell(row: dict, column) -> str:
  key, fmt = column[1], column[2]
  value = row.get(key)
  if value is None:
    return "-"
  if len(column) > 3:
    value = value * column[3]
  return fmt.format(value)


def markdown_table(rows: Sequence[dict]) -> str:
  head = "| " + " | ".join(c[0] for c in COLUMNS) + " |"
  rule = "|" + "|".join("---" for _ in COLUMNS) + "|"
  body = ["| " + " | ".join(_cell(r, c) for c in COLUMNS) + " |"
          for r in rows]
  return "\n".join([head, rule, *body])


def _jsonable(row: dict) -> dict:
  out = {k: v for k, v in row.items() if k != "results"}
  out["requests_detail"] = [
      {"id": r.id, "new_ids": r.new_ids, "ttft_s": r.ttft,
       "preemptions": r.preemptions, "finish_reason": r.finish_reason,
       "reused_tokens": r.reused_tokens} for r in row["results"]]
  return out


def write(out_dir: str | pathlib.Path, rows: Sequence[dict], header: dict
          ) -> list[pathlib.Path]:
  """serve.json, serve.md, serve_rps.png and serve_concurrency.png under
  `out_dir`; returns the paths."""
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  machine = machine_description()
  (out / SERVE_FILE).write_text(json.dumps(
      {"machine": machine, **header, "rows": [_jsonable(r) for r in rows]},
      indent=1, default=str), encoding="utf-8")
  md = out / "serve.md"
  md.write_text(f"# serve_bench\n\n{machine}\n\n"
                + "".join(f"- {k}: {v}\n" for k, v in header.items())
                + "\n" + markdown_table(rows) + "\n", encoding="utf-8")
  paths = [out / SERVE_FILE, md]
  import matplotlib  # Plots only when writing; headless backend.
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(7, 3.5))
  ax.bar([r["kind"] for r in rows], [r["requests_per_s"] for r in rows])
  ax.set_ylabel("requests / s")
  ax.set_title(header.get("workload", ""), fontsize=8)
  fig.tight_layout()
  fig.savefig(out / "serve_rps.png", dpi=120)
  plt.close(fig)
  fig, ax = plt.subplots(figsize=(7, 3.5))
  for r in rows:
    trace = r["concurrency_trace"]
    ax.step([t for t, _ in trace], [n for _, n in trace], where="post",
            label=r["kind"])
  ax.set_xlabel("seconds")
  ax.set_ylabel("running requests")
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(out / "serve_concurrency.png", dpi=120)
  plt.close(fig)
  return paths + [out / "serve_rps.png", out / "serve_concurrency.png"]


def chain(rows: Sequence[dict]) -> str:
  """Per kind: capacity ratio -> mean-concurrency ratio -> requests/s
  ratio (and the capacity model's prediction)."""
  return "\n".join(
      f"{r['kind']}: capacity x{r['capacity_ratio']:.2f} -> mean concurrency "
      f"x{r['mean_concurrency_ratio']:.2f} -> requests/s "
      f"x{r['requests_per_s_ratio']:.2f} (capacity model "
      f"x{r['predicted_speedup']:.2f})" for r in rows)


def profile(rows: Sequence[dict]) -> str:
  """Per kind: the median decode-only step at each decode batch size it
  ran (ms; the most frequent sizes), and prefill's share of the time."""
  lines = []
  for r in rows:
    cost = r.get("decode_step_s_by_batch", {})
    sizes = sorted(cost, key=int)
    shown = ", ".join(f"{b}: {cost[b] * 1e3:.1f}" for b in sizes[-8:])
    lines.append(f"{r['kind']}: decode step ms by batch {{{shown}}}; "
                 f"prefill steps {r.get('prefill_time_share', 0):.1%} of "
                 "the time")
  return "\n".join(lines)
