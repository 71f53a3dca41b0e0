"""Which OS boundary `sandbox.run_program` puts around a program.

Two kinds, probed once per process (`available()`):

* BWRAP: bubblewrap (Debian's `bubblewrap`, `bwrap`), the maintained
  unprivileged sandbox that Flatpak uses. New user, pid, network, ipc,
  uts (and, where possible, cgroup) namespaces (run as root: no user
  namespace, and the runner drops to uid 65534: `drops_to_nobody`); the interpreter's prefix
  (interpreter and standard library), /usr and the dynamic loader's cache
  bound read-only; a size-capped tmpfs as the only writable place (cwd,
  HOME, TMPDIR); a fresh /proc of the new pid namespace (the parent's
  processes are not in it) and a minimal /dev; `--die-with-parent`,
  `--new-session`, uid/gid 65534. Killing bwrap kills the namespace's pid 1
  and so every descendant.
* FALLBACK: where bwrap is missing or cannot make namespaces. A process
  with rlimits and the audit hook of `sandbox_runner`, inside `unshare`
  with as much as works here, tried in order: user + network + pid + mount
  namespaces with a private /proc (`-r -n -p -f -m --mount-proc
  --kill-child`), then `-rn` (user + network, as before), then no
  namespace. Descendants are killed by process group and by a sweep of
  /proc for the run's marker variable.

`available()` honours `KVQ_SANDBOX=bwrap|fallback` (tests force a kind);
`describe(kind)` is the one line a run prints.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import pathlib
import shutil
import subprocess
import sys

BWRAP, FALLBACK = "bwrap", "fallback"
KINDS = (BWRAP, FALLBACK)
ENV_VAR = "KVQ_SANDBOX"
MARKER_VAR = "KVQ_SANDBOX_RUN"  # Set in every program's environment.
NOBODY = 65534
# Where the program sees its files under bwrap.
BWRAP_WORK = "/tmp"
BWRAP_RUNNER = "/sandbox/runner.py"
BWRAP_PAYLOAD = "/sandbox/program.json"
_UNSHARE_FULL = ("-r", "-n", "-p", "-f", "-m", "--mount-proc", "--kill-child")
_UNSHARE_NET = ("-r", "-n")


@dataclasses.dataclass(frozen=True)
class Isolation:
  """A probed boundary: its kind, its command prefix, how it reads."""

  kind: str
  tool: tuple[str, ...]  # bwrap / unshare and their flags; () for none.
  label: str  # Recorded in Outcome.isolation.

  @property
  def pid_namespace(self) -> bool:
    return self.kind == BWRAP or "-p" in self.tool


def interpreter() -> str:
  """The base interpreter (not a venv's link): only its stdlib is needed."""
  return os.path.realpath(getattr(sys, "_base_executable", None)
                          or sys.executable)


def _read_only_system() -> list[str]:
  """bwrap arguments binding the interpreter and the system read-only."""
  args = ["--ro-bind", "/usr", "/usr"]
  for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
    if os.path.islink(top):
      args += ["--symlink", os.readlink(top), top]
    elif os.path.isdir(top):
      args += ["--ro-bind", top, top]
  if os.path.exists("/etc/ld.so.cache"):
    args += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
  prefixes = {os.path.realpath(p) for p in (sys.base_prefix,
                                             sys.base_exec_prefix)}
  exe_dir = os.path.dirname(os.path.dirname(interpreter()))
  prefixes.add(exe_dir)
  made = set()
  for prefix in sorted(prefixes):
    if prefix.startswith("/usr/") or prefix == "/usr":
      continue
    parents = list(reversed(pathlib.PurePosixPath(prefix).parents))[1:]
    for parent in map(str, parents):  # Traversable by uid 65534 (/root).
      if parent not in made:
        made.add(parent)
        args += ["--perms", "0755", "--dir", parent]
    args += ["--ro-bind", prefix, prefix]
  return args


def drops_to_nobody() -> bool:
  """True when bwrap runs as root: then no user namespace is made (one made
  by root maps the program to root outside, where RLIMIT_NPROC is not
  enforced); the runner itself drops to uid/gid 65534 before the program
  runs, which leaves it no capabilities and RLIMIT_NPROC in force."""
  return os.geteuid() == 0


def bwrap_command(tool: str, runner: str, payload: str, disk_mib: int
                  ) -> list[str]:
  """bwrap and its flags, up to (not including) the interpreter."""
  user = ([] if drops_to_nobody() else
          ["--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY)])
  return [tool, *user, "--unshare-pid", "--unshare-net",
          "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
          "--hostname", "sandbox",
          "--die-with-parent", "--new-session", "--clearenv",
          *_read_only_system(),
          "--proc", "/proc", "--dev", "/dev",
          "--perms", "1777", "--size", str(disk_mib * 2 ** 20),
          "--tmpfs", BWRAP_WORK,
          "--ro-bind", runner, BWRAP_RUNNER,
          "--ro-bind", payload, BWRAP_PAYLOAD,
          "--chdir", BWRAP_WORK]


def _works(cmd: list[str]) -> bool:
  try:
    return subprocess.run(cmd, capture_output=True, timeout=30,
                          stdin=subprocess.DEVNULL).returncode == 0
  except (OSError, subprocess.SubprocessError):
    return False


@functools.lru_cache(maxsize=None)
def probe_bwrap() -> Isolation | None:
  """bwrap, if it is installed and can make its namespaces here."""
  tool = shutil.which("bwrap")
  if tool is None:
    return None
  here = os.path.realpath(__file__)
  cmd = bwrap_command(tool, here, here, 1)
  if not _works([*cmd, interpreter(), "-I", "-S", "-B", "-c", "pass"]):
    return None
  spaces = ("pid, net, ipc, uts namespaces; uid 65534" if drops_to_nobody()
            else "user, pid, net, ipc, uts namespaces")
  return Isolation(BWRAP, (tool,), f"bwrap ({spaces}; read-only "
                   "interpreter; tmpfs)")


@functools.lru_cache(maxsize=None)
def probe_fallback() -> Isolation:
  """unshare with the most namespaces that work here, or none."""
  tool = shutil.which("unshare")
  if tool is not None:
    for flags, label in ((_UNSHARE_FULL, "user, net, pid, mount namespaces"),
                         (_UNSHARE_NET, "user, net namespaces")):
      if _works([tool, *flags, interpreter(), "-I", "-S", "-c", "pass"]):
        return Isolation(FALLBACK, (tool, *flags),
                         f"process + rlimits + audit hook + unshare "
                         f"({label})")
  return Isolation(FALLBACK, (), "process + rlimits + audit hook (no "
                   "namespace)")


def available(kind: str | None = None) -> Isolation:
  """The boundary to use: `kind`, else $KVQ_SANDBOX, else bwrap if it works.

  Raises:
    ValueError: an unknown kind, or bwrap asked for where it does not work.
  """
  kind = kind or os.environ.get(ENV_VAR) or None
  if kind is not None and kind not in KINDS:
    raise ValueError(f"sandbox kind {kind!r} (argument or ${ENV_VAR}); "
                     f"allowed: {', '.join(KINDS)}.")
  if kind == FALLBACK:
    return probe_fallback()
  found = probe_bwrap()
  if found is not None:
    return found
  if kind == BWRAP:
    raise ValueError("sandbox kind 'bwrap' asked for, but bwrap is missing "
                     "or cannot create namespaces here; install Debian's "
                     "`bubblewrap` (scripts/setup.sh does as root).")
  return probe_fallback()


def describe(isolation: Isolation) -> str:
  """The one line a run prints about how programs are isolated."""
  hint = ("" if isolation.kind == BWRAP or probe_bwrap() is not None else
          "; bwrap is missing or cannot make namespaces here (Debian: "
          "apt-get install bubblewrap)")
  return f"sandbox: generated programs run under {isolation.label}{hint}"
