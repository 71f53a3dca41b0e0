"""Calibrated key affines on disk: an orbax pytree plus a JSON sidecar.

Layout of a key-stats directory:
  affine/          orbax StandardCheckpointer: {"shift": float32 [L, K, H],
                   "scale": float32 [L, K, H], "codebook_B": float32
                   [L, 2^B] for each calibrated bit width B, "rotation":
                   float32 [L, K, H, H] when calibrated rotations are in
                   use, "distortion": float64 [L, H, 9] in transform mode}
  key_stats.json   shapes, the affines' mode ("std", "range" or "transform"), the
                   options and where the calibration data came from (model,
                   text, token range).
  complete.json    size and crc32 of every other file, written last
                   (`kvq_jax.assets.entry_marker`, the asset cache's marker).
A preset loads it with `config.cache.key_stats = 'DIR'`
(`kvq_jax.settings.experiment_settings`).

A save is atomic: the directory is written beside DIR, its marker last,
then renamed to DIR (an earlier key-stats DIR is replaced whole), so DIR is
never half written. A load verifies the files against the marker and refuses
a damaged directory with one ValueError; a directory written before the
marker existed loads unverified, with a warning.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
from typing import Any, Sequence

from absl import logging
import numpy as np
import orbax.checkpoint as ocp

from kvq_jax.assets import entry_marker
from kvq_jax.cache.key_affine import KeyAffine

SIDECAR = "key_stats.json"
TREE = "affine"


def _check_replaceable(root: pathlib.Path) -> None:
  """ValueError unless `root` is absent, empty or a key-stats directory
  (what a save replaces whole)."""
  if not root.exists():
    return
  if not root.is_dir():
    raise ValueError(f"save_key_stats: {str(root)!r} is a file; allowed: a "
                     "new directory or an earlier key-stats directory.")
  others = sorted(p.name for p in root.iterdir()
                  if p.name not in (TREE, SIDECAR, entry_marker.MARKER))
  if others:
    raise ValueError(
        f"save_key_stats: {str(root)!r} holds {', '.join(others[:5])}"
        f"{' ...' if len(others) > 5 else ''} besides key statistics, and a "
        "save replaces the directory whole; allowed: a new or empty "
        "directory, or an earlier key-stats directory.")


def save_key_stats(path: str | os.PathLike, affines: Sequence[KeyAffine],
                   metadata: dict[str, Any]) -> pathlib.Path:
  """Writes `path`/affine (orbax), `path`/key_stats.json and the checksum
  marker, atomically (module docstring): an earlier key-stats directory at
  `path` is replaced whole; one holding other files is refused."""
  root = pathlib.Path(path).absolute()
  shift = np.stack([a.arrays()[0] for a in affines])
  scale = np.stack([a.arrays()[1] for a in affines])
  bits = sorted({b for a in affines for b, _ in a.codebooks})
  if any(sorted(dict(a.codebooks)) != bits for a in affines):
    raise ValueError("save_key_stats: every layer needs codebooks for the "
                     "same bit widths.")
  tree = {"shift": shift, "scale": scale}
  rotated = {bool(a.rotation) for a in affines}
  if len(rotated) != 1:
    raise ValueError("save_key_stats: either every layer has a calibrated "
                     "rotation or none has.")
  rotated = rotated.pop()
  if rotated:
    tree["rotation"] = np.stack([a.rotation_array() for a in affines])
  for b in bits:
    tree[f"codebook_{b}"] = np.stack(
        [np.asarray(a.levels(b), np.float32) for a in affines])
  tables = {bool(a.distortion) for a in affines}
  if len(tables) != 1:
    raise ValueError("save_key_stats: either every layer has a distortion "
                     "table or none has.")
  tables = tables.pop()
  if tables:
    tree["distortion"] = np.stack(
        [np.asarray(a.distortion, np.float64) for a in affines])
  modes = {a.mode for a in affines}
  if len(modes) != 1:
    raise ValueError(f"save_key_stats: affines of modes {sorted(modes)}; "
                     "allowed: one mode for all layers.")
  sidecar = json.dumps(
      {"shape": list(shift.shape), "mode": modes.pop(),
       "codebook_bits": bits, "rotation": rotated,
       "distortion": tables, "metadata": metadata}, indent=1)
  _check_replaceable(root)
  with entry_marker.written_aside(root, replace=True) as tmp:
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp / TREE, tree)
    checkpointer.wait_until_finished()
    (tmp / SIDECAR).write_text(sidecar)
  return root


def save_identity_key_stats(path: str | os.PathLike, num_layers: int,
                            num_kv_heads: int, head_dim: int,
                            mode: str, rotated: bool | None = None
                            ) -> pathlib.Path:
  """`KeyAffine.stand_in` for every layer, in `mode` (`rotated` as there):
  a stand-in of a model's shape for checks whose result does not depend on
  calibrated numbers (a paged cache against a contiguous one, bytes). Not a
  calibration: the metadata says so."""
  affines = [KeyAffine.stand_in(num_kv_heads, head_dim, mode, rotated)
             ] * num_layers
  return save_key_stats(path, affines, {"identity": True})


@functools.lru_cache(maxsize=8)
def _load(root: str, mtime_ns: int) -> tuple[KeyAffine, ...]:
  del mtime_ns  # part of the cache key: a rewritten directory reloads.
  sidecar = json.loads((pathlib.Path(root) / SIDECAR).read_text())
  shape = tuple(sidecar["shape"])
  bits = sidecar.get("codebook_bits", [])
  target = {"shift": np.empty(shape, np.float32),
            "scale": np.empty(shape, np.float32)}
  for b in bits:
    target[f"codebook_{b}"] = np.empty((shape[0], 2 ** b), np.float32)
  rotated = sidecar.get("rotation", False)
  if rotated:
    target["rotation"] = np.empty(shape + shape[-1:], np.float32)
  tables = sidecar.get("distortion", False)
  if tables:
    target["distortion"] = np.empty((shape[0], shape[2], 9), np.float64)
  tree = ocp.StandardCheckpointer().restore(pathlib.Path(root) / TREE, target)
  mode = sidecar.get("mode", "std")  # written before modes existed: std.
  return tuple(
      KeyAffine.from_arrays(
          tree["shift"][i], tree["scale"][i], mode,
          {b: np.asarray(tree[f"codebook_{b}"][i]) for b in bits},
          tree["rotation"][i] if rotated else None,
          tree["distortion"][i] if tables else None)
      for i in range(shape[0]))


def check_model(path: str | os.PathLike, model: str) -> None:
  """Refuses key stats whose sidecar names another model than `model`
  (identity stand-ins name none and pass)."""
  try:
    sidecar = json.loads((pathlib.Path(path) / SIDECAR).read_text())
    recorded = sidecar["metadata"].get("model")
  except (OSError, ValueError, KeyError, AttributeError):
    return  # load_key_stats says what is missing.
  if recorded is not None and recorded != model:
    raise ValueError(
        f"key stats {str(path)!r} were calibrated for model {recorded!r}; "
        f"this run's model is {model!r}. Allowed: statistics of the model "
        "being run: cache.key_stats='auto[:...]' builds them on first use, "
        "or `python -m experiments.calibrate_keys --model=...` writes them.")


def load_key_stats(path: str | os.PathLike) -> tuple[KeyAffine, ...]:
  """The per-layer affines `save_key_stats` wrote (ValueError if missing)."""
  root = pathlib.Path(path).absolute()
  if not (root / SIDECAR).is_file() or not (root / TREE).is_dir():
    raise ValueError(
        f"key stats: {str(root)!r} has no {SIDECAR} and {TREE}/; allowed: a "
        "directory written by `python -m experiments.calibrate_keys` (its "
        "preset's docstring gives the command).")
  _verify(root)
  return _load(str(root), (root / SIDECAR).stat().st_mtime_ns)


def _verify(root: pathlib.Path) -> None:
  """ValueError if `root`'s files differ from its checksum marker; a warning
  if it has none (written before the marker existed)."""
  if not (root / entry_marker.MARKER).is_file():
    logging.warning(
        "key stats %s have no %s (written before key-stats checksums): "
        "loaded unverified; `python -m experiments.calibrate_keys` rewrites "
        "them with one.", root, entry_marker.MARKER)
    return
  try:
    entry_marker.check_marker(root)
  except entry_marker.Unusable as e:
    raise ValueError(
        f"key stats {str(root)!r} are damaged ({e}); allowed: an intact "
        "directory: write it again (`python -m experiments.calibrate_keys`)."
    ) from e
