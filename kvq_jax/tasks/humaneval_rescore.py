"""Re-scoring a HumanEval run's stored answers with the current harness.

`rescore(workdir)` reads workdir's humaneval.json, runs every stored
answer of every pass again through `humaneval.execute` (extraction, then
`sandbox.run_program` under the run's limits and today's isolation), and
rewrites the file (atomically) with the new verdicts, pass counts and
paired comparisons. Generation is not repeated: the answers are the run's
own. Each pass row gains "rescore": the pass count before, the isolation
used, and every problem whose verdict changed (before / after status and
the new detail). `humaneval_report.rescore_markdown` lists them.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import time

from kvq_jax.bench.timing import machine_description
from kvq_jax.tasks import humaneval, humaneval_report, sandbox
from kvq_jax.tasks import sandbox_isolation


def rescore(workdir: str | pathlib.Path,
            isolation: sandbox_isolation.Isolation | None = None) -> dict:
  """Re-runs workdir's stored answers (module docstring); returns the
  updated humaneval.json content."""
  started = time.perf_counter()
  workdir = pathlib.Path(workdir)
  path = workdir / humaneval_report.RESULTS_FILE
  if not path.is_file():
    raise ValueError(f"humaneval --rescore: {path} does not exist; run "
                     "experiments.humaneval with this --workdir first.")
  out = humaneval_report.read(path, "--rescore")
  limits = sandbox.Limits(**out["limits"])
  isolation = isolation or sandbox_isolation.available()
  print(sandbox_isolation.describe(isolation), flush=True)
  problems = {p["task_id"]: p for p in humaneval.load_problems()}
  for row in out["passes"]:
    records = out["records"][row["name"]]
    changed = []
    for record in records:
      new = humaneval.execute(problems[record["task_id"]], record["answer"],
                              out["prompt_format"], limits)
      if new["status"] != record["status"]:
        changed.append({"task_id": record["task_id"],
                        "before": record["status"], "after": new["status"],
                        "detail": new["detail"][-200:]})
      record.update(new)
    row["rescore"] = {"before_passed": row["passed"],
                      "isolation": isolation.label, "changed": changed}
    row.update(humaneval.verdict_counts(records))
  base = out["records"][humaneval.BASELINE]
  for row in out["passes"]:
    if row["name"] != humaneval.BASELINE:
      row["paired"] = humaneval.compare(base, out["records"][row["name"]])
  out["limits"] = dataclasses.asdict(limits)
  out["rescored"] = {"machine": machine_description(),
                     "isolation": isolation.label,
                     "seconds": time.perf_counter() - started}
  config_path = workdir / "config.json"
  config = (json.loads(config_path.read_text(encoding="utf-8"))
            if config_path.is_file() else {})
  humaneval_report.write(workdir, out, config)
  print(humaneval_report.rescore_markdown(out))
  return out
