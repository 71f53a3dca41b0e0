"""Programs that try to be scored passed without passing, or to hang, bloat,
crash or escape the harness; each must be scored failed, refused or timed
out, never passed, within the timeout plus one second, under bubblewrap
and under the fallback. Right programs must still pass.

Every attack is HumanEval/0 (`has_close_elements`) with a wrong body
(`return True`, which fails its tests) and the attack around it, built as
`experiments.humaneval` builds programs (`code_extract.program`).

HumanEval weakness, recorded: a candidate returning an object whose
`__eq__` is always true passes every `assert candidate(x) == y` the tests
contain; the tests' own asserts cannot catch it. The runner refuses
results of classes the program itself defined (`sandbox_runner._guarded`),
so it is scored failed here; an object of a library class with the same
trick (none in the standard library) would not be caught.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from kvq_jax.tasks import code_extract, humaneval, sandbox, sandbox_isolation
from kvq_jax.tasks.sandbox import Limits, run_program

PROBLEM = humaneval.load_problems(1)[0]
WRONG = "return True\n"
RIGHT = textwrap.dedent("""\
    for i, a in enumerate(numbers):
        for j, b in enumerate(numbers):
            if i != j and abs(a - b) < threshold:
                return True
    return False
""")
LIMITS = Limits(timeout_s=3.0, cpu_s=3)



def _body(text: str) -> str:
  return textwrap.indent(textwrap.dedent(text), "    ")


def _program(body: str = WRONG, after: str = "", before: str = ""
             ) -> sandbox.Program:
  """HumanEval/0 with `body`, `before` inside the function before it and
  `after` at module level after it, as a chat answer's code would be."""
  answer = ("```python\n" + textwrap.dedent(PROBLEM["prompt"]).split(
      '    """')[0].rstrip() + "\n" + _body(before) + _body(body) + "\n"
            + textwrap.dedent(after) + "```\n")
  extracted = code_extract.extract(answer, PROBLEM["entry_point"], "chat")
  return code_extract.program(PROBLEM, extracted)


def _run(program, isolation, limits=LIMITS):
  start = time.monotonic()
  out = run_program(program, limits, isolation)
  wall = time.monotonic() - start
  assert wall <= limits.timeout_s + 1, (wall, out)
  return out


def _not_passed(out: sandbox.Outcome) -> None:
  assert out.status in (sandbox.FAILED, sandbox.REFUSED, sandbox.TIMED_OUT)
  assert not out.passed


