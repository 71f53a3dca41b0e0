"""Out-of-space and permission failures under the cache root, explained.

`explained(path, what)` wraps code that writes under `cache_root()`: an error
meaning "no space left" (ENOSPC, EDQUOT) or "not allowed to write" (EACCES,
EPERM, EROFS) becomes a `CacheWriteError` that names the path and says what
to do (free space, fix the permissions, or point $KVQ_JAX_CACHE at a folder
that works). The error is recognised on an `OSError`'s errno, and on the text
of a `ValueError` (tensorstore, under orbax, raises `ValueError: ... No space
left on device [os_error_code='28']`), along the whole `__cause__` /
`__context__` chain. Other errors pass unchanged.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pathlib
import re
import shutil
from typing import Iterator

from kvq_jax.assets import cache_dir

_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
_NO_ACCESS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})
_OS_ERROR_CODE = re.compile(r"os_error_code='?(\d+)")
_MESSAGES = {os.strerror(code): code for code in _NO_SPACE | _NO_ACCESS}


class CacheWriteError(OSError):
  """Writing under the cache root failed for lack of space or permission.

  `errno` is the underlying code (e.g. errno.ENOSPC); the message names the
  path and what to do.
  """

  def __init__(self, message: str, code: int):
    super().__init__(message)
    self.errno = code


def errno_of(error: BaseException) -> int | None:
  """The space or permission errno behind `error` (see module docstring),
  or None."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, OSError) and error.errno in _NO_SPACE | _NO_ACCESS:
      return error.errno
    if isinstance(error, ValueError):  # tensorstore's status errors.
      text = str(error)
      match = _OS_ERROR_CODE.search(text)
      if match and int(match.group(1)) in _NO_SPACE | _NO_ACCESS:
        return int(match.group(1))
      for message, code in _MESSAGES.items():
        if message in text:
          return code
    error = error.__cause__ or error.__context__
  return None


def _free_space(path: pathlib.Path) -> str:
  """Free space on the disk holding `path` (or its nearest existing parent)."""
  for candidate in (path, *path.parents):
    try:
      return f"{shutil.disk_usage(candidate).free / 2**30:.2f} GiB free there"
    except OSError:
      continue
  return "free space unknown"


def message(path: pathlib.Path, what: str, code: int, detail: str) -> str:
  """The explanation for `code` (a `_NO_SPACE` or `_NO_ACCESS` errno)."""
  root = cache_dir.cache_root()
  elsewhere = (f"set ${cache_dir.CACHE_ENV} to a folder that is writable and "
               f"has room (the cache root is now {root})")
  if code in _NO_SPACE:
    return (f"Out of disk space writing {what} under {path} "
            f"({_free_space(path)}; {detail}). Free space on that disk (e.g. "
            f"delete unused entries under {root / 'params'}), or {elsewhere}.")
  return (f"Not allowed to write {what} under {path} ({detail}). Make {path} "
          f"writable by this user (uid {os.getuid()}), or {elsewhere}.")


@contextlib.contextmanager
def explained(path: pathlib.Path, what: str) -> Iterator[None]:
  """Turns space and permission errors of the block into `CacheWriteError`.

  Args:
    path: the cache folder being written (named in the message).
    what: what was being written, e.g. 'converted params of /x/m.gguf'.
  """
  try:
    yield
  except CacheWriteError:
    raise
  except Exception as e:  # pylint: disable=broad-except
    code = errno_of(e)
    if code is None:
      raise
    detail = os.strerror(code)
    if isinstance(e, OSError) and e.filename:
      detail += f": {e.filename}"
    raise CacheWriteError(message(path, what, code, detail), code) from e
