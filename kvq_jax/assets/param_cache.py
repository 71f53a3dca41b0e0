"""Caches converted float32 params with orbax so reloads skip dequantization.

Entry layout under `cache_root()/params/<stem>-<key>/`: `params/` (an orbax
StandardCheckpointer checkpoint of the params tree), `tokenizer/`
(`TextTokenizer.save`) and `config.json` (ModelConfig fields plus the format
version), written last as the completion marker; the entry is assembled in a
temporary folder and renamed into place.

The key is a sha256 over FORMAT_VERSION, the source's resolved path and the
(name, size, mtime_ns) of every source file (the .gguf, or config.json,
tokenizer files and *.safetensors of a directory): O(1) in file size, unlike
hashing the weights, and any rewrite of the source changes mtime.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import shutil
import tempfile
from typing import Any

from absl import logging
import numpy as np
import orbax.checkpoint as ocp

from kvq_jax import loaders
from kvq_jax.assets import cache_dir
from kvq_jax.assets import registry
from kvq_jax.loaders import param_layout
from kvq_jax.loaders.tokenizer import TextTokenizer
from kvq_jax.models.config import ModelConfig

FORMAT_VERSION = 1
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


def _restore(entry: pathlib.Path) -> tuple[ModelConfig, dict[str, Any],
                                           TextTokenizer | None]:
  meta = json.loads((entry / "config.json").read_text())
  if meta.pop("format_version") != FORMAT_VERSION:
    raise ValueError(f"{entry}: format_version mismatch.")
  config = ModelConfig.from_dict(meta)  # JSON lists back to tuples.
  target = _abstract_params(config)
  params = ocp.StandardCheckpointer().restore(entry / "params", target)
  params = _to_numpy(params)
  param_layout.check_params(params, config, f"param cache {str(entry)!r}")
  tokenizer = (TextTokenizer.load(entry / "tokenizer")
               if (entry / "tokenizer").is_dir() else None)
  return config, params, tokenizer


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
          tokenizer: TextTokenizer | None) -> None:
  entry.parent.mkdir(parents=True, exist_ok=True)
  tmp = pathlib.Path(tempfile.mkdtemp(dir=entry.parent,
                                      prefix=f".{entry.name}.tmp-"))
  try:
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp / "params", params)
    checkpointer.wait_until_finished()
    if tokenizer is not None:
      tokenizer.save(tmp / "tokenizer")
    meta = dataclasses.asdict(config) | {"format_version": FORMAT_VERSION}
    (tmp / "config.json").write_text(json.dumps(meta, indent=1))
    os.chmod(tmp, 0o755)  # mkdtemp makes it 0o700.
    try:
      os.rename(tmp, entry)
    except OSError:  # Another process finished the same entry first.
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
  if (entry / "config.json").is_file():
    try:
      result = _restore(entry)
      logging.info("Loaded converted params from %s", entry)
      return result
    except Exception as e:  # pylint: disable=broad-except
      logging.warning("Param cache %s is unusable (%s); converting again.",
                      entry, e)
      shutil.rmtree(entry, ignore_errors=True)
  config, params, tokenizer = loaders.load_checkpoint(source)
  logging.info("Caching converted params at %s", entry)
  _save(entry, config, params, tokenizer)
  return config, params, tokenizer
