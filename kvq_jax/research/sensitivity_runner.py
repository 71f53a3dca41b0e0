"""`experiments.layer_sensitivity`'s one library call.

Loads the model and text like `run.runner.run`, sweeps the base
preset layer by layer (and any extra `formats`) with one compiled
`SelectiveForward`, checks the all-layers probe against the real quantized
cache, and writes into `workdir`:
  sensitivity.json  the table (`research.sensitivity_table`), allocator input
  sensitivity.csv   one row per probe
  heatmap.png       layers x {K, V, KV} (ΔPPL, KL), all-but-one, formats
  summary.txt       the printed summary
"""

from __future__ import annotations

import json
import pathlib
from typing import Sequence

import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from kvq_jax.calibration import auto_key_stats
from kvq_jax.calibration.windows import split_windows
from kvq_jax.cli.progress import ProgressBar
from kvq_jax.eval.corpus import load_eval_text
from kvq_jax.eval.windows import make_windows, scored_mask, text_ids
from kvq_jax.facade import load_model, window_forward
from kvq_jax.research import sensitivity_table as table_lib
from kvq_jax.research.heatmap import plot_heatmaps
from kvq_jax.research.selective_cache import layer_specs
from kvq_jax.research.selective_forward import SelectiveForward
from kvq_jax.research.sensitivity import check_formats, plan_probes, run_sweep
from kvq_jax.settings.experiment_settings import settings_from_config
from kvq_jax.settings.short_specs import parse_short_spec, short_name

OUTPUTS = ("sensitivity.json", "sensitivity.csv", "heatmap.png",
           "summary.txt")


def _heatmap_panels(table: dict):
  meta, rows = table["meta"], table["rows"]
  n = meta["num_layers"]
  panels = []
  for metric, title in (("delta_ppl", "ΔPPL, one layer"),
                        ("kl_mean", "KL, one layer")):
    matrix = np.stack([table_lib.only_matrix(rows, n, metric, t)
                       for t in ("K", "V", "KV")], axis=1)
    panels.append((title, matrix, ("K", "V", "KV")))
  abo = table_lib.all_but_one_vector(rows, n, "delta_ppl")
  if not np.all(np.isnan(abo)):
    panels.append(("ΔPPL, all but one", abo[:, None], ("KV",)))
  if meta["extra_formats"]:
    columns, cols = [], []
    for tensor in ("K", "V"):
      for fmt in meta["formats"]:
        columns.append(f"{tensor} {fmt}")
        cols.append(table_lib.only_matrix(rows, n, "delta_ppl", tensor, fmt))
    panels.append(("ΔPPL per format", np.stack(cols, axis=1), columns))
  return panels


def probe_windows(ids, window_len: int, num_windows: int,
                  bos_id: int | None, from_end: bool) -> np.ndarray:
  """The first `num_windows` windows of the text, or (from_end) its last
  ones, which must leave room for at least one window before them."""
  if from_end:
    return split_windows(ids, window_len, 1, num_windows, bos_id).calib_WxT
  return make_windows(ids, window_len, num_windows, bos_id)