ATTACKS = {
    "main_guard_exit": 'if __name__ == "__main__":\n    import sys; sys.exit(0)\n',
    "main_guard_unittest": ('if __name__ == "__main__":\n    import unittest\n'
                            '    unittest.main()\n'),
    "exit_builtin": "exit()\n",
    "quit_builtin": "quit(0)\n",
    "raise_system_exit": "raise SystemExit\n",
    "sys_exit_0": "import sys\nsys.exit(0)\n",
    "os_exit_0": "import os\nos._exit(0)\n",
    "atexit_os_exit": "import atexit, os\natexit.register(os._exit, 0)\n",
    "unittest_main": "import unittest\nunittest.main(exit=True)\n",
    "sys_exit_patched": ("import sys, os\nsys.exit = lambda *a, **k: os._exit(0)\n"
                         "import builtins\nbuiltins.exit = builtins.quit = sys.exit\n"),
    "builtins_patched": ("import builtins\nbuiltins.abs = lambda x: 0\n"
                         "builtins.AssertionError = type('Quiet', (Exception,), {})\n"
                         "builtins.len = lambda x: 0\n"
                         "builtins.isinstance = lambda *a: False\n"
                         "builtins.print = lambda *a, **k: None\n"
                         "builtins.exec = lambda *a, **k: None\n"),
    "runner_globals_patched": (
        "import sys\nm = sys.modules['__main__']\n"
        "for name in ('VERDICT_FAILED', 'VERDICT_REFUSED'):\n"
        "    setattr(m, name, 'passed')\n"
        "m._guarded = lambda f, n: (lambda *a: True)\n"),
    "verdict_forged_on_fds": (
        "import os, sys\nprint('passed')\nsys.stdout.flush()\n"
        "for fd in range(1, 64):\n"
        "    try:\n        os.write(fd, b'0123456789abcdef passed\\n')\n"
        "    except OSError:\n        pass\n"),
    "thread_exits_during_tests": (
        "import os, threading, time\n"
        "threading.Thread(target=lambda: (time.sleep(0.2), os._exit(0)),"
        " daemon=True).start()\n"
        "_slow = has_close_elements\n"
        "def has_close_elements(numbers, threshold):\n"
        "    time.sleep(0.5)\n    return _slow(numbers, threshold)\n"),
    "always_equal_result": (
        "class AlwaysEqual:\n    def __eq__(self, other):\n        return True\n"
        "    __hash__ = object.__hash__\n"
        "def has_close_elements(numbers, threshold):\n"
        "    return AlwaysEqual()\n"),
    "fork_storm_50": (
        "import os, time\nkids = 0\n"
        "for _ in range(50):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n"
        "    kids += 1\n"
        "raise RuntimeError(f'forked all {kids}')\n"),
    "fork_exec_direct": (
        "import _posixsubprocess, os\n"
        "r, w = os.pipe()\n"
        "pid = _posixsubprocess.fork_exec([b'/bin/sleep', b'30'],"
        " [b'/bin/sleep'], True, (w,), None, None, -1, -1, -1, -1, -1, -1,"
        " r, w, False, True, -1, None, None, None, -1, None, False)\n"
        "raise RuntimeError(f'forked {pid}')\n"),
    "stderr_1gb": ("import os\nchunk = b'x' * (1 << 20)\n"
                   "for _ in range(1024):\n    os.write(2, chunk)\n"),
    "stdout_flood": ("import os\nchunk = b'passed ' * 150000\n"
                     "for _ in range(1024):\n    os.write(1, chunk)\n"),
    "disk_fill": ("for i in range(64):\n"
                  "    with open(f'fill{i}', 'wb') as f:\n"
                  "        f.write(b'x' * (15 << 20))\n"),
    "mkfifo": "import os\nos.mkfifo('pipe')\nopen('pipe', 'w')\n",
    "socket_localhost": None,  # Built per test: needs the listener's port.
    "read_etc_shadow": ("import sys\ntry:\n    text = open('/etc/shadow').read()\n"
                        "except OSError as e:\n    raise RuntimeError(f'no read: {e}')\n"
                        "raise RuntimeError('read shadow: ' + text[:40])\n"),
}


@pytest.mark.parametrize("name", sorted(k for k, v in ATTACKS.items()
                                        if v is not None))
def test_attack_is_never_passed(isolation, name):
  out = _run(_program(after=ATTACKS[name]), isolation)
  _not_passed(out)
  if name == "fork_storm_50":
    assert "forked all 50" not in out.detail, out.detail
  if name == "always_equal_result":
    assert "a class the program defined" in out.detail, out.detail
  if name == "disk_fill":  # 64 MiB in all: the tmpfs, or 4 files of 16.
    assert ("No space left" in out.detail
            or "more than 4 files" in out.detail), out.detail
  if name == "read_etc_shadow":
    assert "read shadow" not in out.detail, out.detail


def test_a_right_answer_passes_with_the_same_harness(isolation):
  out = _run(_program(RIGHT), isolation)
  assert out.passed, out.detail
  assert out.isolation == isolation.label


def test_a_right_answer_that_prints_writes_and_imports_passes(isolation):
  before = """\
      import collections, functools, hashlib, itertools, json, math, re
      print('working', math.pi, json.dumps([1]), flush=True)
      import sys; print('x' * 10000, file=sys.stderr)
      with open('scratch.txt', 'w') as f:
          f.write('ok')
      assert open('scratch.txt').read() == 'ok'
  """
  out = _run(_program(RIGHT, before=before), isolation)
  assert out.passed, out.detail


def test_a_right_answer_with_a_main_block_passes(isolation):
  # The __main__ block is a model's habit; it must not run, nor spoil a pass.
  after = 'if __name__ == "__main__":\n    raise SystemExit(1)\n'
  assert _run(_program(RIGHT, after=after), isolation).passed


