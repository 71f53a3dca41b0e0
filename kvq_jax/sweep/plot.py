"""Pareto plot of a sweep: bits per element against delta PPL (PNG, Agg)."""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  pylint: disable=g-import-not-at-top

from kvq_jax.sweep import reference  # noqa: E402
from kvq_jax.sweep.table import finite  # noqa: E402


def pareto_plot(rows: list[dict], path: str | os.PathLike, *,
                title: str = "KV-cache quantization sweep",
                show_reference: bool = True) -> None:
  """Scatter of every evaluated row, its Pareto front joined by a line.

  `rows` carry bits_per_element, delta_ppl, name, source and pareto (the
  CSV's columns); rows without finite numbers (skipped points) are left out.
  The y axis is symlog: delta PPL spans 0.01 to hundreds and can dip below 0.
  """
  done = [r for r in rows
          if finite(r.get("bits_per_element")) and finite(r.get("delta_ppl"))]
  fig, ax = plt.subplots(figsize=(9, 6), dpi=120)
  grid = [r for r in done if r.get("source") != "point"]
  named = [r for r in done if r.get("source") == "point"]
  if grid:
    ax.scatter([r["bits_per_element"] for r in grid],
               [r["delta_ppl"] for r in grid], s=22, c="tab:blue", alpha=0.6,
               label="kvq_jax grid")
  if named:
    ax.scatter([r["bits_per_element"] for r in named],
               [r["delta_ppl"] for r in named], s=40, marker="D",
               c="tab:green", label="kvq_jax named points")
  front = sorted((r for r in done if r.get("pareto")),
                 key=lambda r: r["bits_per_element"])
  if front:
    ax.plot([r["bits_per_element"] for r in front],
            [r["delta_ppl"] for r in front], "-o", c="tab:red", lw=1.5,
            ms=7, mfc="none", label="kvq_jax Pareto front")
  for r in done:
    if r.get("pareto") or r.get("source") == "point":
      ax.annotate(r["name"], (r["bits_per_element"], r["delta_ppl"]),
                  fontsize=7, xytext=(4, 4), textcoords="offset points")
  if show_reference:
    ref = reference.LLAMA_CPP_POINTS
    xs = [p.bits_per_element for p in ref]
    ys = [reference.llama_cpp_delta_ppl(p) for p in ref]
    ax.scatter(xs, ys, s=50, marker="x", c="black",
               label=f"{reference.LLAMA_CPP_PROTOCOL} "
                     f"(vs its f16 {reference.LLAMA_CPP_F16_PPL})")
    for p, x, y in zip(ref, xs, ys):
      ax.annotate(f"llama.cpp {p.name}", (x, y), fontsize=7, color="0.3",
                  xytext=(4, -10), textcoords="offset points")
  ax.set_yscale("symlog", linthresh=0.01)
  ax.axhline(0.0, color="0.7", lw=0.8)
  ax.set_xlabel("KV cache effective bits per element at the evaluated "
                "context (codes, scales, zeros, full-precision tokens)")
  ax.set_ylabel("delta PPL vs full-precision cache (symlog)")
  ax.set_title(title, fontsize=10)
  ax.grid(True, which="both", alpha=0.3)
  ax.legend(fontsize=8, loc="upper right")
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)
