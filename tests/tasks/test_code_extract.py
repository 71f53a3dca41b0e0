"""Code extraction on hand-written answers, and the program it builds."""

from __future__ import annotations

import pytest

from kvq_jax.tasks.code_extract import (Extracted, extract, program,
                                        truncate_completion)
from kvq_jax.tasks.sandbox import run_program

PROBLEM = {
    "task_id": "Toy/0", "entry_point": "double",
    "prompt": "from typing import List\n\n\ndef double(xs: List[int]) -> "
              "List[int]:\n    \"\"\"Every element twice as large.\"\"\"\n",
    "test": "def check(candidate):\n    assert candidate([1, 2]) == [2, 4]\n"
            "    assert candidate([]) == []\n"}


def test_fenced_block_with_the_function():
  answer = ("Sure! Here it is:\n```python\nfrom typing import List\n\n"
            "def double(xs: List[int]) -> List[int]:\n    return [2 * x for "
            "x in xs]\n```\nIt doubles each element.")
  got = extract(answer, "double", "chat")
  assert got.method == "fence-def"
  assert got.code.strip().startswith("from typing import List")
  assert "It doubles" not in got.code
  assert run_program(program(PROBLEM, got)).passed


def test_the_block_that_defines_the_entry_point_wins():
  answer = ("```python\nprint(double([1]))\n```\n\n```py\ndef double(xs):\n"
            "    return [x + x for x in xs]\n```")
  got = extract(answer, "double", "chat")
  assert got.method == "fence-def" and "x + x" in got.code


def test_a_body_only_block_is_appended_to_the_prompt():
  got = extract("```python\n    return [2 * x for x in xs]\n```", "double",
                "chat")
  assert got == Extracted("    return [2 * x for x in xs]", "fence")
  assert run_program(program(PROBLEM, got)).passed


def test_an_unclosed_fence_runs_to_the_end():
  got = extract("```python\ndef double(xs):\n    return [2 * x for x in xs]",
                "double", "chat")
  assert got.method == "fence-def"
  assert run_program(program(PROBLEM, got)).passed


def test_no_fence_but_a_def():
  got = extract("You can write:\ndef double(xs):\n    return xs + xs\n",
                "double", "chat")
  assert got.method == "raw-def" and got.code.startswith("\ndef double")
  assert not run_program(program(PROBLEM, got)).passed  # wrong answer


def test_other_languages_are_not_taken():
  got = extract("```javascript\nconst double = xs => xs;\n```", "double",
                "chat")
  assert got.method == "raw"


def test_completion_stops_at_a_new_top_level_statement():
  answer = ("    return [2 * x for x in xs]\n\n\ndef helper():\n    pass\n"
            "if __name__ == '__main__':\n")
  assert truncate_completion(answer) == "    return [2 * x for x in xs]\n\n"
  got = extract(answer, "double", "completion")
  assert got.method == "completion"
  assert run_program(program(PROBLEM, got)).passed
  # An indented `if` is part of the body.
  assert truncate_completion("    if xs:\n        return xs\n") == (
      "    if xs:\n        return xs\n")


def test_unknown_prompt_format():
  with pytest.raises(ValueError, match="allowed: 'chat', 'completion'"):
    extract("x", "double", "fim")
