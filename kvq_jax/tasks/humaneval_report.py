"""HumanEval's outputs: humaneval.json, humaneval_summary.json (the same
without the per-problem records), humaneval.md, config.json.

humaneval.json: {"machine", "model", "prompt_format", ..., "passes": [per
pass: name, passed, pass_at_1, effective_bits, timings, counts of
extraction methods / statuses / finish reasons, and for a preset "paired"
(`humaneval.compare`)], "records": {pass: [per problem: task_id, passed,
status, detail, method, tokens, answer]}}. `experiments.report` lists its
summary (`summary_markdown`) beside the quality results.
"""

from __future__ import annotations

import json
import os
import pathlib

from kvq_jax.eval.uncertainty_format import describe_delta_ci

RESULTS_FILE = "humaneval.json"
SUMMARY_FILE = "humaneval_summary.json"  # Small: no answers, no records.


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


def rescore_markdown(out: dict) -> str:
  """Per pass: passed before and after a re-score, and what changed."""
  lines = ["| cache | passed before | passed after | verdicts changed |",
           "|---|---|---|---|"]
  for row in out["passes"]:
    info = row.get("rescore")
    if info is None:
      continue
    changes = ", ".join(f"{c['task_id']} {c['before']} -> {c['after']}"
                        for c in info["changed"]) or "none"
    lines.append(f"| {row['name']} | {info['before_passed']} | "
                 f"{row['passed']} | {len(info['changed'])}: {changes} |")
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
           workdir / "config.json", workdir / SUMMARY_FILE]
  _write_atomically(paths[0], json.dumps(out, indent=1, default=str))
  _write_atomically(paths[3], json.dumps(summary(out), indent=1,
                                         default=str) + "\n")
  paths[1].write_text(
      "# HumanEval\n\n" + summary_markdown(out)
      + "\n\nΔ: the preset's pass@1 minus the baseline's on the same "
      "problems, with the exact paired-bootstrap 95% CI; lost / gained: "
      "problems the baseline passes and the preset fails / the reverse; "
      "McNemar p: exact, two-sided.\n\n" + (
          "## Re-scored with the current harness (`experiments.humaneval "
          f"--rescore`, {out['rescored']['isolation']})\n\n"
          + rescore_markdown(out) + "\n\n" if "rescored" in out else "")
      + "## Per problem (P pass, . fail; "
      "the code extraction)\n\n" + problems_markdown(out) + "\n",
      encoding="utf-8")
  paths[2].write_text(config.to_json(indent=1) if hasattr(config, "to_json")
                      else json.dumps(config, default=str), encoding="utf-8")
  return paths


def summary(out: dict) -> dict:
  """humaneval.json without the per-problem records (answers, details):
  the run's settings and one row per pass, a few kB to commit under
  results/; `summary_markdown` and `rescore_markdown` read it as well."""
  return {k: v for k, v in out.items() if k != "records"}


def _write_atomically(path: pathlib.Path, text: str) -> None:
  """`text` to `path` through a temporary file and a rename: a reader (or
  --resume after a crash) sees the old file or the new one, never half."""
  partial = path.with_name(f"{path.name}.partial-{os.getpid()}")
  try:
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)
  finally:
    partial.unlink(missing_ok=True)


def read(path: pathlib.Path, purpose: str) -> dict:
  """humaneval.json at `path`, or a one-line ValueError if it is damaged."""
  try:
    out = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(out, dict) or not isinstance(out.get("passes"), list) \
        or not isinstance(out.get("records"), dict):
      raise ValueError("no 'passes' list or 'records' table")
    for row in out["passes"]:
      if row["name"] not in out["records"]:
        raise ValueError(f"pass {row['name']!r} has no records")
  except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
    raise ValueError(f"humaneval {purpose}: {path} is damaged ({e}); remove "
                     "it or use another --workdir.") from None
  return out
