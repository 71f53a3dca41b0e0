"""`experiments.context_curve`'s library call: perplexity against context.

For every context length L the text is cut into non-overlapping windows of L
tokens (BOS first where the model wants one, `eval.windows.text_ids`), the
first `num_windows` of them (fewer when the text holds fewer). Each window is
an independent sequence prefilled in chunks of `eval.prefill_chunk` tokens
into an empty cache of capacity L (`facade.chunked_window_forward`: the cache
is written piece by piece, as a server would) and scored on its last N
predictions (`scoring='last_N'`, default last_256: the same number of
predictions at every L, each with at least L - N tokens of context), or
on its second half. Per batch of windows one baseline (full-precision cache)
pass is shared by every point (`eval.evaluate.evaluate_many`), so every
point's ΔPPL at L is paired with the same baseline on the same windows.

Outputs in the workdir: context_curve.csv (one row per point and L),
context_curve.json (meta, baseline per L, the rows, the resolved config),
context_curve.png (ΔPPL with its 95% CI and KL against L) and summary.md.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import platform
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from kvq_jax.bench.process_memory import (peak_rss_gib, release_freed_memory,
                                          reset_peak_rss)
from kvq_jax.bench.timing import machine_description
from kvq_jax.calibration import auto_key_stats
from kvq_jax.capacity import memory
from kvq_jax.cli.progress import ProgressBar
from kvq_jax.eval.corpus import load_eval_text
from kvq_jax.eval.evaluate import evaluate_many
from kvq_jax.eval.windows import (logits_needed, make_windows, scored_mask,
                                  text_ids, text_per_window)
from kvq_jax.facade import (chunked_window_forward, clear_compiled_windows,
                            load_model)
from kvq_jax.longctx.curve_plot import curve_plot
from kvq_jax.longctx.curve_table import summary_markdown, write_csv
from kvq_jax.settings.experiment_settings import settings_from_config
from kvq_jax.sweep.grid import SweepPoint
from kvq_jax.sweep.points import parse_points
from kvq_jax.sweep.runner import unique_points

DEFAULT_CONTEXTS = (512, 1024, 2048, 4096, 8192)


@dataclasses.dataclass(frozen=True)
class CurveRequest:
  """What one context curve measures.

  Attributes:
    contexts: window lengths L (tokens, BOS included), each >= 2.
    points: `--points` items (presets or short specs, `sweep.points`);
      empty/None evaluates the --config preset's own cache as `name`.
    num_windows: windows per L (>= 1), capped by what the text holds: one
      count for every L, or one per L in the order of `contexts` (e.g.
      16,16,8,4,4 for equal compute at short and long L).
    scoring: 'last_N' (N <= L - 1 at every L), 'second_half' or 'all'.
    allow_beyond_trained: evaluate contexts above the model's
      `max_position_embeddings` (refused otherwise).
  """

  contexts: Sequence[int] = DEFAULT_CONTEXTS
  points: str | Sequence[str] | None = None
  num_windows: int | Sequence[int] = 4
  scoring: str = "last_256"
  allow_beyond_trained: bool = False


def check_contexts(contexts: Sequence[int], max_positions: int,
                   allow_beyond_trained: bool) -> tuple[int, ...]:
  """The contexts, ascending; ValueError for a bad, repeated or (without
  `allow_beyond_trained`) beyond-trained one."""
  contexts = tuple(contexts)
  if not contexts:
    raise ValueError("--contexts is empty; allowed: one or more window "
                     "lengths, e.g. 512,1024,2048.")
  for c in contexts:
    if isinstance(c, bool) or not isinstance(c, int) or c < 2:
      raise ValueError(f"--contexts item {c!r}: allowed: integers >= 2 "
                       "(tokens per window).")
  if len(set(contexts)) != len(contexts):
    raise ValueError(f"--contexts={','.join(map(str, contexts))} repeats a "
                     "length; allowed: distinct lengths.")
  beyond = [c for c in contexts if c > max_positions]
  if beyond and not allow_beyond_trained:
    raise ValueError(
        f"--contexts {','.join(map(str, beyond))} exceed the model's trained "
        f"context (max_position_embeddings={max_positions}); allowed: "
        f"<= {max_positions}, or pass --allow_beyond_trained to measure "
        "beyond it anyway.")
  return tuple(sorted(contexts))


def _points(request: CurveRequest, base, name: str, head_dim: int,
            num_layers: int) -> list[SweepPoint]:
  if request.points:
    points = parse_points(request.points, base, head_dim=head_dim,
                          num_layers=num_layers)
  elif base is not None:
    points = [SweepPoint(name, base, source="config")]
  else:
    points = []
  if not points:
    raise ValueError(
        "context_curve: nothing to compare with the baseline: the --config "
        "preset has no quantized cache (quantize=False or type='none') and "
        "--points is empty; allowed: a quantizing preset or --points.")
  return unique_points(points)


@dataclasses.dataclass(frozen=True)
class _Context:
  """One context length's windows [W, L], scored mask and kept logits."""

  length: int
  windows_WxL: np.ndarray
  mask_L: np.ndarray
  keep: int  # Logits positions each forward returns (the last ones).


