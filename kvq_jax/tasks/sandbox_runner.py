"""The child side of `sandbox.run_program`, run as a script:

  python -I -S -B sandbox_runner.py PAYLOAD ROOT MODE MEMORY_MIB CPU_S \
      FILE_MIB MAX_FILES NPROC DROP_TO

PAYLOAD is a JSON file {"code", "test", "entry_point"}; ROOT the one
directory the program may write; MODE 'bwrap' (the OS boundary isolates:
no hook) or 'fallback' (the audit hook below is the file boundary). The
parent writes a random nonce as the first line of standard input.

Order of events:
  1. read the nonce; keep the verdict channel (the original stdout) on a
     private descriptor and point fd 0 and fd 1 at /dev/null, so nothing
     the program prints can reach the parent's verdict pipe;
  2. with DROP_TO >= 0 (bwrap run as root, no user namespace), become that
     uid and gid (65534), which leaves no capabilities; then resource
     limits: address space, CPU seconds, size of one file,
     processes (RLIMIT_NPROC), no core dumps (here rather than in a
     preexec_fn, which is unsafe in a threaded parent such as a JAX
     process);
  3. fallback only: the audit hook (which cannot be removed) and the
     removal of calls that raise no audit event;
  4. `code` runs in a module namespace named `__candidate__`, never
     `__main__`: an `if __name__ == "__main__":` block does not run;
     SystemExit, KeyboardInterrupt or any exception here is a failure;
  5. `test` runs in a copy of that namespace whose builtins are the ones
     saved before step 4 (so a patched `builtins` module does not reach the
     tests), then `check(candidate)`, where `candidate` refuses to return an
     object of a class the program defined (a class whose `__eq__` is always
     true passes every `assert candidate(x) == y`: a HumanEval weakness the
     tests' own asserts cannot catch);
  6. only after `check` returned does the runner write
     "NONCE passed" on the private descriptor, then `os._exit(0)`, so
     neither threads nor atexit handlers run after the verdict. A failure
     writes "NONCE failed" or "NONCE refused" and its reason to stderr.

An exit anywhere before step 6 (os._exit, a signal, a limit) leaves no
verdict: the parent scores it failed whatever the exit status.

The fallback hook refuses, with PermissionError: writes, creations,
removals and renames outside ROOT (and through `dir_fd`), more than
MAX_FILES new files, opening a directory outside ROOT, reading files
outside the interpreter's prefix, ROOT and /dev's character devices,
sockets, subprocesses, exec, fork, spawn, signals to other processes and
ctypes. All its state is in a closure, not in module globals the program
could reassign.

This module must import nothing from kvq_jax: it runs in a bare
interpreter with only the standard library.
"""

import builtins
import json
import os
import resource
import signal
import sys
import traceback

VERDICT_PASSED, VERDICT_FAILED, VERDICT_REFUSED = "passed", "failed", "refused"


class Refused(PermissionError):
  """What the fallback sandbox does not allow."""


