"""Learned clip ratios on disk: an orbax pytree plus a JSON sidecar.

Layout of a ratios directory:
  ratios/             orbax StandardCheckpointer: {"k": float32 [L], "v": [L]}
  clip_ratios.json    the base per-layer K/V short specs ('fp' where a tensor
                      stays full precision), the ratios again (for people),
                      the calibration losses and where the data came from.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any

import numpy as np
import orbax.checkpoint as ocp

SIDECAR = "clip_ratios.json"
TREE = "ratios"


@dataclasses.dataclass(frozen=True)
class ClipRatios:
  """Per-layer clip ratios of K and V and the unclipped specs they refine.

  k_specs / v_specs: short spec names (`kvq_jax.settings.short_specs`)
  without `_clip`, 'fp' for full precision (ratio 1.0 there).
  """

  k_L: np.ndarray
  v_L: np.ndarray
  k_specs: tuple[str, ...]
  v_specs: tuple[str, ...]
  metadata: dict[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    k = np.asarray(self.k_L, np.float32)
    v = np.asarray(self.v_L, np.float32)
    n = len(k)
    if not (k.ndim == v.ndim == 1 and len(v) == len(self.k_specs)
            == len(self.v_specs) == n):
      raise ValueError(
          f"ClipRatios: k_L {k.shape}, v_L {v.shape}, {len(self.k_specs)} "
          f"k_specs, {len(self.v_specs)} v_specs; allowed: one per layer.")
    for name, arr in (("k_L", k), ("v_L", v)):
      if not np.all((arr > 0) & (arr <= 1)):
        raise ValueError(f"ClipRatios.{name}={arr.tolist()}: allowed: ratios "
                         "in (0, 1].")
    object.__setattr__(self, "k_L", k)
    object.__setattr__(self, "v_L", v)
    object.__setattr__(self, "k_specs", tuple(self.k_specs))
    object.__setattr__(self, "v_specs", tuple(self.v_specs))

  @property
  def num_layers(self) -> int:
    return len(self.k_L)


def save_clip_ratios(path: str | os.PathLike, ratios: ClipRatios) -> None:
  """Writes `path`/ratios (orbax) and `path`/clip_ratios.json (overwrites)."""
  root = pathlib.Path(path).absolute()
  root.mkdir(parents=True, exist_ok=True)
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(root / TREE, {"k": ratios.k_L, "v": ratios.v_L},
                    force=True)
  checkpointer.wait_until_finished()
  sidecar = {
      "num_layers": ratios.num_layers,
      "k_specs": list(ratios.k_specs), "v_specs": list(ratios.v_specs),
      "k_ratios": [float(x) for x in ratios.k_L],
      "v_ratios": [float(x) for x in ratios.v_L],
      "metadata": ratios.metadata,
  }
  (root / SIDECAR).write_text(json.dumps(sidecar, indent=1))


def load_clip_ratios(path: str | os.PathLike) -> ClipRatios:
  """Reads what `save_clip_ratios` wrote (ValueError if missing/mismatched)."""
  root = pathlib.Path(path).absolute()
  if not (root / SIDECAR).is_file() or not (root / TREE).is_dir():
    raise ValueError(
        f"load_clip_ratios: {str(root)!r} has no {SIDECAR} and {TREE}/; "
        "allowed: a directory written by experiments.calibrate.")
  sidecar = json.loads((root / SIDECAR).read_text())
  n = sidecar["num_layers"]
  target = {"k": np.empty((n,), np.float32), "v": np.empty((n,), np.float32)}
  tree = ocp.StandardCheckpointer().restore(root / TREE, target)
  return ClipRatios(k_L=np.asarray(tree["k"]), v_L=np.asarray(tree["v"]),
                    k_specs=tuple(sidecar["k_specs"]),
                    v_specs=tuple(sidecar["v_specs"]),
                    metadata=sidecar.get("metadata", {}))
