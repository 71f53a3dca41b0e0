"""One writer per cache entry: an exclusive `fcntl.flock` beside the entry.

`hold(entry, purpose)` locks `<entry>.lock` (e.g. `params/<stem>-<key>.lock`,
`models/<file>.lock`) for the block, so of several processes that find the
same entry missing on a cold cache one fetches or converts it while the others
wait, then find it complete. Readers of a complete entry take no lock (an
entry only appears, by rename, once complete), so a read-only cache of
complete entries still works.

* The holder writes its pid, host and purpose into the lock file; a waiter
  prints once, to stderr, which lock it waits for and who holds it.
* The kernel drops a flock when its holder exits, crashed or not, so there is
  no stale lock to clean up; waiting longer than `timeout_s` (a live holder
  that is stuck or very slow) raises `LockTimeoutError` naming the lock.
* The file is removed on release. A waiter that then locks the removed file
  (its inode no longer at the path) retries on the path's new file, so at most
  one process holds the lock of a path at a time.
* Creating the entry's folder or the lock file without space or permission
  raises `cache_errors.CacheWriteError` naming the path.
* On a file system without flock (ENOLCK, some network mounts) it logs a
  warning and goes on unlocked: writers still write aside and rename whole
  entries into place, so the cost is duplicated work, not a broken entry.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import pathlib
import socket
import sys
import time
from typing import Iterator

from absl import logging

from kvq_jax.assets import cache_errors

# Long enough for the slowest holder: downloading the 1.1 GB model on a slow
# link, or converting it.
DEFAULT_TIMEOUT_S = 3 * 3600.0
_POLL_S = 0.05
_NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)


class LockTimeoutError(TimeoutError):
  """Another live process held an entry's lock for longer than the timeout."""


def lock_path(entry: pathlib.Path) -> pathlib.Path:
  """The lock file of `entry`: `<entry>.lock` beside it."""
  return entry.with_name(entry.name + ".lock")


def _holder(path: pathlib.Path) -> str:
  """What the lock file says about its holder (it may not have written yet)."""
  try:
    text = path.read_text().strip()
  except OSError:
    text = ""
  return text or "another process"


def report_wait(path: pathlib.Path, holder: str, purpose: str) -> None:
  """Says, once per wait, which lock a process waits for and why."""
  print(f"kvq_jax: waiting for lock {path} (held by {holder}) before "
        f"{purpose}; it is released when that process finishes.",
        file=sys.stderr, flush=True)


def _try_lock(path: pathlib.Path) -> int | None:
  """An fd holding the flock of the file now at `path`, or None if held."""
  while True:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      os.close(fd)
      if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
        return None
      raise
    try:
      current = os.stat(path)
    except FileNotFoundError:
      current = None
    locked = os.fstat(fd)
    if current is not None and (current.st_dev, current.st_ino) == (
        locked.st_dev, locked.st_ino):
      return fd
    os.close(fd)  # Its holder removed this file on release: lock the new one.


def _try_lock_or_none(path: pathlib.Path) -> int | None:
  """`_try_lock`, or -1 where the file system has no flock (some network
  mounts): then writers rely on the atomic rename of complete entries alone."""
  try:
    return _try_lock(path)
  except OSError as e:
    if e.errno not in _NO_FLOCK:
      raise
    logging.warning("Cannot lock %s (%s); going on without the lock: entries "
                    "are still written aside and renamed into place whole.",
                    path, os.strerror(e.errno))
    return -1


@contextlib.contextmanager
def hold(entry: pathlib.Path, purpose: str,
         timeout_s: float = DEFAULT_TIMEOUT_S) -> Iterator[None]:
  """Holds `entry`'s lock for the block (see module docstring).

  Args:
    entry: the cache entry (file or folder) about to be written; its parent
      folder is created if missing.
    purpose: what the holder does, e.g. 'converting /x/m.gguf'; shown to
      waiters and in the timeout error.
    timeout_s: seconds to wait for another holder before `LockTimeoutError`.
  """
  path = lock_path(entry)
  with cache_errors.explained(entry.parent, "the cache lock file " + path.name):
    entry.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    waited = False
    while (fd := _try_lock_or_none(path)) is None:
      holder = _holder(path)
      if not waited:
        report_wait(path, holder, purpose)
        waited = True
      if time.monotonic() >= deadline:
        raise LockTimeoutError(
            f"Waited {timeout_s:g} s for lock {path} (held by {holder}) "
            f"before {purpose}. Its holder is still running (the lock is "
            "dropped when a process exits): let it finish, or stop it if it "
            "is stuck, then run again.")
      time.sleep(_POLL_S)
    if fd >= 0:
      try:
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}, "
                     f"{purpose}\n".encode())
      except BaseException:
        _release(path, fd)
        raise
  try:
    yield
  finally:
    _release(path, fd)


def _release(path: pathlib.Path, fd: int) -> None:
  with contextlib.suppress(FileNotFoundError):
    os.unlink(path)  # Before unlocking: see the module docstring.
  if fd >= 0:  # Else not locked (see _try_lock_or_none).
    os.close(fd)