def _install_hook(root: str, max_files: int) -> None:
  """The fallback's file, process and network boundary (module docstring)."""
  root = os.path.realpath(root)
  readable = tuple(os.path.realpath(p) + os.sep for p in {
      sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix})
  realpath, fsdecode, isdir = os.path.realpath, os.fsdecode, os.path.isdir
  denied = frozenset({
      "socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo",
      "socket.sendto", "subprocess.Popen", "os.system", "os.exec",
      "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "os.kill",
      "os.killpg", "pty.spawn", "ctypes.dlopen", "ctypes.dlsym",
      "os.startfile", "os.setns", "os.unshare", "os.chroot"})
  path_events = {  # event -> (positions of path arguments, of dir_fd ones)
      "os.remove": ((0,), (1,)), "os.rmdir": ((0,), (1,)),
      "os.rename": ((0, 1), (2, 3)), "os.mkdir": ((0,), (2,)),
      "os.chmod": ((0,), (2,)), "os.chown": ((0,), (3,)),
      "os.link": ((0, 1), (2, 3)), "os.symlink": ((0, 1), (2,)),
      "os.truncate": ((0,), ()), "os.utime": ((0,), (3,)),
      "shutil.rmtree": ((0,), (1,)), "shutil.copyfile": ((1,), ()),
      "shutil.move": ((0, 1), ()), "os.chflags": ((0,), ()),
      "os.lchown": ((0,), ()),
  }
  write_flags = (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC
                 | os.O_APPEND)
  created = set()
  exists = os.path.exists

  def count_new(real) -> None:
    if real is not None and real not in created and not exists(real):
      created.add(real)
      if len(created) > max_files:
        raise Refused(f"sandbox: more than {max_files} files written")

  def resolved(path):
    if isinstance(path, int) or path is None:
      return None  # A descriptor already opened (under these rules).
    try:
      return realpath(fsdecode(path))
    except (TypeError, ValueError):
      return ""

  def inside(real) -> bool:
    return real is None or real == root or real.startswith(root + os.sep)

  def readable_path(real) -> bool:
    return (real is None or inside(real) or real.startswith(readable)
            or real in ("/dev/null", "/dev/zero", "/dev/urandom",
                        "/dev/random"))

  def hook(event, args):
    if event in denied:
      raise Refused(f"sandbox: {event} is not allowed")
    if event == "open":
      path, mode, flags = (tuple(args) + (None, None, None))[:3]
      real = resolved(path)
      writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) \
          or (isinstance(flags, int) and flags & write_flags)
      if writing and not inside(real):
        raise Refused(f"sandbox: writing {path!r} outside the run's "
                      "directory is not allowed")
      if not writing and not readable_path(real):
        raise Refused(f"sandbox: reading {path!r} is not allowed")
      if real is not None and not inside(real) and isdir(real):
        raise Refused(f"sandbox: opening the directory {path!r} is not "
                      "allowed")
      if writing:
        count_new(real)
    elif event in path_events:
      paths, dir_fds = path_events[event]
      for i in dir_fds:
        if i < len(args) and args[i] is not None:
          raise Refused(f"sandbox: {event} with dir_fd is not allowed")
      for i in paths:
        if i < len(args) and not inside(resolved(args[i])):
          raise Refused(f"sandbox: {event} on {args[i]!r} outside the "
                        "run's directory is not allowed")
      if event == "os.mkdir":
        count_new(resolved(args[0]))

  # Calls that raise no audit event in CPython 3.10-3.12: removed, so that
  # using them fails (AttributeError / ImportError) instead of escaping.
  import subprocess  # pylint: disable=import-outside-toplevel,unused-import
  import posix  # pylint: disable=import-outside-toplevel
  for module, names in ((os, ("mkfifo", "mknod", "pidfd_open", "fork",
                              "forkpty", "register_at_fork")),
                        (posix, ("mkfifo", "mknod", "pidfd_open", "fork",
                                 "forkpty")),
                        (signal, ("pidfd_send_signal", "pthread_kill"))):
    for name in names:
      if hasattr(module, name):
        delattr(module, name)
  sys.modules["_posixsubprocess"] = None  # import -> ImportError
  if hasattr(subprocess, "_posixsubprocess"):
    delattr(subprocess, "_posixsubprocess")
  sys.addaudithook(hook)


def _limit(memory_mib: int, cpu_s: int, file_mib: int, nproc: int) -> None:
  mib = 2 ** 20
  resource.setrlimit(resource.RLIMIT_AS, (memory_mib * mib,) * 2)
  resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
  resource.setrlimit(resource.RLIMIT_FSIZE, (file_mib * mib,) * 2)
  resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
  resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


class _UnsafeReturn(AssertionError):
  """The candidate returned an object of a class the program defined."""


