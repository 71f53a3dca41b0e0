"""`experiments.run`'s one library call: baseline vs quantized cache."""

from __future__ import annotations

import functools
import platform
import time

import jax
import jax.numpy as jnp
import ml_collections
from absl import logging

from kvq_jax.bench.decode_speed import decode_tokens_per_s, equal_slots
from kvq_jax.bench.speed_note import speed_note
from kvq_jax.bench.process_memory import peak_rss_gib
from kvq_jax.bench.timing import machine_description
from kvq_jax.calibration import auto_key_stats
from kvq_jax.capacity import memory
from kvq_jax.cli.progress import ProgressBar
from kvq_jax.eval.corpus import load_eval_text
from kvq_jax.eval.evaluate import evaluate_windows
from kvq_jax.eval.windows import make_windows, scored_mask, text_ids
from kvq_jax.facade import load_model, window_forward
from kvq_jax.report import run_summary
from kvq_jax.settings.experiment_settings import settings_from_config
from kvq_jax.sharding import make_mesh, shard_params, sharded_window_forward


def _decode_metrics(lm, settings, speedup_estimate: float | None,
                    machine: str) -> dict:
  """The decode benchmark's keys: tokens/s of the baseline (and quantized)
  cache at `settings.decode_bench`, measured speed-up and its note."""
  db = settings.decode_bench
  quant_spec = settings.cache_spec if settings.quantize else None
  slots = equal_slots(db.context + db.steps + 1, [quant_spec])
  metrics = {"decode_batch_size": db.batch_size,
             "decode_context": db.context, "decode_slots": slots}
  logging.info("decode benchmark: batch %d, context %d, %d steps",
               db.batch_size, db.context, db.steps)
  metrics["decode_tokens_per_s_baseline"] = decode_tokens_per_s(
      lm, None, jnp.dtype(settings.dtype), db.batch_size, db.context,
      db.steps, slots)
  if settings.quantize:
    metrics["decode_tokens_per_s_quant"] = decode_tokens_per_s(
        lm, quant_spec, jnp.dtype(settings.cache_dtype), db.batch_size,
        db.context, db.steps, slots)
    metrics["decode_speedup_measured"] = (
        metrics["decode_tokens_per_s_quant"]
        / metrics["decode_tokens_per_s_baseline"])
    metrics["speed_note"] = speed_note(speedup_estimate,
                                       metrics["decode_speedup_measured"],
                                       machine)
  return metrics