def windows_per_context(contexts: Sequence[int],
                        num_windows: int | Sequence[int]) -> dict[int, int]:
  """{L: windows requested}: one count for every L, or one per L in the
  order of `contexts`; ValueError otherwise."""
  counts = ([num_windows] * len(contexts) if isinstance(num_windows, int)
            else list(num_windows))
  if len(counts) != len(contexts) or any(
      isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in counts):
    raise ValueError(
        f"--num_windows={num_windows!r}: allowed: one integer >= 1, or one "
        f"per context ({len(contexts)} here, in the order of --contexts); "
        "capped by what the text holds.")
  return dict(zip(contexts, counts))


def _prepare(contexts: Sequence[int], ids: np.ndarray, bos_id: int | None,
             requested: dict[int, int], scoring: str) -> list[_Context]:
  """Windows and masks for every L, before anything is evaluated (a text
  too short for the longest L fails at once, not after the others)."""
  out = []
  for length in contexts:
    num_windows = requested[length]
    available = len(ids) // text_per_window(length, bos_id)
    # No whole window (available 0): make_windows raises, saying why.
    count = max(1, min(num_windows, available))
    if 0 < available < num_windows:
      logging.warning("context_curve: the text holds %d windows of %d tokens; "
                      "using %d, not %d.", available, length, available,
                      num_windows)
    windows = make_windows(ids, length, count, bos_id)
    mask = scored_mask(length, scoring)
    out.append(_Context(length, windows, mask, logits_needed(mask)))
  return out


class _Timed:
  """A forward that waits for its result and adds its wall time (compile
  included) to `seconds[key]`."""

  def __init__(self, fn: Callable, seconds: dict, key):
    self.fn, self.seconds, self.key = fn, seconds, key

  def __call__(self, tokens_BxT):
    started = time.perf_counter()
    out = jax.block_until_ready(self.fn(tokens_BxT))
    self.seconds[self.key] = (self.seconds.get(self.key, 0.0)
                              + time.perf_counter() - started)
    return out


class _TokenProgress:
  """One bar over every context: progress in window tokens."""

  def __init__(self, contexts: list[_Context]):
    self.bar = ProgressBar("context_curve (tokens)")
    self.total = sum(c.windows_WxL.size for c in contexts)
    self.done_before = 0

  def at(self, context: _Context) -> Callable[[int, int], None]:
    before = self.done_before
    self.done_before += context.windows_WxL.size
    return lambda done, _: self.bar(before + done * context.length,
                                    self.total)


