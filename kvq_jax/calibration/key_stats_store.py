"""Calibrated key affines on disk: an orbax pytree plus a JSON sidecar.

Layout of a key-stats directory:
  affine/          orbax StandardCheckpointer: {"shift": float32 [L, K, H],
                   "scale": float32 [L, K, H]}
  key_stats.json   shapes, the options and where the calibration data came
                   from (model, text, token range).
A preset loads it with `config.cache.key_stats = 'DIR'`
(`kvq_jax.experiment.settings`).
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
from typing import Any, Sequence

import numpy as np
import orbax.checkpoint as ocp

from kvq_jax.cache.key_affine import KeyAffine

SIDECAR = "key_stats.json"
TREE = "affine"


def save_key_stats(path: str | os.PathLike, affines: Sequence[KeyAffine],
                   metadata: dict[str, Any]) -> pathlib.Path:
  """Writes `path`/affine (orbax) and `path`/key_stats.json (overwrites)."""
  root = pathlib.Path(path).absolute()
  root.mkdir(parents=True, exist_ok=True)
  shift = np.stack([a.arrays()[0] for a in affines])
  scale = np.stack([a.arrays()[1] for a in affines])
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(root / TREE, {"shift": shift, "scale": scale}, force=True)
  checkpointer.wait_until_finished()
  (root / SIDECAR).write_text(json.dumps(
      {"shape": list(shift.shape), "metadata": metadata}, indent=1))
  return root


@functools.lru_cache(maxsize=8)
def _load(root: str, mtime_ns: int) -> tuple[KeyAffine, ...]:
  del mtime_ns  # part of the cache key: a rewritten directory reloads.
  sidecar = json.loads((pathlib.Path(root) / SIDECAR).read_text())
  shape = tuple(sidecar["shape"])
  target = {"shift": np.empty(shape, np.float32),
            "scale": np.empty(shape, np.float32)}
  tree = ocp.StandardCheckpointer().restore(pathlib.Path(root) / TREE, target)
  return tuple(KeyAffine.from_arrays(s, c)
               for s, c in zip(np.asarray(tree["shift"]),
                               np.asarray(tree["scale"])))


def load_key_stats(path: str | os.PathLike) -> tuple[KeyAffine, ...]:
  """The per-layer affines `save_key_stats` wrote (ValueError if missing)."""
  root = pathlib.Path(path).absolute()
  if not (root / SIDECAR).is_file() or not (root / TREE).is_dir():
    raise ValueError(
        f"key stats: {str(root)!r} has no {SIDECAR} and {TREE}/; allowed: a "
        "directory written by `python -m experiments.calibrate_keys` (its "
        "preset's docstring gives the command).")
  return _load(str(root), (root / SIDECAR).stat().st_mtime_ns)
