"""The child side of `sandbox.run_program`, run as a script:

  python -I -B sandbox_guard.py ROOT PROGRAM MEMORY_MIB CPU_S FILE_MIB

It sets the resource limits (address space, CPU seconds, file size, no core
dumps; here rather than in a preexec_fn, which is unsafe in a threaded
parent such as a JAX process), installs an audit hook (which cannot be removed) before the program
runs, then executes PROGRAM (a file under ROOT) as `__main__`. The hook
refuses, with PermissionError:
  * opening a file for writing, creating, removing, renaming or changing
    the mode of anything outside ROOT (the run's temporary directory);
  * sockets (no network), subprocesses, exec, fork, spawn, signals to other
    processes, and loading shared libraries through ctypes.
Reading files stays allowed (imports need it). Exit status: 0 when the
program ran to the end, 1 with the exception's last line on stderr when it
raised, 3 when the hook refused something.

This module must import nothing from kvq_jax: it runs in a bare interpreter.
"""

import os
import resource
import sys
import traceback

_DENIED = frozenset({
    "socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo",
    "socket.sendto", "subprocess.Popen", "os.system", "os.exec",
    "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "os.kill",
    "os.killpg", "pty.spawn", "ctypes.dlopen", "os.startfile",
})
_PATH_EVENTS = {  # event -> positions of its path arguments
    "os.remove": (0,), "os.rmdir": (0,), "os.rename": (0, 1),
    "os.mkdir": (0,), "os.chmod": (0,), "os.chown": (0,), "os.link": (0, 1),
    "os.symlink": (0, 1), "os.truncate": (0,), "os.utime": (0,),
    "shutil.rmtree": (0,), "shutil.copyfile": (1,), "shutil.move": (0, 1),
    "os.chflags": (0,), "os.lchown": (0,),
}
_WRITE_FLAGS = (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC
                | os.O_APPEND)


class Refused(PermissionError):
  """What the sandbox does not allow."""


def _install(root: str) -> None:
  root = os.path.realpath(root)

  def inside(path) -> bool:
    if isinstance(path, int) or path is None:
      return True  # A descriptor already opened (under these rules).
    try:
      real = os.path.realpath(os.fsdecode(path))
    except (TypeError, ValueError):
      return False
    return real == root or real.startswith(root + os.sep)

  def hook(event, args):
    if event in _DENIED:
      raise Refused(f"sandbox: {event} is not allowed")
    if event == "open":
      path, mode, flags = (tuple(args) + (None, None, None))[:3]
      writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) \
          or (isinstance(flags, int) and flags & _WRITE_FLAGS)
      if writing and not inside(path):
        raise Refused(f"sandbox: writing {path!r} outside the run's "
                      "directory is not allowed")
    elif event in _PATH_EVENTS:
      for i in _PATH_EVENTS[event]:
        if i < len(args) and not inside(args[i]):
          raise Refused(f"sandbox: {event} on {args[i]!r} outside the "
                        "run's directory is not allowed")

  sys.addaudithook(hook)


def _limit(memory_mib: int, cpu_s: int, file_mib: int) -> None:
  mib = 2 ** 20
  resource.setrlimit(resource.RLIMIT_AS, (memory_mib * mib,) * 2)
  resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
  resource.setrlimit(resource.RLIMIT_FSIZE, (file_mib * mib,) * 2)
  resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def main() -> int:
  root, program = sys.argv[1], sys.argv[2]
  _limit(*(int(x) for x in sys.argv[3:6]))
  with open(program, encoding="utf-8") as f:
    source = f.read()
  os.chdir(root)
  _install(root)
  try:
    exec(compile(source, program, "exec"), {"__name__": "__main__"})
  except Refused as e:
    print(f"refused: {e}", file=sys.stderr)
    return 3
  except BaseException as e:  # pylint: disable=broad-except
    if isinstance(e, SystemExit) and e.code in (0, None):
      return 0
    last = traceback.format_exception_only(type(e), e)[-1].strip()
    print(f"failed: {last}"[:2000], file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
