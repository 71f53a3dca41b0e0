"""`experiments.report`'s library call: gathered results as markdown + plots.

Rows (`results_collect.collect_results`) are grouped by what makes their
numbers comparable: model, evaluation data, windows (count x length),
scoring and baseline PPL (to 4 decimals; a different weight dtype or corpus
shows up there). Each group gets a level-3 heading naming all of them, its
own table sorted by effective bits, and its own Pareto plot; rows of
different groups are never put in one table or plot. The markdown has no
title of its own, so it can sit under any document's section.

Data is shown and grouped as the recorded path's last two parts
(`wikitext-2-raw/wiki.test.raw`), so one file read from different working
directories is one group.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
from typing import Callable

from kvq_jax.eval.uncertainty_format import (describe_delta_ci,
                                             format_mean_stderr, format_signed)
from kvq_jax.report.results_collect import Collected, ResultRow, collect_results
from kvq_jax.report.task_sections import collect_sections
from kvq_jax.sweep import reference
from kvq_jax.sweep.pareto import pareto_front
from kvq_jax.sweep.plot import pareto_plot

NOT_RECORDED = "data not recorded"


def data_label(data: str | None) -> str:
  """'wikitext-2-raw/wiki.test.raw' for any path to that file; descriptions
  without a '/' (the default stdlib corpus) as they are."""
  if data is None:
    return NOT_RECORDED
  if "/" not in data:
    return data
  return "/".join(pathlib.PurePosixPath(data).parts[-2:])


@dataclasses.dataclass(frozen=True)
class Group:
  """Rows whose numbers are comparable, sorted by effective bits."""

  model: str
  data: str | None  # As recorded by the group's first row.
  num_windows: int
  window_len: int
  scoring: str
  rows: tuple[ResultRow, ...]

  @property
  def ppl_baseline(self) -> float:
    return self.rows[0].ppl_baseline

  @property
  def ppl_baseline_stderr(self) -> float | None:
    return next((r.ppl_baseline_stderr for r in self.rows
                 if r.ppl_baseline_stderr is not None), None)

  @property
  def sources(self) -> tuple[str, ...]:
    return tuple(sorted({r.source for r in self.rows}))

  @property
  def matches_llama_cpp(self) -> bool:
    return reference.matches_llama_cpp_protocol(
        self.model, self.data, self.num_windows, self.window_len,
        self.scoring)


def _group_key(row: ResultRow) -> tuple:
  return (row.model, data_label(row.data), row.num_windows, row.window_len,
          row.scoring, f"{row.ppl_baseline:.4f}")


def _bits_key(row: ResultRow) -> float:
  bits = row.effective_bits
  return bits if math.isfinite(bits) else math.inf


def group_rows(rows: tuple[ResultRow, ...] | list[ResultRow]) -> list[Group]:
  """Rows split into groups (module docstring), in sorted key order; in a
  group, rows sorted by effective bits, ties in the order found."""
  keyed: dict[tuple, list[ResultRow]] = {}
  for row in rows:
    keyed.setdefault(_group_key(row), []).append(row)
  groups = []
  for key in sorted(keyed):
    members = sorted(keyed[key], key=_bits_key)
    first = members[0]
    groups.append(Group(first.model, first.data, first.num_windows,
                        first.window_len, first.scoring, tuple(members)))
  return groups


def _optional(value: float | None, fmt: str) -> str:
  return "" if value is None else fmt.format(value)


def _delta(row: ResultRow) -> str:
  low, high = row.delta_ppl_ci95_low, row.delta_ppl_ci95_high
  if low is None or high is None:
    return format_signed(row.delta_ppl, 4)
  return describe_delta_ci(row.delta_ppl, low, high)


def _mean_stderr(mean: float, stderr: float | None, fallback: str) -> str:
  return fallback.format(mean) if stderr is None else format_mean_stderr(
      mean, stderr)


def _llama_cpp(row: ResultRow) -> str:
  point = reference.llama_cpp_point_for(row.name)
  return "" if point is None else format_signed(
      reference.llama_cpp_delta_ppl(point), 2)


# (header, cell, shown): `shown(group)` decides whether the column is there.
Column = tuple[str, Callable[[ResultRow], str], Callable[[Group], bool]]


def _always(unused_group: Group) -> bool:
  return True


def _any_recorded(field: str) -> Callable[[Group], bool]:
  """Shown when some row of the group recorded `field`."""
  return lambda g: any(getattr(r, field) is not None for r in g.rows)


def _columns(group: Group) -> list[Column]:
  """The group's columns: optional ones only where they say something."""
  columns: list[Column] = [
      ("preset", lambda r: r.name, _always),
      ("run", lambda r: f"`{r.source}`", lambda g: len(g.sources) > 1),
      ("stored bits", lambda r: _optional(r.stored_bits, "{:.2f}"),
       _any_recorded("stored_bits")),
      (f"eff. bits @{group.window_len}", lambda r: f"{r.effective_bits:.2f}",
       _always),
      ("eff. bits @4096", lambda r: _optional(r.bits_at_4096, "{:.2f}"),
       _any_recorded("bits_at_4096")),
      ("bytes/token", lambda r: f"{r.bytes_per_token:,.0f}", _always),
      ("fixed bytes/seq",
       lambda r: _optional(r.fixed_bytes_per_sequence, "{:,.0f}"),
       lambda g: any(r.fixed_bytes_per_sequence for r in g.rows)),
      ("ΔPPL [95% CI]", _delta, _always),
      ("KL ± stderr", lambda r: _mean_stderr(r.kl_mean, r.kl_stderr,
                                             "{:.5f}"), _always),
      ("top-1 ± stderr",
       lambda r: _mean_stderr(r.top1_agreement, r.top1_stderr, "{:.4f}"),
       _always),
      ("llama.cpp ΔPPL", _llama_cpp,
       lambda g: g.matches_llama_cpp and any(_llama_cpp(r) for r in g.rows)),
  ]
  return [c for c in columns if c[2](group)]


