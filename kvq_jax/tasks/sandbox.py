"""Running untrusted generated code: `run_program(program, limits)`.

The threat is the mistakes a model makes (an answer that ends with
`sys.exit(0)` or `unittest.main()`, a fork in a loop, a huge print, a
stray write, a child left running), not a targeted attack on CPython: a
program that reads the runner's frames to steal the verdict's nonce is out
of scope.

A `Program` is the untrusted `code` (for HumanEval: the prompt and the
model's answer), the trusted `test` and the `entry_point` to check. It
passes only when `check(entry_point)` ran to its end (`sandbox_runner`):
  * the code runs in a namespace named `__candidate__`, not `__main__`;
  * SystemExit, or any exit before the tests ran, is a failure;
  * the verdict reaches this process on the child's original stdout, which
    the runner keeps on a private descriptor after pointing fd 1 at
    /dev/null, as "NONCE passed" with a random nonce written to the
    child's stdin; the exit status is not the channel: no verdict, no pass.

Isolation (`sandbox_isolation`): bubblewrap where it works (new user, pid,
network, ipc, uts namespaces; the interpreter and standard library
read-only; a size-capped tmpfs as the only writable place; a private
/proc; `--die-with-parent`), else a process with rlimits, the runner's
audit hook and `unshare`. `Outcome.isolation` records which.

The harness cannot be hung, bloated or crashed by the program:
  * stdout and stderr are read through `selectors` with byte caps (the
    verdict line, the last `STDERR_TAIL` bytes of stderr); the rest is
    read and dropped, so a 1 GB write costs time, not memory;
  * at the wall-clock timeout, or as soon as the program's process ends,
    every descendant dies: bwrap's (or unshare's) pid namespace, the
    process group, and a sweep of /proc for the run's marker variable;
  * rlimits: address space, CPU seconds, one file's size, processes
    (RLIMIT_NPROC), no core dumps; the total written is capped by the tmpfs
    size (bwrap) or by `Limits.disk_mib // Limits.file_mib` files (fallback);
  * the temporary directory's removal never raises.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import secrets
import selectors
import shutil
import signal
import subprocess
import tempfile
import time

from kvq_jax.tasks import sandbox_isolation
from kvq_jax.tasks.sandbox_isolation import BWRAP, Isolation

_RUNNER = pathlib.Path(__file__).with_name("sandbox_runner.py")
PASSED, FAILED, TIMED_OUT, REFUSED = "passed", "failed", "timed out", "refused"
STDERR_TAIL = 4096  # Bytes of stderr kept.
_VERDICT_CAP = 256  # Bytes of the verdict channel kept.
_DRAIN_S = 0.5  # Reading what is left after the program's process ended.


@dataclasses.dataclass(frozen=True)
class Limits:
  """What one program may use."""

  timeout_s: float = 10.0
  memory_mib: int = 1024
  cpu_s: int = 10
  file_mib: int = 16  # One file.
  disk_mib: int = 64  # All files together.
  processes: int = 16  # RLIMIT_NPROC (threads count).

  def __post_init__(self):
    for name in ("timeout_s", "memory_mib", "cpu_s", "file_mib", "disk_mib",
                 "processes"):
      if getattr(self, name) <= 0:
        raise ValueError(f"Limits.{name}={getattr(self, name)!r}: allowed: "
                         "> 0.")
    if self.disk_mib < self.file_mib:
      raise ValueError(f"Limits.disk_mib={self.disk_mib} < file_mib="
                       f"{self.file_mib}: allowed: disk_mib >= file_mib.")


@dataclasses.dataclass(frozen=True)
class Program:
  """Untrusted `code`, then trusted `test` and `check(entry_point)`.

  With `entry_point` None only `code` runs, and it passes when it runs to
  its end without raising or exiting.
  """

  code: str
  test: str = ""
  entry_point: str | None = None


@dataclasses.dataclass(frozen=True)
class Outcome:
  """How a program ended: status PASSED, FAILED, TIMED_OUT or REFUSED."""

  status: str
  detail: str  # stderr's tail (the exception), or why it was stopped.
  seconds: float
  isolation: str  # `sandbox_isolation.Isolation.label`.

  @property
  def passed(self) -> bool:
    return self.status == PASSED


class _Capped:
  """The last `cap` bytes of a stream (`head`: the first instead)."""

  def __init__(self, cap: int, head: bool = False):
    self.cap, self.head, self.data, self.total = cap, head, b"", 0

  def add(self, chunk: bytes) -> None:
    self.total += len(chunk)
    if self.head:
      self.data = (self.data + chunk[:self.cap])[:self.cap]
    else:
      self.data = (self.data + chunk)[-self.cap:]


def _command(isolation: Isolation, root: pathlib.Path, payload: pathlib.Path,
             limits: Limits, marker: str) -> tuple[list[str], str, dict]:
  """(command line, the program's writable directory, environment)."""
  numbers = [str(limits.memory_mib), str(limits.cpu_s), str(limits.file_mib),
             str(max(1, limits.disk_mib // limits.file_mib)),
             str(limits.processes)]
  python = [sandbox_isolation.interpreter(), "-I", "-S", "-B"]
  if isolation.kind == BWRAP:
    work = sandbox_isolation.BWRAP_WORK
    cmd = [*sandbox_isolation.bwrap_command(isolation.tool[0], str(_RUNNER),
                                            str(payload), limits.disk_mib),
           "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", work,
           "--setenv", "TMPDIR", work,
           "--setenv", sandbox_isolation.MARKER_VAR, marker,
           *python, sandbox_isolation.BWRAP_RUNNER,
           sandbox_isolation.BWRAP_PAYLOAD, work, BWRAP, *numbers,
           str(sandbox_isolation.NOBODY if sandbox_isolation.drops_to_nobody()
               else -1)]
    return cmd, work, {}
  work = str(root / "work")
  os.mkdir(work)
  cmd = [*isolation.tool, *python, str(_RUNNER), str(payload), work,
         sandbox_isolation.FALLBACK, *numbers, "-1"]
  return cmd, work, {"PATH": "/usr/bin:/bin", "HOME": work, "TMPDIR": work,
                     sandbox_isolation.MARKER_VAR: marker}


def _sweep(marker: str) -> None:
  """SIGKILL every process whose environment holds `marker` (fallback)."""
  needle = f"{sandbox_isolation.MARKER_VAR}={marker}".encode()
  for entry in os.listdir("/proc"):
    if not entry.isdigit() or int(entry) == os.getpid():
      continue
    try:
      with open(f"/proc/{entry}/environ", "rb") as f:
        if needle in f.read().split(b"\0"):
          os.kill(int(entry), signal.SIGKILL)
    except (OSError, ValueError):
      continue


def _kill_all(proc: subprocess.Popen, isolation: Isolation,
              marker: str) -> None:
  """Every descendant of `proc` dies; never raises."""
  for kill in (lambda: os.killpg(proc.pid, signal.SIGKILL),
               lambda: proc.kill()):
    try:
      kill()
    except OSError:
      pass
  if not isolation.pid_namespace:
    _sweep(marker)
  try:
    proc.wait(timeout=5)
  except subprocess.TimeoutExpired:
    pass


def _read_until(proc: subprocess.Popen, deadline: float,
                verdict: _Capped, stderr: _Capped) -> bool:
  """Reads both pipes until the process ends (True) or `deadline` (False)."""
  sel = selectors.DefaultSelector()
  sel.register(proc.stdout, selectors.EVENT_READ, verdict)
  sel.register(proc.stderr, selectors.EVENT_READ, stderr)
  ended = None
  try:
    while sel.get_map():
      now = time.monotonic()
      if ended is None and proc.poll() is not None:
        ended = now  # Drain what is left for a moment, then stop.
      limit = deadline if ended is None else min(deadline, ended + _DRAIN_S)
      if now >= limit:
        break
      for key, _ in sel.select(timeout=min(0.05, limit - now)):
        chunk = os.read(key.fileobj.fileno(), 1 << 16)
        if chunk:
          key.data.add(chunk)
        else:
          sel.unregister(key.fileobj)
  finally:
    sel.close()
  if ended is not None:
    return True
  try:  # Both pipes closed: wait for the process itself, up to the deadline.
    proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    return True
  except subprocess.TimeoutExpired:
    return False


def _score(code: int | None, nonce: str, verdict: _Capped, detail: str,
           limits: Limits) -> tuple[str, str]:
  lines = verdict.data.decode("ascii", "replace").splitlines()
  words = lines[0].split(" ") if len(lines) == 1 else []
  if len(words) == 2 and secrets.compare_digest(words[0], nonce):
    status = {"passed": PASSED, "failed": FAILED,
              "refused": REFUSED}.get(words[1])
    if status is not None:
      return status, detail
  cpu = {signal.SIGXCPU, signal.SIGKILL}
  if code is not None and (-code in cpu or code - 128 in cpu):
    return TIMED_OUT, f"CPU limit {limits.cpu_s} s (exit status {code})"
  why = (f"the program ended (exit status {code}) before its tests "
         "finished; no verdict")
  return FAILED, f"{why}. {detail}".strip()


def run_program(program: Program | str, limits: Limits = Limits(),
                isolation: Isolation | None = None) -> Outcome:
  """Runs `program` (a bare string: code only) under `limits`.

  Args:
    program: what to run (module docstring).
    limits: time, memory, CPU, disk, processes.
    isolation: the boundary; default `sandbox_isolation.available()`.
  """
  if isinstance(program, str):
    program = Program(program)
  isolation = isolation or sandbox_isolation.available()
  nonce, marker = secrets.token_hex(16), secrets.token_hex(8)
  root = pathlib.Path(tempfile.mkdtemp(prefix="kvq_exec_"))
  proc = None
  try:
    payload = root / "program.json"
    payload.write_text(json.dumps(dataclasses.asdict(program)),
                       encoding="utf-8")
    cmd, work, env = _command(isolation, root, payload, limits, marker)
    start = time.perf_counter()
    deadline = time.monotonic() + limits.timeout_s
    proc = subprocess.Popen(cmd, cwd=root if isolation.kind == BWRAP
                            else work, env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
      proc.stdin.write(f"{nonce}\n".encode())
      proc.stdin.close()
    except OSError:
      pass  # The program died before reading it: no verdict, scored below.
    verdict, stderr = _Capped(_VERDICT_CAP, head=True), _Capped(STDERR_TAIL)
    finished = _read_until(proc, deadline, verdict, stderr)
    seconds = time.perf_counter() - start
    code = proc.poll()
    _kill_all(proc, isolation, marker)
    if not finished:
      return Outcome(TIMED_OUT, f"wall clock > {limits.timeout_s} s", seconds,
                     isolation.label)
    detail = stderr.data.decode("utf-8", "replace").strip()[-2000:]
    status, detail = _score(code, nonce, verdict, detail, limits)
    return Outcome(status, detail, seconds, isolation.label)
  finally:
    if proc is not None:
      for stream in (proc.stdout, proc.stderr):
        try:
          stream.close()
        except OSError:
          pass
    shutil.rmtree(root, ignore_errors=True)
