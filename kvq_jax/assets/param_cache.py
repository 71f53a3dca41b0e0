"""Caches converted float32 params with orbax so reloads skip dequantization.

Entry layout under `cache_root()/params/<stem>-<key>/`: `params/` (an orbax
StandardCheckpointer checkpoint of the params tree), `tokenizer/`
(`TextTokenizer.save`), `config.json` (ModelConfig fields plus the format
version) and, written last, the completion marker `complete.json`: the size,
crc32 and mtime of every other file of the entry.

The key is a sha256 over FORMAT_VERSION, the source's resolved path and the
(name, size, mtime_ns) of every source file (the .gguf, or config.json,
tokenizer files and *.safetensors of a directory): O(1) in file size, unlike
hashing the weights, and any rewrite of the source changes mtime.

Concurrency and damage:
* A load checks the entry's files against its marker (sizes always; the
  crc32 of a file whose mtime moved since the marker was written: any write
  moves it, while re-reading every file would double a large entry's I/O),
  then restores it and checks the tree's shapes
  (`param_layout.check_params`); it takes no lock.
* Otherwise it takes the entry's lock (`entry_lock.hold`: `<entry>.lock`), so
  of several runs started together on a cold cache one converts while the
  others wait, then restore what it wrote. The writer converts into
  `.<entry>.tmp-*` beside the entry, writes the marker last and renames the
  folder into place, so a half-written entry is never under the entry's name.
* An entry that fails the check (a file missing, truncated or changed, or the
  restore failing) is rebuilt with a logged warning naming it. One written
  before the marker existed (config.json but no marker) is restored once and,
  if that works, given its marker instead of being rebuilt.
* In a multi-process run (`kvq_jax.sharding.distributed`) every process
  loads on its own (orbax is told so): they reach the entry at different
  times (one converts under the lock while the others wait), so orbax's
  cross-process barriers would deadlock. Only process 0 writes an entry
  (orbax writes numpy arrays from process 0 alone); another process that
  finds none converts the checkpoint for itself.
* Running out of space or permission under the cache root raises
  `cache_errors.CacheWriteError` naming the path and what to do.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import pathlib
import shutil
import tempfile
from typing import Any
import zlib

from absl import logging
import jax
import numpy as np
import orbax.checkpoint as ocp

from kvq_jax import loaders
from kvq_jax.assets import cache_dir
from kvq_jax.assets import cache_errors
from kvq_jax.assets import entry_lock
from kvq_jax.assets import registry
from kvq_jax.loaders import param_layout
from kvq_jax.loaders.tokenizer import TextTokenizer
from kvq_jax.models.config import ModelConfig

FORMAT_VERSION = 1
# Written last: {relative path: [size, crc32, mtime_ns]} (older markers:
# [size, crc32]; `_check_marker` adds the mtimes once they verify).
MARKER = "complete.json"
MARKER_VERSION = 1
_SOURCE_GLOBS = ("config.json", "tokenizer.json", "tokenizer_config.json",
                 "*.safetensors", "model.safetensors.index.json")


def source_key(source: pathlib.Path) -> str:
  """Cache key of a checkpoint file or directory (see module docstring)."""
  source = source.resolve()
  files = [source] if source.is_file() else sorted(
      {p for pattern in _SOURCE_GLOBS for p in source.glob(pattern)})
  stats = [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files]
  blob = json.dumps([FORMAT_VERSION, str(source), stats])
  return hashlib.sha256(blob.encode()).hexdigest()[:20]


def entry_dir(source: pathlib.Path) -> pathlib.Path:
  return (cache_dir.cache_root() / "params" /
          f"{source.resolve().stem}-{source_key(source)}")


class _Unusable(Exception):
  """The entry is there but incomplete or damaged; the message says how."""


def _file_table(entry: pathlib.Path, known: dict | None = None
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


def _write_marker(entry: pathlib.Path, table: dict | None = None) -> None:
  """Writes the completion marker (`table`, else the entry's files read
  now) atomically: a reader never sees half of it."""
  partial = entry / (MARKER + f".partial-{os.getpid()}")
  try:
    partial.write_text(json.dumps(
        {"marker_version": MARKER_VERSION,
         "files": _file_table(entry) if table is None else table}, indent=1))
    os.replace(partial, entry / MARKER)
  except BaseException:
    partial.unlink(missing_ok=True)
    raise


def _check_marker(entry: pathlib.Path) -> None:
  """Raises _Unusable unless the entry's files are those its marker lists."""
  try:
    marker = json.loads((entry / MARKER).read_text())
    expected = marker["files"]
    if marker["marker_version"] != MARKER_VERSION:
      raise _Unusable(f"{MARKER} has marker_version "
                      f"{marker['marker_version']}, expected {MARKER_VERSION}")
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise _Unusable(f"unreadable {MARKER}: {e!r}") from e
  actual = _file_table(entry, expected)
  for name in sorted(expected.keys() | actual.keys()):
    if name not in actual:
      raise _Unusable(f"{name} is missing")
    if name not in expected:
      raise _Unusable(f"{name} is not in {MARKER}")
    (size, crc), (want_size, want_crc) = actual[name][:2], expected[name][:2]
    if size != want_size:
      raise _Unusable(f"{name} has {size} bytes, {MARKER} says {want_size}")
    if crc != want_crc:
      raise _Unusable(f"{name}'s checksum differs from {MARKER}'s")
  if actual != expected:  # Rows of an older marker, or files touched but
    # intact: record their stats (best effort: a read-only cache keeps
    # checksumming on every load).
    with contextlib.suppress(OSError):
      _write_marker(entry, actual)