def _escape(cell: str) -> str:
  return cell.replace("|", "\\|")


def group_markdown(group: Group, plot: str | None = None) -> str:
  """The group's heading, baseline line and table."""
  stderr = group.ppl_baseline_stderr
  baseline = f"{group.ppl_baseline:.4f}" + (
      "" if stderr is None else f" ± {stderr:.4f}")
  data = (f"({NOT_RECORDED})" if group.data is None
          else f"on `{data_label(group.data)}`")
  sources = ", ".join(f"`{s}`" for s in group.sources)
  lines = [
      f"### `{group.model}` {data}: {group.num_windows} windows x "
      f"{group.window_len} tokens, scoring `{group.scoring}`",
      "",
      f"Baseline (full-precision cache) PPL {baseline}. From {sources}"
      + ("" if plot is None else f"; Pareto plot `{plot}`") + ".",
      "",
  ]
  columns = _columns(group)
  lines.append("| " + " | ".join(c[0] for c in columns) + " |")
  lines.append("|" + "---|" * len(columns))
  for row in group.rows:
    lines.append("| " + " | ".join(_escape(c[1](row)) for c in columns)
                 + " |")
  if group.data is None and any(c[0] == "llama.cpp ΔPPL" for c in columns):
    lines += ["", "llama.cpp ΔPPL assumes these windows are WikiText-2 test "
              f"({reference.LLAMA_CPP_DATA_FILE}): the run did not record "
              "its data."]
  return "\n".join(lines)


LEGEND = (
    "One table per model, evaluation data, windows, scoring and baseline "
    "PPL; \"data not recorded\": a sweep older than run_info.json's "
    "eval_data. Columns: stored bits per K/V element (codes + scales + zeros); "
    "effective bits per element at the evaluated context and at 4,096 "
    "tokens, every full-precision token (residual window, sinks) charged; "
    "bytes/token: quantized K+V bytes per token over the layers whose cache "
    "grows with the context; fixed bytes/seq: what does not grow with it "
    "(full-precision residual/flush windows and sinks, the sliding-window "
    "layers' rings). ΔPPL: quantized minus baseline "
    "perplexity with its 95% CI from paired per-token differences clustered "
    "over windows, rounded to two significant digits of the half-width; "
    "\"no measurable change\" when the CI contains 0. KL(base‖quant) and "
    "top-1 agreement: mean ± stderr over windows. llama.cpp ΔPPL: "
    "llama.cpp's perplexity with the same cache type minus its own f16 "
    f"({reference.LLAMA_CPP_PROTOCOL}, `kvq_jax/sweep/reference.py`), "
    "shown only for groups evaluated the same way.")


