"""The sandbox that runs generated code: timeouts, failures, passes, and
what it refuses."""

from __future__ import annotations

import pathlib

import pytest

from kvq_jax.tasks import sandbox
from kvq_jax.tasks.sandbox import Limits, run_program


def test_a_correct_solution_passes():
  out = run_program("def f(x):\n  return 2 * x\nassert f(3) == 6\n")
  assert out.status == sandbox.PASSED and out.passed


def test_a_failing_assert_fails():
  out = run_program("assert 1 + 1 == 3, 'wrong'\n")
  assert out.status == sandbox.FAILED and "AssertionError: wrong" in out.detail


def test_a_syntax_error_fails():
  assert run_program("def f(:\n").status == sandbox.FAILED


def test_an_infinite_loop_times_out():
  out = run_program("while True:\n  pass\n", Limits(timeout_s=2, cpu_s=30))
  assert out.status == sandbox.TIMED_OUT and "wall clock" in out.detail
  assert out.seconds < 10


def test_the_cpu_limit_stops_a_busy_program():
  out = run_program("while True:\n  pass\n", Limits(timeout_s=30, cpu_s=1))
  assert out.status == sandbox.TIMED_OUT and "CPU limit" in out.detail


def test_the_memory_limit_holds():
  out = run_program("x = bytearray(2 * 2 ** 30)\n", Limits(memory_mib=512))
  assert out.status == sandbox.FAILED and "MemoryError" in out.detail


def test_writing_outside_the_directory_is_refused(tmp_path):
  target = tmp_path / "escaped.txt"
  out = run_program(f"open({str(target)!r}, 'w').write('x')\n")
  assert out.status == sandbox.REFUSED and "outside" in out.detail
  assert not target.exists()
  out = run_program(f"import os\nos.remove({str(tmp_path)!r})\n")
  assert out.status == sandbox.REFUSED
  assert tmp_path.exists()


def test_writing_inside_the_directory_is_allowed_and_removed():
  out = run_program("import os\nopen('here.txt', 'w').write('x')\n"
                    "print(os.getcwd())\nassert open('here.txt').read() == 'x'\n")
  assert out.passed


@pytest.mark.parametrize("code", [
    "import socket\nsocket.create_connection(('127.0.0.1', 9))\n",
    "import subprocess\nsubprocess.run(['true'])\n",
    "import os\nos.system('true')\n",
    "import os\nos.fork()\n",
])
def test_network_and_processes_are_refused(code):
  assert run_program(code).status == sandbox.REFUSED


def test_the_program_sees_a_bare_environment(monkeypatch):
  monkeypatch.setenv("KVQ_SECRET", "1")
  out = run_program("import os\nassert 'KVQ_SECRET' not in os.environ\n"
                    "assert os.environ['HOME'] == os.getcwd()\n")
  assert out.passed, out.detail


def test_limits_are_checked():
  with pytest.raises(ValueError, match="timeout_s"):
    Limits(timeout_s=0)
