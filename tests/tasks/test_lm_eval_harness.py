"""lm-evaluation-harness itself, through `python -m experiments.lm_eval`.

Three task YAMLs over a local JSONL this test writes (no dataset hub): a
multiple-choice task (loglikelihood), a rolling-perplexity task
(loglikelihood_rolling) and a generation task (generate_until), all three
requests lm-eval sends, on the tiny model with the kivi2 preset's cache.
Every logged sample must equal what the adapter (`lm_adapter.CacheLM`, whose
log-likelihoods tests/tasks/test_lm_adapter.py pins to the project's own
NLL) returns for the same arguments, to 1e-5.

lm-eval is the optional extra `kvq_jax[lmeval]`, which setup.sh and CI do
not install (datasets, pyarrow, pandas, scikit-learn: minutes of install
for CI's budget); where it is missing this file is skipped, with the
reason. Run it after `pip install -e '.[lmeval]'`.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("lm_eval", reason="the optional extra kvq_jax[lmeval]")

from kvq_jax.tasks.lm_eval_model import build  # noqa: E402 (needs lm_eval)
from tests.fixtures import tiny_hf_model  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
DOCS = [
    {"question": "the cat sat on the", "choices": ["mat", "sky", "dog"],
     "answer": 0, "text": "the cat sat on the mat and the dog sat too."},
    {"question": "one two three", "choices": ["four", "blue"],
     "answer": 0, "text": "one two three four five six seven eight."},
]
TASKS = {
    "kvq_mc": """
output_type: multiple_choice
doc_to_text: "{{question}}"
doc_to_choice: "{{choices}}"
doc_to_target: "{{answer}}"
metric_list:
  - metric: acc
""",
    "kvq_rolling": """
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{text}}"
metric_list:
  - metric: word_perplexity
""",
    "kvq_gen": """
output_type: generate_until
doc_to_text: "{{question}}"
doc_to_target: "{{choices[answer]}}"
generation_kwargs:
  until: ["."]
  max_gen_toks: 6
metric_list:
  - metric: exact_match
""",
}


def _write_tasks(root: pathlib.Path) -> pathlib.Path:
  data = root / "docs.jsonl"
  data.write_text("".join(json.dumps(d) + "\n" for d in DOCS),
                  encoding="utf-8")
  tasks = root / "tasks"
  tasks.mkdir()
  for name, body in TASKS.items():
    (tasks / f"{name}.yaml").write_text(
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n"
        f"  data_files:\n    test: {data}\ntest_split: test\n" + body,
        encoding="utf-8")
  return tasks


def _samples(out: pathlib.Path, task: str) -> list[dict]:
  [path] = out.rglob(f"samples_{task}_*.jsonl")
  lines = path.read_text(encoding="utf-8").splitlines()
  return sorted((json.loads(line) for line in lines),
                key=lambda s: s["doc_id"])


def test_the_harness_runs_every_request_kind_through_the_cache(tmp_path):
  model = tiny_hf_model.write_tiny_model(tmp_path / "m")
  tasks, out = _write_tasks(tmp_path), tmp_path / "out"
  args = f"model={model},config=kivi2,max_length=64"
  subprocess.run(
      [sys.executable, "-m", "experiments.lm_eval", "--model", "kvq_jax",
       "--model_args", args, "--tasks", ",".join(TASKS),
       "--include_path", str(tasks), "--output_path", str(out),
       "--log_samples"],
      cwd=REPO, check=True, timeout=600,
      env={**os.environ, "HF_DATASETS_OFFLINE": "1"})
  [results] = out.rglob("results_*.json")
  scores = json.loads(results.read_text(encoding="utf-8"))["results"]
  adapter = build(model=str(model), config="kivi2", max_length=64)

  mc = _samples(out, "kvq_mc")
  for sample, doc in zip(mc, DOCS):
    pairs = [(a["arg_0"], a["arg_1"]) for a in sample["arguments"].values()]
    assert [p[1] for p in pairs] == [" " + c for c in doc["choices"]]
    want = [lp for lp, _ in adapter.loglikelihood(pairs)]
    got = [float(r[0][0]) for r in sample["resps"]]
    assert got == pytest.approx(want, abs=1e-5)
    assert sample["acc"] == float(int(max(range(len(want)),
                                          key=want.__getitem__))
                                  == doc["answer"])
  assert scores["kvq_mc"]["acc,none"] == pytest.approx(
      sum(s["acc"] for s in mc) / len(mc))

  for sample, doc in zip(_samples(out, "kvq_rolling"), DOCS):
    [want] = adapter.loglikelihood_rolling([(doc["text"],)])
    assert float(sample["resps"][0][0]) == pytest.approx(want, abs=1e-5)

  for sample in _samples(out, "kvq_gen"):
    args = sample["arguments"]["gen_args_0"]
    assert args["arg_1"]["until"] == ["."]
    [want] = adapter.generate_until([(args["arg_0"], args["arg_1"])])
    assert sample["resps"][0][0] == want
