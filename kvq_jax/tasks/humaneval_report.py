"""HumanEval's outputs: humaneval.json, humaneval.md, config.json.

humaneval.json: {"machine", "model", "prompt_format", ..., "passes": [per
pass: name, passed, pass_at_1, effective_bits, timings, counts of
extraction methods / statuses / finish reasons, and for a preset "paired"
(`humaneval.compare`)], "records": {pass: [per problem: task_id, passed,
status, detail, method, tokens, answer]}}. `experiments.report` lists its
summary (`summary_markdown`) beside the quality results.
"""

from __future__ import annotations

import json
import pathlib

from kvq_jax.eval.uncertainty_format import describe_delta_ci

RESULTS_FILE = "humaneval.json"


def _pct(x: float) -> str:
  return f"{100 * x:.1f}"


def pass_line(row: dict) -> str:
  """One line per finished pass, printed as the run goes."""
  line = (f"humaneval {row['name']}: pass@1 {_pct(row['pass_at_1'])}% "
          f"({row['passed']}), {row['seconds_per_problem']:.2f} s/problem")
  if "paired" in row:
    p = row["paired"]
    line += (f"; Δ {100 * p['delta']:+.1f} pts, lost {p['lost']}, gained "
             f"{p['gained']}, McNemar p {p['mcnemar_p']:.3g}")
  return line


def _delta_cell(paired: dict) -> str:
  return describe_delta_ci(100 * paired["delta"], 100 * paired["ci95_low"],
                           100 * paired["ci95_high"])


def summary_markdown(out: dict) -> str:
  """The summary table: one row per pass."""
  head = (f"HumanEval, {out['model']}, {out['num_problems']} problems, "
          f"{out['prompt_format']} prompt, greedy, at most "
          f"{out['max_new_tokens']} new tokens, cache dtype "
          f"{out['cache_dtype']}; {out['machine']}")
  lines = [head, "",
           "| cache | eff. bits | pass@1 % | Δ pts [95% CI] | lost | gained "
           "| McNemar p | s/problem |",
           "|---|---|---|---|---|---|---|---|"]
  for row in out["passes"]:
    p = row.get("paired")
    paired = (["", "", "", ""] if p is None else
              [_delta_cell(p), str(p["lost"]), str(p["gained"]),
               f"{p['mcnemar_p']:.3g}"])
    cells = [row["name"], f"{row['effective_bits']:.2f}",
             _pct(row["pass_at_1"]), *paired,
             f"{row['seconds_per_problem']:.2f}"]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def problems_markdown(out: dict) -> str:
  """Per problem: pass (P) or fail (.) in every pass, and the extraction."""
  names = [row["name"] for row in out["passes"]]
  records = out["records"]
  lines = ["| task | " + " | ".join(names) + " |",
           "|---|" + "---|" * len(names)]
  for i, base in enumerate(records[names[0]]):
    cells = []
    for name in names:
      r = records[name][i]
      cells.append(("P" if r["passed"] else ".") + f" {r['method']}")
    lines.append(f"| {base['task_id']} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def write(workdir: pathlib.Path, out: dict, config) -> list[pathlib.Path]:
  """humaneval.json, humaneval.md and config.json under `workdir`."""
  workdir.mkdir(parents=True, exist_ok=True)
  paths = [workdir / RESULTS_FILE, workdir / "humaneval.md",
           workdir / "config.json"]
  paths[0].write_text(json.dumps(out, indent=1, default=str),
                      encoding="utf-8")
  paths[1].write_text(
      "# HumanEval\n\n" + summary_markdown(out)
      + "\n\nΔ: the preset's pass@1 minus the baseline's on the same "
      "problems, with the exact paired-bootstrap 95% CI; lost / gained: "
      "problems the baseline passes and the preset fails / the reverse; "
      "McNemar p: exact, two-sided.\n\n## Per problem (P pass, . fail; "
      "the code extraction)\n\n" + problems_markdown(out) + "\n",
      encoding="utf-8")
  paths[2].write_text(config.to_json(indent=1) if hasattr(config, "to_json")
                      else json.dumps(config, default=str), encoding="utf-8")
  return paths