@auto_key_stats.resolves_for_run
def run(config: ml_collections.ConfigDict, workdir: str,
        eval_data: str | None = None, model: str | None = None,
        name: str = "run", mesh: str | None = None) -> dict:
  """Evaluates `config` and writes workdir/{config,metrics}.json, summary.md.

  `mesh` 'DATAxMODEL' (e.g. '2x4'; None or '' = one device) shards the
  weights (`shard_params`) and, for the evaluation, the windows and KV caches
  (`sharded_window_forward`) over a ('data', 'model') mesh; the decode
  benchmark then runs with the sharded weights. Returns the metrics dict
  (also printed as a table).

  Multi-process (`sharding.distributed` started first): every process calls
  this with the same arguments and reads the same model and text; `mesh` is
  required and spans every process's devices. Every process returns the
  same evaluation metrics; process 0 alone shows progress, prints the table
  and writes the files. The decode benchmark is skipped (a note says so):
  its weights are spread over the processes, so a step's time would be the
  cross-process collectives', not the cache's.
  """
  settings = settings_from_config(config)
  model_name = model or settings.model
  processes = jax.process_count()
  if processes > 1 and not mesh:
    raise ValueError(
        f"mesh={mesh!r} with {processes} processes: allowed: a mesh "
        f"'DATAxMODEL' with DATA * MODEL = {jax.device_count()} (every "
        f"process's devices), e.g. '{jax.device_count()}x1'.")
  main_process = jax.process_index() == 0
  device_mesh = make_mesh(mesh) if mesh else None  # Fail before loading.
  lm = load_model(model_name, settings.dtype)
  if device_mesh is not None:
    shard_params(lm.decoder, device_mesh)
  if lm.tokenizer is None:
    raise ValueError(f"model {model_name!r} has no tokenizer; the runner "
                     "needs one to tokenize the evaluation text.")
  lm.config.check_context(settings.eval.window_len,  # Before compiling.
                          f"eval.window_len={settings.eval.window_len}")
  # Byte accounting first: a budget below the weights fails before the
  # (long) evaluation, not after it.
  baseline_dtype = jnp.dtype(settings.dtype)
  quant_dtype = jnp.dtype(settings.cache_dtype)
  quant_spec = settings.cache_spec if settings.quantize else None
  memory_metrics = memory.memory_report(
      lm.config, quant_spec, quant_dtype if settings.quantize else baseline_dtype,
      baseline_dtype, settings.memory.budget_gib,
      settings.memory.weight_bytes_per_param, settings.eval.window_len)
  if not settings.quantize:  # No quantized cache: no quantized-side numbers.
    memory_metrics = {k: memory_metrics[k] for k in memory.BASELINE_KEYS}
  text, data_description = load_eval_text(eval_data)
  ids, bos_id = text_ids(lm.tokenizer, text)
  windows = make_windows(ids, settings.eval.window_len,
                         settings.eval.num_windows, bos_id)
  mask = scored_mask(settings.eval.window_len, settings.eval.scoring)
  logging.info("tokenized: %d tokens; evaluating %d windows of %d", len(ids),
               windows.shape[0], windows.shape[1])
  forward = (window_forward if device_mesh is None else
             functools.partial(sharded_window_forward, mesh=device_mesh))
  baseline_fn = forward(lm)
  quant_fn = (forward(lm, settings.cache_spec, settings.cache_dtype)
              if settings.quantize else None)
  started = time.perf_counter()
  progress = ProgressBar("eval") if main_process else None
  if progress is not None:  # The bar shows while the first batch runs.
    progress(0, windows.shape[0])
  result = evaluate_windows(windows, mask, baseline_fn, quant_fn,
                            batch_size=settings.eval.batch_size,
                            progress=progress)
  eval_seconds = time.perf_counter() - started
  metrics = {"preset": name, "model": model_name,
             "eval_data": data_description, "scoring": settings.eval.scoring}
  if device_mesh is not None:
    metrics["mesh"] = "x".join(str(n) for n in device_mesh.devices.shape)
  if settings.key_stats_source is not None:  # Where the key affines came
    # from; for a recipe, its calibration tokens (disjoint from these).
    metrics["key_stats"] = settings.key_stats_source
  metrics.update(result.metrics())
  # Wall time of the whole evaluation (baseline and quantized passes,
  # compilation included) per window, and the process's peak RSS so far
  # (model load + evaluation; the decode benchmark runs after it).
  metrics["eval_seconds_per_window"] = eval_seconds / windows.shape[0]
  metrics["peak_rss_gib_eval"] = peak_rss_gib()
  metrics.update(memory_metrics)
  machine = machine_description()
  if processes > 1:
    metrics["processes"] = processes
    metrics["speed_note"] = (
        f"decode benchmark not run: the weights are spread over {processes} "
        "processes, so a decode step would time their collectives; run it "
        "with one process.")
  else:
    metrics.update(_decode_metrics(lm, settings,
                                   metrics.get("speedup_estimate"), machine))
  metrics["machine"] = machine
  metrics["python"] = platform.python_version()
  if not main_process:
    return metrics
  summary = run_summary.summary_markdown(name, metrics, machine)
  resolved = config.copy_and_resolve_references()
  resolved.model = model_name  # --model wins over config.model: record it.
  out = run_summary.write_run(
      workdir, resolved.to_json_best_effort(indent=2), metrics, summary)
  print(summary)
  print(f"wrote {out}/: config.json, metrics.json, summary.md")
  return metrics