def _checkpointer() -> ocp.StandardCheckpointer:
  """An orbax checkpointer of this process alone (module docstring)."""
  me = jax.process_index()
  return ocp.StandardCheckpointer(
      multiprocessing_options=ocp.options.MultiprocessingOptions(
          primary_host=me, active_processes={me}))


def _restore(entry: pathlib.Path) -> tuple[ModelConfig, dict[str, Any],
                                           TextTokenizer | None]:
  meta = json.loads((entry / "config.json").read_text())
  if meta.pop("format_version") != FORMAT_VERSION:
    raise ValueError(f"{entry}: format_version mismatch.")
  config = ModelConfig.from_dict(meta)  # JSON lists back to tuples.
  target = _abstract_params(config)
  params = _checkpointer().restore(entry / "params", target)
  params = _to_numpy(params)
  param_layout.check_params(params, config, f"param cache {str(entry)!r}")
  tokenizer = (TextTokenizer.load(entry / "tokenizer")
               if (entry / "tokenizer").is_dir() else None)
  return config, params, tokenizer


def _load_entry(entry: pathlib.Path, adopt_legacy: bool
                ) -> tuple[ModelConfig, dict[str, Any],
                           TextTokenizer | None] | None:
  """The entry's contents; None if there is no entry.

  Raises _Unusable if it is incomplete or damaged. An entry written before
  the marker existed (config.json, no marker) is restored and, if that works
  and `adopt_legacy` (the caller holds the lock), given its marker.
  """
  if not entry.is_dir():
    return None
  legacy = not (entry / MARKER).is_file()
  if legacy and not (adopt_legacy and (entry / "config.json").is_file()):
    raise _Unusable(f"no completion marker {MARKER}")
  if not legacy:
    _check_marker(entry)
  try:
    result = _restore(entry)
  except Exception as e:  # pylint: disable=broad-except
    raise _Unusable(f"restoring it failed: {e!r}") from e
  if legacy:
    logging.info("Adding the completion marker to %s", entry)
    with cache_errors.explained(entry, "the completion marker " + MARKER):
      _write_marker(entry)
  return result


