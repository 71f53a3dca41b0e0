"""The sandbox that runs generated code: passes, failures, timeouts and
limits under both boundaries, and how the boundary is chosen. Programs
that try to cheat or escape: test_sandbox_redteam.py."""

from __future__ import annotations

import pytest

from kvq_jax.tasks import sandbox, sandbox_isolation
from kvq_jax.tasks.sandbox import Limits, Program, run_program



def test_a_correct_solution_passes(isolation):
  out = run_program(Program("def f(x):\n  return 2 * x\n",
                            "def check(c):\n  assert c(3) == 6\n", "f"),
                    isolation=isolation)
  assert out.status == sandbox.PASSED and out.passed
  assert out.isolation == isolation.label


def test_a_failing_assert_fails(isolation):
  out = run_program("assert 1 + 1 == 3, 'wrong'\n", isolation=isolation)
  assert out.status == sandbox.FAILED and "AssertionError: wrong" in out.detail


def test_a_missing_entry_point_fails(isolation):
  out = run_program(Program("x = 1\n", "def check(c):\n  pass\n", "f"),
                    isolation=isolation)
  assert out.status == sandbox.FAILED and "defines no 'f'" in out.detail


def test_a_syntax_error_fails(isolation):
  assert run_program("def f(:\n", isolation=isolation).status == \
      sandbox.FAILED


def test_an_infinite_loop_times_out(isolation):
  out = run_program("while True:\n  pass\n", Limits(timeout_s=1, cpu_s=30),
                    isolation)
  assert out.status == sandbox.TIMED_OUT and "wall clock" in out.detail
  assert out.seconds < 2


def test_the_cpu_limit_stops_a_busy_program(isolation):
  out = run_program("while True:\n  pass\n", Limits(timeout_s=30, cpu_s=1),
                    isolation)
  assert out.status == sandbox.TIMED_OUT and "CPU limit" in out.detail


def test_the_memory_limit_holds(isolation):
  out = run_program("x = bytearray(2 * 2 ** 30)\n", Limits(memory_mib=512),
                    isolation)
  assert out.status == sandbox.FAILED and "MemoryError" in out.detail


def test_writing_inside_the_directory_is_allowed(isolation):
  out = run_program("import os\nopen('here.txt', 'w').write('x')\n"
                    "assert open('here.txt').read() == 'x'\n"
                    "assert os.environ['HOME'] == os.getcwd()\n",
                    isolation=isolation)
  assert out.passed, out.detail


def test_the_program_sees_a_bare_environment(isolation, monkeypatch):
  monkeypatch.setenv("KVQ_SECRET", "1")
  out = run_program("import os\nassert 'KVQ_SECRET' not in os.environ\n"
                    "assert set(os.environ) <= {'HOME', 'KVQ_SANDBOX_RUN',"
                    " 'PATH', 'TMPDIR', 'PWD', 'LC_CTYPE'}, sorted(os.environ)"
                    "\n",
                    isolation=isolation)
  assert out.passed, out.detail


def test_the_fallback_refuses_processes_and_sockets():
  fallback = sandbox_isolation.probe_fallback()
  for code in ("import subprocess\nsubprocess.run(['true'])\n",
               "import os\nos.system('true')\n",
               "import socket\nsocket.create_connection(('127.0.0.1', 9))\n"):
    assert run_program(code, isolation=fallback).status == sandbox.REFUSED


def test_bwrap_runs_the_program_as_nobody_in_new_namespaces():
  found = sandbox_isolation.probe_bwrap()
  if found is None:
    pytest.skip("bwrap is missing or cannot make namespaces here")
  out = run_program(
      "import os, socket\nassert os.getuid() == 65534, os.getuid()\n"
      "assert socket.gethostname() == 'sandbox'\n"
      "assert sorted(os.listdir('/')) == ['bin', 'dev', 'etc', 'lib', "
      "'lib64', 'proc', 'root', 'sandbox', 'tmp', 'usr'] or "
      "'home' not in os.listdir('/'), os.listdir('/')\n"
      "assert os.getpid() < 10, os.getpid()\n", isolation=found)
  assert out.passed, out.detail


def test_the_kind_is_chosen_by_argument_or_environment(monkeypatch):
  assert sandbox_isolation.available("fallback").kind == "fallback"
  monkeypatch.setenv(sandbox_isolation.ENV_VAR, "fallback")
  assert sandbox_isolation.available().kind == "fallback"
  monkeypatch.setenv(sandbox_isolation.ENV_VAR, "docker")
  with pytest.raises(ValueError, match="allowed: bwrap, fallback"):
    sandbox_isolation.available()


def test_without_bwrap_the_fallback_is_used_and_said(monkeypatch):
  sandbox_isolation.probe_bwrap.cache_clear()
  monkeypatch.setattr(sandbox_isolation.shutil, "which",
                      lambda name: None if name == "bwrap" else "/usr/bin/"
                      + name)
  try:
    assert sandbox_isolation.probe_bwrap() is None
    chosen = sandbox_isolation.available()
    assert chosen.kind == sandbox_isolation.FALLBACK
    line = sandbox_isolation.describe(chosen)
    assert line.startswith("sandbox: generated programs run under process")
    assert "apt-get install bubblewrap" in line and "\n" not in line
    with pytest.raises(ValueError, match="bwrap' asked for"):
      sandbox_isolation.available("bwrap")
  finally:
    sandbox_isolation.probe_bwrap.cache_clear()


def test_limits_are_checked():
  with pytest.raises(ValueError, match="timeout_s"):
    Limits(timeout_s=0)
  with pytest.raises(ValueError, match="disk_mib >= file_mib"):
    Limits(file_mib=32, disk_mib=16)
