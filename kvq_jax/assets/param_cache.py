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

import dataclasses
import hashlib
import json
import os
import pathlib
from typing import Any

from absl import logging
import jax
import numpy as np
import orbax.checkpoint as ocp

from kvq_jax import loaders
from kvq_jax.assets import cache_dir
from kvq_jax.assets import cache_errors
from kvq_jax.assets import entry_lock
from kvq_jax.assets import entry_marker
from kvq_jax.assets import registry
from kvq_jax.loaders import param_layout
from kvq_jax.loaders.tokenizer import TextTokenizer
from kvq_jax.models.config import ModelConfig

FORMAT_VERSION = 1
MARKER = entry_marker.MARKER
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

  Raises entry_marker.Unusable if it is incomplete or damaged. An entry
  written before the marker existed (config.json, no marker) is restored
  and, if that works and `adopt_legacy` (the caller holds the lock), given
  its marker.
  """
  if not entry.is_dir():
    return None
  legacy = not (entry / MARKER).is_file()
  if legacy and not (adopt_legacy and (entry / "config.json").is_file()):
    raise entry_marker.Unusable(f"no completion marker {MARKER}")
  if not legacy:
    entry_marker.check_marker(entry)
  try:
    result = _restore(entry)
  except Exception as e:  # pylint: disable=broad-except
    raise entry_marker.Unusable(f"restoring it failed: {e!r}") from e
  if legacy:
    logging.info("Adding the completion marker to %s", entry)
    with cache_errors.explained(entry, "the completion marker " + MARKER):
      entry_marker.write_marker(entry)
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


def _save(entry: pathlib.Path, config: ModelConfig, params: dict[str, Any],
          tokenizer: TextTokenizer | None, what: str) -> None:
  """Writes the entry aside, marker last, then renames it into place (the
  caller holds the lock; `entry_marker.build_aside`)."""
  with entry_marker.build_aside(entry, what) as tmp:
    checkpointer = _checkpointer()
    checkpointer.save(tmp / "params", params)
    checkpointer.wait_until_finished()
    if tokenizer is not None:
      tokenizer.save(tmp / "tokenizer")
    meta = dataclasses.asdict(config) | {"format_version": FORMAT_VERSION}
    (tmp / "config.json").write_text(json.dumps(meta, indent=1))


def load_params_cached(
    name_or_path: str | os.PathLike[str] = registry.DEFAULT_MODEL,
) -> tuple[ModelConfig, dict[str, Any], TextTokenizer | None]:
  """`loaders.load_checkpoint`, memoized on disk (see module docstring)."""
  source = registry.resolve_model(name_or_path)
  entry = entry_dir(source)
  try:
    result = _load_entry(entry, adopt_legacy=False)
  except entry_marker.Unusable:
    result = None  # Looked at again under the lock: it may be being rebuilt.
  if result is None:
    with entry_lock.hold(entry, f"converting {source}"):
      entry_marker.sweep_leftovers(entry)
      try:
        result = _load_entry(entry, adopt_legacy=True)
      except entry_marker.Unusable as e:
        logging.warning("Param cache entry %s is unusable (%s); converting "
                        "%s again.", entry, e, source)
        entry_marker.discard(entry)
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