def _abstract_params(config: ModelConfig) -> Any:
  """Restore target: numpy leaves make orbax restore numpy (np.empty maps no
  pages, so this does not hold the model twice)."""
  def build(tree: Any) -> Any:
    if isinstance(tree, tuple):
      return np.empty(tree, np.float32)
    if isinstance(tree, dict):
      return {k: build(v) for k, v in tree.items()}
    return [build(v) for v in tree]
  return build(param_layout.expected_shapes(config))


def _to_numpy(tree: Any) -> Any:
  if isinstance(tree, dict):
    return {k: _to_numpy(v) for k, v in tree.items()}
  if isinstance(tree, list):
    return [_to_numpy(v) for v in tree]
  return np.asarray(tree, dtype=np.float32)


def _discard(entry: pathlib.Path) -> None:
  """Removes an entry: renamed aside first, so it vanishes at once."""
  trash = entry.with_name(f".{entry.name}.trash-{os.getpid()}")
  try:
    os.rename(entry, trash)
  except FileNotFoundError:
    return
  shutil.rmtree(trash, ignore_errors=True)


def _sweep_leftovers(entry: pathlib.Path) -> None:
  """Deletes what killed writers of this entry left (caller holds the lock)."""
  for pattern in (f".{entry.name}.tmp-*", f".{entry.name}.trash-*"):
    for path in entry.parent.glob(pattern):
      logging.warning("Deleting %s, left by an interrupted run.", path)
      shutil.rmtree(path, ignore_errors=True)


def _save(entry: pathlib.Path, config: ModelConfig, params: dict[str, Any],
          tokenizer: TextTokenizer | None, what: str) -> None:
  """Writes the entry into a temporary folder, marker last, then renames it
  into place (the caller holds the lock)."""
  with cache_errors.explained(entry.parent, what):
    tmp = pathlib.Path(tempfile.mkdtemp(dir=entry.parent,
                                        prefix=f".{entry.name}.tmp-"))
    try:
      checkpointer = _checkpointer()
      checkpointer.save(tmp / "params", params)
      checkpointer.wait_until_finished()
      if tokenizer is not None:
        tokenizer.save(tmp / "tokenizer")
      meta = dataclasses.asdict(config) | {"format_version": FORMAT_VERSION}
      (tmp / "config.json").write_text(json.dumps(meta, indent=1))
      _write_marker(tmp)
      os.chmod(tmp, 0o755)  # mkdtemp makes it 0o700.
      try:
        os.rename(tmp, entry)
      except OSError as e:
        if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
          raise
        # Only a writer that took no lock (no flock on this file system)
        # gets here: the entry it finished first is as good as this one.
        shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
      shutil.rmtree(tmp, ignore_errors=True)
      raise


def load_params_cached(
    name_or_path: str | os.PathLike[str] = registry.DEFAULT_MODEL,
) -> tuple[ModelConfig, dict[str, Any], TextTokenizer | None]:
  """`loaders.load_checkpoint`, memoized on disk (see module docstring)."""
  source = registry.resolve_model(name_or_path)
  entry = entry_dir(source)
  try:
    result = _load_entry(entry, adopt_legacy=False)
  except _Unusable:
    result = None  # Looked at again under the lock: it may be being rebuilt.
  if result is None:
    with entry_lock.hold(entry, f"converting {source}"):
      _sweep_leftovers(entry)
      try:
        result = _load_entry(entry, adopt_legacy=True)
      except _Unusable as e:
        logging.warning("Param cache entry %s is unusable (%s); converting "
                        "%s again.", entry, e, source)
        _discard(entry)
      if result is None:
        result = loaders.load_checkpoint(source)
        if jax.process_index() != 0:  # Module docstring: process 0 writes.
          logging.info("Not caching the converted params of %s: process %d "
                       "of a multi-process run (process 0 writes the cache)",
                       source, jax.process_index())
          return result
        logging.info("Caching converted params at %s", entry)
        _save(entry, *result, what=f"the converted params of {source}")
        return result
  logging.info("Loaded converted params from %s", entry)
  return result