@auto_key_stats.resolves_for_run
def run_layer_sensitivity(config: ml_collections.ConfigDict, workdir: str,
                          eval_data: str | None = None,
                          model: str | None = None, name: str = "run",
                          formats: Sequence[str] = (),
                          all_but_one: bool = True,
                          check: bool = True, from_end: bool = False,
                          k_formats: Sequence[str] = (),
                          v_formats: Sequence[str] = ()) -> dict:
  """Measures, writes OUTPUTS into `workdir` and returns the table dict.

  `formats` are measured K-only and V-only; `k_formats` K-only and
  `v_formats` V-only besides (static keys have no value form).

  `from_end`: probe the last eval.num_windows windows of the text instead of
  the first, so an allocation chosen from the table can be verified on the
  first windows without having seen them (disjointness asserted, as for
  calibration).
  """
  settings = settings_from_config(config)
  spec = settings.cache_spec
  if not settings.quantize or spec is None:
    raise ValueError(
        f"config {name!r} has quantize={settings.quantize} and cache spec "
        f"{spec}; the sensitivity sweep needs a quantized preset (e.g. "
        "int4_g32).")
  extras_k = check_formats(list(formats) + list(k_formats))
  extras_v = check_formats(list(formats) + list(v_formats))
  extras = tuple(dict.fromkeys(extras_k + extras_v))
  model_name = model or settings.model
  lm = load_model(model_name, settings.dtype)
  if lm.tokenizer is None:
    raise ValueError(f"model {model_name!r} has no tokenizer; the sweep "
                     "needs one to tokenize the evaluation text.")
  lm.config.check_context(settings.eval.window_len,
                          f"eval.window_len={settings.eval.window_len}")
  specs = layer_specs(lm.config, spec,
                      [parse_short_spec(f) for f in extras_k],
                      [parse_short_spec(f) for f in extras_v],
                      dtype=settings.cache_dtype)
  n = lm.config.num_layers
  base_k = [short_name(spec.layer(i).k) for i in range(n)]
  base_v = [short_name(spec.layer(i).v) for i in range(n)]
  text, data_description = load_eval_text(eval_data)
  ids, bos_id = text_ids(lm.tokenizer, text)
  windows = probe_windows(ids, settings.eval.window_len,
                          settings.eval.num_windows, bos_id, from_end)
  mask = scored_mask(settings.eval.window_len, settings.eval.scoring)
  probes = plan_probes(base_k, base_v, extras_k, all_but_one=all_but_one,
                       v_formats=extras_v)
  logging.info("%d probes over %d windows of %d tokens", len(probes),
               windows.shape[0], windows.shape[1])
  forward = SelectiveForward(lm.decoder, specs)
  reference = (window_forward(lm, spec, settings.cache_dtype) if check
               else None)
  result = run_sweep(forward, window_forward(lm), windows, mask, probes,
                     batch_size=settings.eval.batch_size, reference=reference,
                     progress=ProgressBar("sweep"))
  timing = dict(result.timing)
  per_window = timing["sweep_s"] / windows.shape[0]
  timing["sweep_s_per_window"] = per_window
  timing["sweep_s_extrapolated_8_windows"] = 8 * per_window
  measured = sorted(set(base_k + base_v + list(extras)) - {"fp"})
  resolved = config.copy_and_resolve_references()
  resolved.model = model_name
  table = {
      "meta": {
          "preset": name, "model": model_name, "eval_data": data_description,
          "windows_from": "end" if from_end else "start",
          "scoring": settings.eval.scoring, "num_layers": n,
          "head_dim": lm.config.head_dim, "cache_dtype": settings.cache_dtype,
          "fp_bits": 8 * jnp.dtype(settings.cache_dtype).itemsize,
          # What the allocator charges a format's full-precision slots.
          "full_precision_slots": {
              "context": settings.eval.window_len, "sink": spec.sink,
              "residual": spec.residual, "flush_block": spec.flush_block,
              "window_bits": 8 * jnp.dtype(spec.window_dtype).itemsize},
          "base_k": base_k, "base_v": base_v, "extra_formats": list(extras),
          "formats": measured,
          "config": json.loads(resolved.to_json_best_effort()),
      },
      "baseline": result.baseline, "timing": timing, "checks": result.checks,
      "rows": result.rows,
  }
  out = pathlib.Path(workdir)
  out.mkdir(parents=True, exist_ok=True)
  table_lib.write_json(out / "sensitivity.json", table)
  table_lib.write_csv(out / "sensitivity.csv", result.rows)
  plot_heatmaps(out / "heatmap.png", _heatmap_panels(table),
                suptitle=f"{name} on {model_name}")
  text_summary = table_lib.summary(table)
  (out / "summary.txt").write_text(text_summary + "\n", encoding="utf-8")
  print(text_summary)
  return table