def plot_paths(plot: str | os.PathLike, count: int) -> list[pathlib.Path]:
  """`plot` itself for one group; PLOT-1.png, PLOT-2.png, ... for more."""
  path = pathlib.Path(plot)
  if count == 1:
    return [path]
  return [path.with_name(f"{path.stem}-{i}{path.suffix}")
          for i in range(1, count + 1)]


def write_group_plot(group: Group, path: pathlib.Path) -> None:
  """The group's effective bits vs ΔPPL with its Pareto front
  (`sweep.plot.pareto_plot`; llama.cpp's points where comparable)."""
  front = pareto_front([r.effective_bits for r in group.rows],
                       [r.delta_ppl for r in group.rows])
  rows = [{"name": r.name, "source": r.kind, "pareto": bool(on_front),
           "bits_per_element": r.effective_bits, "delta_ppl": r.delta_ppl}
          for r, on_front in zip(group.rows, front)]
  path.parent.mkdir(parents=True, exist_ok=True)
  pareto_plot(rows, path, show_reference=group.matches_llama_cpp, title=(
      f"{group.model}, {data_label(group.data)}: {group.num_windows} "
      f"windows of {group.window_len}, {group.scoring} scoring; baseline "
      f"PPL {group.ppl_baseline:.3f}"))


def results_markdown(collected: Collected,
                     plots: list[str] | None = None) -> str:
  """Every group's section, the legend and the notes on files left out.

  `plots[i]` is named under group i when given.
  """
  groups = group_rows(collected.rows)
  if plots is not None and len(plots) != len(groups):
    raise ValueError(f"results_markdown: {len(plots)} plot paths for "
                     f"{len(groups)} groups; allowed: one per group.")
  parts = [f"Results under `{collected.folder}` "
           f"(`python -m experiments.report`): {len(collected.rows)} rows "
           f"in {len(groups)} group{'s' if len(groups) > 1 else ''}."]
  parts += [group_markdown(g, None if plots is None else plots[i])
            for i, g in enumerate(groups)]
  parts.append(LEGEND)
  if collected.notes:
    parts.append("Not shown:\n\n" + "\n".join(f"* {n}"
                                              for n in collected.notes))
  return "\n\n".join(parts) + "\n"


def write_report(runs: str | os.PathLike, out: str | os.PathLike | None = None,
                 plot: str | os.PathLike | None = None) -> str:
  """Gathers the results under `runs`; returns the markdown, also written
  to `out` when given. `plot`: one Pareto PNG per group (`plot_paths`).
  The serving and HumanEval results follow (`task_sections`); a folder
  with neither quality nor those results is a ValueError."""
  sections, section_notes = collect_sections(runs)
  try:
    collected = collect_results(runs)
  except ValueError:
    if not sections:
      raise
    collected = None
  parts = []
  if collected is not None:
    plots = None
    if plot is not None:
      groups = group_rows(collected.rows)
      paths = plot_paths(plot, len(groups))
      for group, path in zip(groups, paths):
        write_group_plot(group, path)
      plots = [str(p) for p in paths]
    parts.append(results_markdown(collected, plots))
  if sections:
    parts.append("## Serving and downstream tasks\n\n"
                 + "\n\n".join(sections) + "\n")
  if section_notes:
    parts.append("Not shown:\n\n" + "\n".join(f"* {n}"
                                                for n in section_notes) + "\n")
  text = "\n".join(parts)
  if out is not None:
    out_path = pathlib.Path(out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(text, encoding="utf-8")
  return text