def _guarded(candidate, module_name: str, unsafe=_UnsafeReturn):
  """`candidate` that refuses results of classes defined by the program."""

  def check_value(value, depth=0):
    cls = type(value)
    if getattr(cls, "__module__", None) == module_name:
      raise unsafe(
          f"the candidate returned a {cls.__name__!r} object, a class the "
          "program defined (its comparisons are not trusted)")
    if depth < 4 and isinstance(value, (list, tuple, set, frozenset)):
      for item in value:
        check_value(item, depth + 1)
    elif depth < 4 and isinstance(value, dict):
      for key, item in value.items():
        check_value(key, depth + 1)
        check_value(item, depth + 1)

  def guarded(*args, **kwargs):
    result = candidate(*args, **kwargs)
    check_value(result)
    return result

  return guarded


def main() -> None:
  # Bound before the program runs: it may patch os, sys, builtins or this
  # module's globals (sys.modules["__main__"]).
  write, exit_now, encode = os.write, os._exit, str.encode
  passed, failed, refused = VERDICT_PASSED, VERDICT_FAILED, VERDICT_REFUSED
  refused_type, guarded, describe = (Refused, _guarded,
                                     traceback.format_exception_only)
  builtin_names = builtins.__dict__
  payload_path, root, mode = sys.argv[1:4]
  memory_mib, cpu_s, file_mib, max_files, nproc, drop_to = (
      int(x) for x in sys.argv[4:10])
  nonce = sys.stdin.readline().strip()
  verdict_fd = os.dup(1)  # Not inheritable (PEP 446).
  null = os.open(os.devnull, os.O_RDWR)
  os.dup2(null, 0)
  os.dup2(null, 1)
  os.close(null)
  sys.stdin = open(0, closefd=False)  # pylint: disable=consider-using-with
  sys.stdout = open(1, "w", closefd=False)  # pylint: disable=consider-using-with

  def verdict(status: str, detail: str = "") -> None:
    if detail:
      print(f"{status}: {detail}"[:2000], file=sys.__stderr__, flush=True)
    write(verdict_fd, encode(f"{nonce} {status}\n"))
    exit_now(0)

  with open(payload_path, encoding="utf-8") as f:
    payload = json.load(f)
  if drop_to >= 0:  # Root without a user namespace: become nobody.
    os.setgroups([])
    os.setgid(drop_to)
    os.setuid(drop_to)
  _limit(memory_mib, cpu_s, file_mib, nproc)
  # The soft CPU limit's SIGXCPU ends the run with status 128 + SIGXCPU, by
  # a handler: the default action does not apply to a pid namespace's
  # pid 1 (the runner under `unshare -p -f`); the hard limit's SIGKILL
  # follows a second later if this is bypassed.
  signal.signal(signal.SIGXCPU,
                lambda *_: exit_now(128 + int(signal.SIGXCPU)))
  os.chdir(root)
  if mode == "fallback":
    _install_hook(root, max_files)
  module_name = "__candidate__"
  pristine = dict(builtin_names)
  namespace = {"__name__": module_name, "__builtins__": builtins}

  def restore_builtins() -> None:
    builtin_names.clear()
    builtin_names.update(pristine)

  def failure(stage: str, e: BaseException) -> None:
    restore_builtins()
    if isinstance(e, SystemExit):
      when = "before" if stage == "program" else "while"
      verdict(failed, f"the program exited (SystemExit({e.code!r})) {when} "
              "the tests ran")
    last = describe(type(e), e)[-1].strip()
    verdict(refused if isinstance(e, refused_type) else failed,
            f"{stage}: {last}")

  code, test = payload["code"], payload["test"]
  entry_point = payload.get("entry_point")
  try:
    exec(compile(code, "program.py", "exec"), namespace)  # pylint: disable=exec-used
  except BaseException as e:  # pylint: disable=broad-except
    failure("program", e)
  restore_builtins()
  if entry_point is not None:
    tests = dict(namespace)
    tests.update({"__name__": "__humaneval_tests__", "__builtins__": pristine})
    try:
      exec(compile(test, "tests.py", "exec"), tests)  # pylint: disable=exec-used
      if entry_point not in namespace:
        raise NameError(f"the program defines no {entry_point!r}")
      tests["check"](guarded(namespace[entry_point], module_name))
    except BaseException as e:  # pylint: disable=broad-except
      failure("tests", e)
    restore_builtins()
  verdict(passed)


if __name__ == "__main__":
  main()
