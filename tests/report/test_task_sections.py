"""experiments.report lists serve_bench's and HumanEval's results."""

from __future__ import annotations

import json

import pytest

from kvq_jax.eval.paired_binary import paired_pass_fail
from kvq_jax.report.results_table import write_report
from kvq_jax.report.task_sections import collect_sections
from kvq_jax.tasks import humaneval_report


def _humaneval_out() -> dict:
  base = [True, True, False]
  quant = [True, False, False]
  stats = paired_pass_fail(base, quant)
  rows = [{"name": "baseline", "passed": 2, "pass_at_1": 2 / 3,
           "effective_bits": 32.0, "seconds_per_problem": 1.5},
          {"name": "int8", "passed": 1, "pass_at_1": 1 / 3,
           "effective_bits": 8.25, "seconds_per_problem": 1.25,
           "paired": {"delta": stats.delta, "ci95_low": stats.ci95_low,
                      "ci95_high": stats.ci95_high, "lost": stats.lost,
                      "gained": stats.gained, "mcnemar_p": stats.mcnemar_p}}]
  records = {name: [{"task_id": f"HumanEval/{i}", "passed": p,
                     "method": "fence-def"} for i, p in enumerate(passed)]
             for name, passed in (("baseline", base), ("int8", quant))}
  return {"machine": "test machine", "model": "tiny", "num_problems": 3,
          "prompt_format": "chat", "max_new_tokens": 8,
          "cache_dtype": "float32", "passes": rows, "records": records}


def _serve_json() -> dict:
  row = {"kind": "bf16", "effective_bytes_per_token": 23040.0,
         "requests_per_s": 0.125, "capacity_ratio": 1.0,
         "mean_concurrency_ratio": 1.0, "requests_per_s_ratio": 1.0,
         "predicted_speedup": 1.0}
  return {"machine": "test machine", "model": "smollm2-135m",
          "workload": "prompt 128, output 512", "budget_bytes": 2 ** 20,
          "rows": [row]}


def test_both_files_become_sections(tmp_path):
  humaneval_report.write(tmp_path / "he", _humaneval_out(), {"a": 1})
  (tmp_path / "serve").mkdir()
  (tmp_path / "serve" / "serve.json").write_text(json.dumps(_serve_json()))
  (tmp_path / "bad").mkdir()
  (tmp_path / "bad" / "serve.json").write_text("{}")
  sections, notes = collect_sections(tmp_path)
  assert len(sections) == 2 and len(notes) == 1 and "bad/serve.json" in notes[0]
  he = next(s for s in sections if "HumanEval" in s)
  assert "| int8 | 8.25 | 33.3 | −33 [" in he
  assert "| 1 | 0 | 1 | 1.25 |" in he  # lost, gained, McNemar p, s/problem
  serve = next(s for s in sections if "Serving" in s)
  assert "| bf16 | 23040 |" in serve and "KV budget 1.00 MiB" in serve
  text = write_report(tmp_path)  # no quality results: the sections alone
  assert "## Serving and downstream tasks" in text and "skipped" in text


def test_an_empty_folder_is_still_an_error(tmp_path):
  with pytest.raises(ValueError, match="no quantized-cache results"):
    write_report(tmp_path)
