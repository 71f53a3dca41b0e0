"""Sensitivity heatmaps (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

import pathlib
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend choice)
import numpy as np  # noqa: E402


def plot_heatmaps(path: str | pathlib.Path,
                  panels: Sequence[tuple[str, np.ndarray, Sequence[str]]],
                  suptitle: str = "") -> None:
  """One heatmap per panel (title, matrix [L, C], column labels); rows = layers.

  NaN cells (not measured) are left blank.
  """
  if not panels:
    raise ValueError("plot_heatmaps: panels is empty; allowed: >= 1 panel.")
  num_layers = panels[0][1].shape[0]
  widths = [len(columns) + 2.0 for _, _, columns in panels]
  fig, axes = plt.subplots(
      1, len(panels), squeeze=False, width_ratios=widths,
      figsize=(0.8 * sum(widths), 3.0 + 0.22 * num_layers))
  for ax, (title, matrix, columns) in zip(axes[0], panels):
    matrix = np.asarray(matrix, float)
    if matrix.shape != (num_layers, len(columns)):
      raise ValueError(
          f"plot_heatmaps: panel {title!r} has shape {matrix.shape}; allowed: "
          f"({num_layers}, {len(columns)}) (layers x columns).")
    image = ax.imshow(np.ma.masked_invalid(matrix), aspect="auto",
                      cmap="viridis", interpolation="nearest")
    ax.set_xticks(range(len(columns)), labels=list(columns), rotation=45,
                  ha="right")
    ax.set_yticks(range(num_layers))
    ax.set_ylabel("layer")
    ax.set_title(title)
    fig.colorbar(image, ax=ax)
  if suptitle:
    fig.suptitle(suptitle)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