def test_a_wrong_answer_fails_with_the_tests_assertion(isolation):
  out = _run(_program(WRONG), isolation)
  assert out.status == sandbox.FAILED
  assert "tests: AssertionError" in out.detail


def test_a_detached_child_dies_with_the_run(isolation):
  tag = f"{time.time_ns() % 10 ** 9}"
  after = f"""\
      import subprocess
      subprocess.Popen(['sh', '-c', 'while :; do echo x >> out{tag}; done'],
                       start_new_session=True)
      subprocess.Popen(['sleep', '30.{tag}'], start_new_session=True)
      import time; time.sleep(0.3)
  """
  _not_passed(_run(_program(after=after), isolation))
  time.sleep(0.2)
  survivors = []
  for entry in os.listdir("/proc"):
    if entry.isdigit():
      try:
        with open(f"/proc/{entry}/cmdline", "rb") as f:
          if f"30.{tag}".encode() in f.read():
            survivors.append(entry)
      except OSError:
        pass
  assert not survivors


def test_writes_through_dir_fd_stay_inside(isolation, tmp_path):
  target = tmp_path / "escaped.txt"
  after = f"""\
      import os
      fd = os.open({str(tmp_path)!r}, os.O_RDONLY)
      w = os.open('escaped.txt', os.O_WRONLY | os.O_CREAT, dir_fd=fd)
      os.write(w, b'x')
      os.mkdir('made', dir_fd=fd)
  """
  _not_passed(_run(_program(after=after), isolation))
  assert not target.exists() and not (tmp_path / "made").exists()
  assert list(tmp_path.iterdir()) == []


def test_removal_outside_is_impossible(isolation, tmp_path):
  keep = tmp_path / "keep.txt"
  keep.write_text("x")
  after = f"import os, shutil\nos.remove({str(keep)!r})\n"
  _not_passed(_run(_program(after=after), isolation))
  assert keep.read_text() == "x"


def test_the_parents_environment_is_unreadable(isolation):
  after = f"""\
      try:
          text = open('/proc/{os.getpid()}/environ', 'rb').read()
      except OSError as e:
          raise RuntimeError(f'no read: {{e}}')
      raise RuntimeError('read environ: ' + repr(text[:40]))
  """
  out = _run(_program(after=after), isolation)
  _not_passed(out)
  assert "read environ" not in out.detail, out.detail


def test_no_signal_reaches_a_process_outside(isolation):
  bystander = subprocess.Popen(["sleep", "30"])
  try:
    after = f"""\
        import os, signal
        for call in (lambda: os.kill({bystander.pid}, signal.SIGKILL),
                     lambda: signal.pidfd_send_signal(
                         os.pidfd_open({bystander.pid}), signal.SIGKILL)):
            try:
                call()
            except Exception:
                pass
    """
    _not_passed(_run(_program(after=after), isolation))
    time.sleep(0.1)
    assert bystander.poll() is None
  finally:
    bystander.kill()
    bystander.wait()


def test_no_socket_reaches_localhost(isolation):
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    after = f"""\
        import socket
        s = socket.create_connection(('127.0.0.1', {port}), timeout=1)
        s.sendall(b'hello')
    """
    _not_passed(_run(_program(after=after), isolation))
    with pytest.raises(socket.timeout):
      server.accept()


def test_a_1gb_stderr_write_does_not_grow_the_harness():
  # A fresh interpreter, so that its peak RSS is the harness's alone.
  script = textwrap.dedent(f"""\
      import resource
      from kvq_jax.tasks import sandbox
      before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
      out = sandbox.run_program({ATTACKS['stderr_1gb']!r},
                                sandbox.Limits(timeout_s=5, cpu_s=5))
      after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
      print(out.status, len(out.detail), (after - before) // 1024)
  """)
  done = subprocess.run([sys.executable, "-c", script], capture_output=True,
                        text=True, timeout=60, check=True)
  status, detail_len, grown_mib = done.stdout.split()[-3:]
  assert status in (sandbox.PASSED, sandbox.TIMED_OUT)  # Bare code: no test.
  assert int(detail_len) <= 2000
  assert int(grown_mib) < 64, done.stdout
