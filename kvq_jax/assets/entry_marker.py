"""Complete-or-absent cache entries: a checksum marker written last, entries
built aside and renamed into place, damaged ones discarded.

Shared by the converted-parameter cache (`param_cache`), the calibrated
statistics built on first use (`kvq_jax.calibration.auto_key_stats`) and
every key-statistics directory (`kvq_jax.persist.key_stats_store`).

* `write_marker(entry)`: `complete.json` = {relative path: [size, crc32,
  mtime_ns]} of every other file, written atomically, last.
* `check_marker(entry)`: raises `Unusable` unless the files are those the
  marker lists (sizes always; crc32 of a file whose mtime moved).
* `build_aside(entry, what)`: a context giving a temporary folder beside the
  entry; on normal exit the marker is written and the folder renamed to the
  entry (the caller holds `entry_lock.hold(entry, ...)`), on error it is
  deleted. A half-written entry is never under the entry's name.
  `written_aside(entry, replace=...)` is the same outside the cache root
  (no cache advice in its errors), optionally replacing an older entry.
* `discard(entry)`, `sweep_leftovers(entry)`: remove a damaged entry, and
  what killed writers left.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pathlib
import shutil
import tempfile
from typing import Iterator
import zlib

from absl import logging

from kvq_jax.assets import cache_errors

# Written last: {relative path: [size, crc32, mtime_ns]} (older markers:
# [size, crc32]; `check_marker` adds the mtimes once they verify).
MARKER = "complete.json"
MARKER_VERSION = 1


class Unusable(Exception):
  """The entry is there but incomplete or damaged; the message says how."""


def file_table(entry: pathlib.Path, known: dict | None = None
               ) -> dict[str, list[int]]:
  """{relative path: [size, crc32, mtime_ns]} of every file of the entry but
  the marker (crc32: it detects accidental damage at a fraction of sha256's
  cost). A file whose size and mtime equal its row in `known` (a marker's
  table) keeps that row's crc32 without being read again: any write moves
  the mtime, and re-reading a 6 GB entry on every load doubled its I/O (the
  registry trusts a verified wheel by its stat the same way)."""
  table = {}
  for path in sorted(p for p in entry.rglob("*") if p.is_file()):
    relative = path.relative_to(entry).as_posix()
    if relative == MARKER:
      continue
    stat = path.stat()
    row = (known or {}).get(relative)
    if (row is not None and len(row) == 3
        and [row[0], row[2]] == [stat.st_size, stat.st_mtime_ns]):
      table[relative] = list(row)
      continue
    crc = 0
    with open(path, "rb") as f:
      for chunk in iter(lambda: f.read(1 << 22), b""):
        crc = zlib.crc32(chunk, crc)
    table[relative] = [stat.st_size, crc, stat.st_mtime_ns]
  return table


def write_marker(entry: pathlib.Path, table: dict | None = None) -> None:
  """Writes the completion marker (`table`, else the entry's files read
  now) atomically: a reader never sees half of it."""
  partial = entry / (MARKER + f".partial-{os.getpid()}")
  try:
    partial.write_text(json.dumps(
        {"marker_version": MARKER_VERSION,
         "files": file_table(entry) if table is None else table}, indent=1))
    os.replace(partial, entry / MARKER)
  except BaseException:
    partial.unlink(missing_ok=True)
    raise


def check_marker(entry: pathlib.Path) -> None:
  """Raises Unusable unless the entry's files are those its marker lists."""
  try:
    marker = json.loads((entry / MARKER).read_text())
    expected = marker["files"]
    if marker["marker_version"] != MARKER_VERSION:
      raise Unusable(f"{MARKER} has marker_version "
                     f"{marker['marker_version']}, expected {MARKER_VERSION}")
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise Unusable(f"unreadable {MARKER}: {e!r}") from e
  actual = file_table(entry, expected)
  for name in sorted(expected.keys() | actual.keys()):
    if name not in actual:
      raise Unusable(f"{name} is missing")
    if name not in expected:
      raise Unusable(f"{name} is not in {MARKER}")
    (size, crc), (want_size, want_crc) = actual[name][:2], expected[name][:2]
    if size != want_size:
      raise Unusable(f"{name} has {size} bytes, {MARKER} says {want_size}")
    if crc != want_crc:
      raise Unusable(f"{name}'s checksum differs from {MARKER}'s")
  if actual != expected:  # Rows of an older marker, or files touched but
    # intact: record their stats (best effort: a read-only cache keeps
    # checksumming on every load).
    with contextlib.suppress(OSError):
      write_marker(entry, actual)


def discard(entry: pathlib.Path) -> None:
  """Removes an entry: renamed aside first, so it vanishes at once."""
  trash = entry.with_name(f".{entry.name}.trash-{os.getpid()}")
  try:
    os.rename(entry, trash)
  except FileNotFoundError:
    return
  shutil.rmtree(trash, ignore_errors=True)


def sweep_leftovers(entry: pathlib.Path) -> None:
  """Deletes what killed writers of this entry left (caller holds the lock)."""
  for pattern in (f".{entry.name}.tmp-*", f".{entry.name}.trash-*"):
    for path in entry.parent.glob(pattern):
      logging.warning("Deleting %s, left by an interrupted run.", path)
      shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def written_aside(entry: pathlib.Path, *, replace: bool = False
                  ) -> Iterator[pathlib.Path]:
  """A temporary folder beside `entry` to write it into: on normal exit its
  marker is written and it is renamed to `entry`, on error it is deleted.

  An entry already there is kept (`replace` False: only a writer that took
  no lock, with no flock on the file system, gets there, and the entry it
  finished first is as good as this one) or replaced (`replace` True: the
  old one is renamed aside, then deleted). Either way `entry` is never half
  written: whole, or absent for the moment between two renames.
  """
  entry.parent.mkdir(parents=True, exist_ok=True)
  tmp = pathlib.Path(tempfile.mkdtemp(dir=entry.parent,
                                      prefix=f".{entry.name}.tmp-"))
  try:
    yield tmp
    write_marker(tmp)
    os.chmod(tmp, 0o755)  # mkdtemp makes it 0o700.
    try:
      os.rename(tmp, entry)
    except OSError as e:
      if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
        raise
      if not replace:
        shutil.rmtree(tmp, ignore_errors=True)
        return
      trash = entry.with_name(f".{entry.name}.trash-"
                              + tmp.name.rsplit("-", 1)[-1])
      os.rename(entry, trash)
      try:
        os.rename(tmp, entry)
      except BaseException:
        os.rename(trash, entry)  # The old entry back, whole.
        raise
      shutil.rmtree(trash, ignore_errors=True)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise


@contextlib.contextmanager
def build_aside(entry: pathlib.Path, what: str) -> Iterator[pathlib.Path]:
  """`written_aside(entry)` under the cache root: space and permission
  errors explained (module docstring). `what` names the contents in a
  `cache_errors.CacheWriteError`."""
  with cache_errors.explained(entry.parent, what):
    with written_aside(entry) as tmp:
      yield tmp
