"""Heatmaps of small tables (matplotlib, Agg backend: no display needed).

Used for per-layer sensitivity (rows = layers, the default) and for any
other row/column table (e.g. passkey accuracy, rows = context lengths).
"""

from __future__ import annotations

import pathlib
from typing import Callable, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend choice)
import numpy as np  # noqa: E402


def plot_heatmaps(path: str | pathlib.Path,
                  panels: Sequence[tuple[str, np.ndarray, Sequence[str]]],
                  suptitle: str = "", *,
                  row_labels: Sequence[str] | None = None,
                  ylabel: str = "layer", xlabel: str = "",
                  value_range: tuple[float, float] | None = None,
                  cell_text: Callable[[float], str] | None = None) -> None:
  """One heatmap per panel (title, matrix [R, C], column labels).

  Rows are layers unless `row_labels` (one per row) and `ylabel` say
  otherwise; `xlabel` names the columns (default: none). `value_range`
  (vmin, vmax) gives every panel the same colour scale (default: each panel
  its own); `cell_text` writes `cell_text(value)` into every finite cell.
  NaN cells (not measured) are left blank.
  """
  if not panels:
    raise ValueError("plot_heatmaps: panels is empty; allowed: >= 1 panel.")
  num_rows = panels[0][1].shape[0]
  if row_labels is not None and len(row_labels) != num_rows:
    raise ValueError(
        f"plot_heatmaps: {len(row_labels)} row_labels for {num_rows} rows; "
        "allowed: one label per row.")
  vmin, vmax = value_range if value_range is not None else (None, None)
  widths = [len(columns) + 2.0 for _, _, columns in panels]
  fig, axes = plt.subplots(
      1, len(panels), squeeze=False, width_ratios=widths,
      figsize=(0.8 * sum(widths), 3.0 + 0.22 * num_rows))
  for ax, (title, matrix, columns) in zip(axes[0], panels):
    matrix = np.asarray(matrix, float)
    if matrix.shape != (num_rows, len(columns)):
      raise ValueError(
          f"plot_heatmaps: panel {title!r} has shape {matrix.shape}; allowed: "
          f"({num_rows}, {len(columns)}) (rows x columns).")
    image = ax.imshow(np.ma.masked_invalid(matrix), aspect="auto",
                      cmap="viridis", interpolation="nearest", vmin=vmin,
                      vmax=vmax)
    ax.set_xticks(range(len(columns)), labels=list(columns), rotation=45,
                  ha="right")
    if row_labels is None:
      ax.set_yticks(range(num_rows))
    else:
      ax.set_yticks(range(num_rows), labels=list(row_labels))
    ax.set_ylabel(ylabel)
    if xlabel:
      ax.set_xlabel(xlabel)
    ax.set_title(title)
    if cell_text is not None:
      for (r, c), value in np.ndenumerate(matrix):
        if np.isfinite(value):
          # Dark text on viridis' light (high) end, light text elsewhere.
          shade = "black" if image.norm(value) > 0.6 else "white"
          ax.text(c, r, cell_text(float(value)), ha="center", va="center",
                  fontsize=8, color=shade)
    fig.colorbar(image, ax=ax)
  if suptitle:
    fig.suptitle(suptitle)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
