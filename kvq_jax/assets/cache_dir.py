"""Where kvq_jax keeps downloaded checkpoints and converted parameters."""

from __future__ import annotations

import os
import pathlib

CACHE_ENV = "KVQ_JAX_CACHE"


def cache_root() -> pathlib.Path:
  """$KVQ_JAX_CACHE, else $XDG_CACHE_HOME/kvq_jax, else ~/.cache/kvq_jax."""
  override = os.environ.get(CACHE_ENV)
  if override:
    return pathlib.Path(override).expanduser()
  xdg = os.environ.get("XDG_CACHE_HOME")
  base = pathlib.Path(xdg).expanduser() if xdg else pathlib.Path.home() / ".cache"
  return base / "kvq_jax"
