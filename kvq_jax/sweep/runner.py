"""`experiments.sweep`'s library call: evaluate many cache specs at once.

One `evaluate_many` pass: per batch of windows the baseline forward runs once
and every point's quantized forward is compared against it. Writes
workdir/sweep.csv (every point, skipped ones with their reason),
workdir/pareto.png, workdir/config.json (the resolved base config),
workdir/run_info.json (evaluation data, timing, memory, machine),
workdir/per_window.npz (every point's per-window ΔNLL sums) and, for the
requested pairs, workdir/pairs.csv (`sweep.pairs`: paired differences
between two points on the same windows).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import time
from typing import Sequence

import jax.numpy as jnp
import ml_collections
from absl import logging

from kvq_jax.bench.process_memory import peak_rss_gib
from kvq_jax.bench.timing import machine_description
from kvq_jax.capacity import memory
from kvq_jax.cli.progress import ProgressBar
from kvq_jax.eval.corpus import load_eval_text
from kvq_jax.eval.evaluate import evaluate_many
from kvq_jax.eval.windows import make_windows, scored_mask, text_ids
from kvq_jax.facade import load_model, window_forward
from kvq_jax.settings import key_stats_context
from kvq_jax.settings.experiment_settings import settings_from_config
from kvq_jax.sweep.grid import Skipped, SweepPoint, expand_grid
from kvq_jax.sweep import pairs as sweep_pairs
from kvq_jax.sweep.pareto import pareto_front
from kvq_jax.sweep.plot import pareto_plot
from kvq_jax.sweep.points import parse_points
from kvq_jax.sweep.table import PAIRED_COLUMNS, text_table, write_csv


@dataclasses.dataclass(frozen=True)
class SweepRequest:
  """The grid axes and named points of one sweep (see `expand_grid`)."""

  formats: Sequence[str] = ("int8", "int4", "int2")
  group_sizes: Sequence[int] = (32,)
  schemes: Sequence[str] = ("sym", "asym")
  residuals: Sequence[int] = (0,)
  points: str | Sequence[str] | None = None
  # 'A:B' point-name pairs compared window by window (`sweep.pairs`).
  pairs: str | Sequence[str] | None = None
  # A name for the base config's own cache (with its overrides) as a point
  # of its own; None: the base config supplies settings only.
  base_point: str | None = None


def unique_points(points: list[SweepPoint]) -> list[SweepPoint]:
  """Drops later points whose spec equals an earlier one (same forward).

  Raises ValueError when two different specs share a name (e.g. two preset
  files both called allocated_4.py): the CSV could not tell them apart.
  """
  names, seen, out = {}, set(), []
  for p in points:
    if names.setdefault(p.name, p.spec) != p.spec:
      raise ValueError(
          f"sweep: two different points are both named {p.name!r}; "
          "allowed: distinct names (rename one of the preset files).")
    if p.spec in seen:
      logging.info("sweep: %s duplicates an earlier point; evaluated once.",
                   p.name)
      continue
    seen.add(p.spec)
    out.append(p)
  return out


def run_sweep(config: ml_collections.ConfigDict, workdir: str | os.PathLike,
              request: SweepRequest, eval_data: str | None = None,
              model: str | None = None) -> list[dict]:
  """Evaluates every valid point; returns the CSV rows (also written)."""
  settings = settings_from_config(config)
  lm = load_model(model or settings.model, settings.dtype)
  cfg = lm.config
  cfg.check_context(settings.eval.window_len,
                    f"eval.window_len={settings.eval.window_len}")
  base = settings.cache_spec
  grid, skipped = expand_grid(base, request.formats, request.group_sizes,
                              request.schemes, request.residuals,
                              head_dim=cfg.head_dim, num_layers=cfg.num_layers)
  for s in skipped:
    logging.warning("sweep: skipping %s: %s", s.name, s.reason)
  named = parse_points(request.points, base, head_dim=cfg.head_dim,
                       num_layers=cfg.num_layers)
  if request.base_point is not None:
    if base is None:
      raise ValueError(f"sweep: the base config {request.base_point!r} has "
                       "no quantized cache (the baseline is always "
                       "evaluated).")
    named = [SweepPoint(request.base_point, base, source="config")] + named
  points = unique_points(grid + named)
  pair_names = sweep_pairs.parse_pairs(request.pairs)
  unknown = {n for pair in pair_names for n in pair} - {p.name for p in points}
  if unknown:
    raise ValueError(
        f"sweep: --pairs names {', '.join(sorted(unknown))}, which are not "
        f"points of this sweep; allowed: {', '.join(p.name for p in points)}.")
  if not points:
    raise ValueError("sweep: no valid point to evaluate (every grid "
                     "combination was skipped and --points is empty).")
  if lm.tokenizer is None:
    raise ValueError("sweep: the model has no tokenizer.")
  text, data_description = load_eval_text(eval_data)
  ids, bos_id = text_ids(lm.tokenizer, text)
  windows = make_windows(ids, settings.eval.window_len,
                         settings.eval.num_windows, bos_id)
  mask = scored_mask(settings.eval.window_len, settings.eval.scoring)
  logging.info("sweep: %d points, %d skipped, %d windows of %d", len(points),
               len(skipped), *windows.shape)
  cache_dtype = settings.cache_dtype
  quants = {p.name: window_forward(lm, p.spec, cache_dtype) for p in points}
  started = time.perf_counter()
  results = evaluate_many(windows, mask, window_forward(lm), quants,
                          batch_size=settings.eval.batch_size,
                          progress=ProgressBar("sweep"))
  eval_seconds = time.perf_counter() - started
  rows = []
  for p in points:
    r = results[p.name]
    per_token, fixed = memory.cache_bytes(cfg, p.spec, jnp.dtype(cache_dtype))
    rows.append({
        "name": p.name, "source": p.source, "status": "ok",
        # Effective bits at the evaluated context (every full-precision
        # byte charged): the Pareto front's x axis.
        "bits_per_element": memory.effective_bits(
            cfg, p.spec, jnp.dtype(cache_dtype), r.window_len),
        "stored_bits_per_element": memory.theoretical_bits(
            cfg, p.spec, jnp.dtype(cache_dtype)),
        "bits_per_element_at_4096": memory.effective_bits(
            cfg, p.spec, jnp.dtype(cache_dtype), 4096),
        "full_precision": memory.full_precision_note(cfg, p.spec),
        "bytes_per_token": per_token, "fixed_bytes_per_sequence": fixed,
        "ppl": r.quant.ppl, "ppl_baseline": r.baseline.ppl,
        "delta_ppl": r.quant.ppl - r.baseline.ppl, "kl_mean": r.kl_mean,
        "top1_agreement": r.top1_agreement, "num_windows": r.num_windows,
        "window_len": r.window_len, "num_scored_tokens": r.num_scored_tokens,
        **{k: v for k, v in r.metrics().items() if k in PAIRED_COLUMNS}})
  front = pareto_front([r["bits_per_element"] for r in rows],
                       [r["delta_ppl"] for r in rows])
  for row, on_front in zip(rows, front):
    row["pareto"] = bool(on_front)
  rows += [skipped_row(s) for s in skipped]
  out = pathlib.Path(workdir)
  out.mkdir(parents=True, exist_ok=True)
  write_csv(out / "sweep.csv", rows)
  sums = {p.name: results[p.name].delta_nll_sums_W for p in points}
  kl_sums = {p.name: results[p.name].kl_sums_W for p in points}
  tokens_per_window = int(mask.sum())
  sweep_pairs.save_window_sums(out / "per_window.npz", sums,
                               tokens_per_window, kl_sums)
  pair_rows = [sweep_pairs.pair_row(sums, tokens_per_window, a, b, kl_sums)
               for a, b in pair_names]
  if pair_rows:
    sweep_pairs.write_pairs_csv(out / "pairs.csv", pair_rows)
    for r in pair_rows:
      logging.info("pair %s - %s: dNLL %+.5f +- %.5f nats (z %.2f): %s; "
                   "KL %+.5f +- %.5f (z %.2f)",
                   r["a"], r["b"], r["delta_nll_diff"],
                   r["delta_nll_diff_stderr"], r["z"], r["verdict"],
                   r["kl_diff"], r["kl_diff_stderr"], r["kl_z"])
  baseline_ppl = rows[0]["ppl_baseline"]
  pareto_plot(rows, out / "pareto.png", title=(
      f"{model or settings.model}: {windows.shape[0]} windows of "
      f"{windows.shape[1]}, {settings.eval.scoring} scoring; baseline PPL "
      f"{baseline_ppl:.3f}"))
  resolved = config.copy_and_resolve_references()
  resolved.model = model or settings.model
  (out / "config.json").write_text(resolved.to_json_best_effort(indent=2))
  # One baseline pass plus every point's pass per window, compile included.
  info = {"eval_data": data_description, "eval_seconds": eval_seconds,
          "eval_seconds_per_window": eval_seconds / windows.shape[0],
          "passes_per_window": 1 + len(points),
          "peak_rss_gib": peak_rss_gib(), "machine": machine_description()}
  if key_stats_context.resolved_in_run():  # Recipes' calibration tokens.
    info["key_stats"] = key_stats_context.resolved_in_run()
  (out / "run_info.json").write_text(json.dumps(info, indent=2) + "\n")
  logging.info("sweep: %.1f s per window (%d passes), peak RSS %.2f GiB",
               info["eval_seconds_per_window"], info["passes_per_window"],
               info["peak_rss_gib"])
  _log_table(rows)
  return rows


def skipped_row(s: Skipped) -> dict:
  return {"name": s.name, "source": "grid", "status": f"skipped: {s.reason}",
          "pareto": False}


def _log_table(rows: list[dict]) -> None:
  print(text_table(rows))
  if any(not math.isfinite(r.get("ppl") or 0.0) for r in rows
         if r["status"] == "ok"):
    logging.warning("sweep: some points have non-finite perplexity.")
