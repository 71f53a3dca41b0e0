"""Passkey retrieval's heatmaps (`longctx/passkey.py`): accuracy per
context x depth, each preset beside the baseline (PNG)."""

from __future__ import annotations

import pathlib
from typing import TYPE_CHECKING, Sequence

import numpy as np

from kvq_jax.research.heatmap import plot_heatmaps

if TYPE_CHECKING:
  from kvq_jax.longctx.passkey import PasskeyRequest


def _matrix(rows: Sequence[dict], preset: str, contexts: Sequence[int],
            depths: Sequence[int]) -> np.ndarray:
  acc = {(r["context"], r["depth"]): r["accuracy"] for r in rows
         if r["preset"] == preset}
  return np.asarray([[acc.get((c, d), np.nan) for d in depths]
                     for c in contexts], float)


def passkey_plot(path: pathlib.Path, rows: Sequence[dict],
                 presets: Sequence[str], request: PasskeyRequest,
                 title: str) -> None:
  """One accuracy heatmap per preset in `presets`, side by side: rows the
  contexts, columns the depths, cells the CSV rows' accuracy."""
  panels = [(p, _matrix(rows, p, request.contexts, request.depths),
             [f"{d}%" for d in request.depths]) for p in presets]
  plot_heatmaps(path, panels, title,
                row_labels=[str(c) for c in request.contexts],
                ylabel="context (tokens)",
                xlabel="depth of the key (percent of the filler)",
                value_range=(0.0, 1.0),
                cell_text=lambda v: f"{v:.2f}")