@auto_key_stats.resolves_for_run
def run_context_curve(config: ml_collections.ConfigDict,
                      workdir: str | os.PathLike, request: CurveRequest,
                      eval_data: str | None = None, model: str | None = None,
                      name: str = "config") -> list[dict]:
  """Evaluates every point at every context; returns the CSV rows.

  `name` labels the --config preset's own cache when `request.points` is
  empty. Writes the four files of the module docstring into `workdir`.
  """
  settings = settings_from_config(config)
  model_name = model or settings.model
  lm = load_model(model_name, settings.dtype)
  cfg = lm.config
  requested = windows_per_context(request.contexts, request.num_windows)
  contexts = check_contexts(request.contexts, cfg.max_position_embeddings,
                            request.allow_beyond_trained)
  points = _points(request, settings.cache_spec if settings.quantize else None,
                   name, cfg.head_dim, cfg.num_layers)
  if lm.tokenizer is None:
    raise ValueError(f"context_curve: model {model_name!r} has no tokenizer.")
  text, data_description = load_eval_text(eval_data)
  ids, bos_id = text_ids(lm.tokenizer, text)
  prepared = _prepare(contexts, ids, bos_id, requested, request.scoring)
  chunk, cache_dtype = settings.eval.prefill_chunk, settings.cache_dtype
  logging.info("context_curve: %d points at contexts %s, prefill chunks of "
               "%d, scoring %s", len(points), ",".join(map(str, contexts)),
               chunk, request.scoring)
  progress = _TokenProgress(prepared)
  rows, baseline = [], []
  started_all = time.perf_counter()
  peak_overall = peak_rss_gib()  # Model load included.
  for ctx in prepared:
    # Each context's programs never run again: drop them and the freed
    # heap, so the context's peak RSS is its own, not the run's history.
    clear_compiled_windows()
    release_freed_memory()
    reset_peak_rss()
    seconds: dict = {}
    base_fn = _Timed(chunked_window_forward(lm, None, chunk=chunk,
                                            keep=ctx.keep), seconds, None)
    quants = {p.name: _Timed(chunked_window_forward(lm, p.spec, cache_dtype,
                                                    chunk=chunk,
                                                    keep=ctx.keep),
                             seconds, p.name)
              for p in points}
    results = evaluate_many(ctx.windows_WxL, ctx.mask_L, base_fn, quants,
                            batch_size=settings.eval.batch_size,
                            progress=progress.at(ctx), tail=ctx.keep)
    rss = peak_rss_gib()
    peak_overall = max(peak_overall, rss)
    first = results[points[0].name]
    baseline.append({
        "context": ctx.length, "ppl": first.baseline.ppl,
        "ppl_stderr": first.baseline.stderr, "num_windows": first.num_windows,
        "num_scored_tokens": first.num_scored_tokens,
        "seconds": seconds[None], "peak_rss_gib": rss})
    for p in points:
      rows.append(_row(p, ctx.length, results[p.name], seconds[p.name],
                       seconds[None], rss, cfg, cache_dtype,
                       request.scoring, chunk))
  total_seconds = time.perf_counter() - started_all
  meta = {
      "model": model_name, "eval_data": data_description,
      "scoring": request.scoring, "prefill_chunk": chunk,
      "contexts": list(contexts), "num_windows_requested": [requested[c] for c in contexts],
      "max_position_embeddings": cfg.max_position_embeddings,
      "allow_beyond_trained": request.allow_beyond_trained,
      "bos": bos_id is not None, "cache_dtype": cache_dtype,
      "dtype": settings.dtype, "batch_size": settings.eval.batch_size,
      "baseline_passes": "one per window per context, shared by every point",
      "eval_seconds": total_seconds, "peak_rss_gib": peak_overall,
      "machine": machine_description(), "python": platform.python_version()}
  _write(pathlib.Path(workdir), config, model_name, meta, baseline, rows)
  return rows


def _row(point: SweepPoint, length: int, result, seconds: float,
         baseline_seconds: float, rss: float, cfg, cache_dtype: str,
         scoring: str, chunk: int) -> dict:
  dtype = jnp.dtype(cache_dtype)
  return {
      "name": point.name, "source": point.source, "context": length,
      "num_windows": result.num_windows,
      "num_scored_tokens": result.num_scored_tokens, "scoring": scoring,
      "prefill_chunk": chunk,
      "bits_per_element": memory.effective_bits(cfg, point.spec, dtype,
                                                length),
      "stored_bits_per_element": memory.theoretical_bits(cfg, point.spec,
                                                         dtype),
      "full_precision": memory.full_precision_note(cfg, point.spec),
      **{k: v for k, v in result.metrics().items() if k != "window_len"},
      "seconds": seconds, "baseline_seconds": baseline_seconds,
      "peak_rss_gib": rss}


def _write(out: pathlib.Path, config: ml_collections.ConfigDict,
           model_name: str, meta: dict, baseline: list[dict],
           rows: list[dict]) -> None:
  out.mkdir(parents=True, exist_ok=True)
  write_csv(out / "context_curve.csv", rows)
  resolved = config.copy_and_resolve_references()
  resolved.model = model_name  # --model wins over config.model: record it.
  (out / "context_curve.json").write_text(json.dumps(
      {"meta": meta, "baseline": baseline, "rows": rows,
       "config": json.loads(resolved.to_json_best_effort())}, indent=2)
      + "\n")
  curve_plot(rows, out / "context_curve.png", title=(
      f"{model_name}: {meta['scoring']} scoring, prefill chunks of "
      f"{meta['prefill_chunk']}; one baseline pass per context"))
  summary = summary_markdown(meta, baseline, rows)
  (out / "summary.md").write_text(summary)
  print(summary)
