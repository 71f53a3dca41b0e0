"""`experiments.calibrate_keys`' library call: key affines from the end of
the text, saved for presets to load.

1. Tokenize the text; calibration windows = its last `num_calib_windows`
   windows of eval.window_len, disjoint from the evaluation windows (the
   first eval.num_windows; asserted).
2. Record every layer's pre-RoPE keys and queries (full precision).
3. Per layer: `key_stats.layer_affine` (shift and scale per kv head and
   channel); save them to WORKDIR (`key_stats_store`).
"""

from __future__ import annotations

import dataclasses
import time

import ml_collections

from kvq_jax.calibration.key_stats import KeyStatsOptions, key_affines
from kvq_jax.calibration.recording import record_qkv
from kvq_jax.calibration.windows import WindowSplit, split_windows
from kvq_jax.eval.corpus import load_eval_text
from kvq_jax.eval.windows import text_ids
from kvq_jax.facade import LoadedModel, load_model
from kvq_jax.persist.key_stats_store import save_key_stats
from kvq_jax.settings.experiment_settings import (ExperimentSettings,
                                                  settings_from_config)


@dataclasses.dataclass(frozen=True)
class CalibrationInputs:
  """What a calibration reads: the resolved settings, the model, the text's
  source and its evaluation / calibration windows."""

  settings: ExperimentSettings
  model: LoadedModel
  model_name: str
  source: str
  split: WindowSplit


def calibration_inputs(config: ml_collections.ConfigDict,
                       eval_data: str | None, model: str | None,
                       num_calib_windows: int, load_key_stats: bool
                       ) -> CalibrationInputs:
  """Step 1 of the module docstring (`load_key_stats` False: the preset's
  cache.key_stats is what is being calibrated, so it is not loaded)."""
  resolved = config.copy_and_resolve_references()
  if not load_key_stats:
    resolved.cache.key_stats = ""
  settings = settings_from_config(resolved)
  model_name = model or settings.model
  lm = load_model(model_name, settings.dtype)
  if lm.tokenizer is None:
    raise ValueError(f"calibration: model {model_name!r} has no tokenizer.")
  lm.config.check_context(settings.eval.window_len,
                          f"eval.window_len={settings.eval.window_len}")
  text, source = load_eval_text(eval_data)
  ids, bos_id = text_ids(lm.tokenizer, text)
  split = split_windows(ids, settings.eval.window_len,
                        settings.eval.num_windows, num_calib_windows, bos_id)
  return CalibrationInputs(settings, lm, model_name, source, split)


def calibrate_keys(config: ml_collections.ConfigDict, workdir: str,
                   eval_data: str | None = None, model: str | None = None,
                   num_calib_windows: int = 4,
                   options: KeyStatsOptions = KeyStatsOptions()) -> dict:
  """Steps 1-3 of the module docstring; returns the sidecar's metadata."""
  inputs = calibration_inputs(config, eval_data, model, num_calib_windows,
                              load_key_stats=False)
  lm, split, settings = inputs.model, inputs.split, inputs.settings
  started = time.perf_counter()
  records = record_qkv(lm, split.calib_WxT, batch_size=1)
  affines = key_affines(records, lm.config.rotary_dim, options)
  metadata = {
      "model": inputs.model_name, "data": inputs.source,
      "calibration_tokens": list(split.calib_range),
      "evaluation_tokens": list(split.eval_range),
      "window_len": settings.eval.window_len,
      "num_calib_windows": num_calib_windows,
      "mode": options.mode, "range_quantile": options.range_quantile,
      "codebook_bits": list(options.codebook_bits),
      "outliers": options.outliers, "rotation": options.rotation,
      "alpha": options.alpha, "beta": options.beta, "shift": options.shift,
      "seconds": round(time.perf_counter() - started, 2)}
  path = save_key_stats(workdir, affines, metadata)
  return {**metadata, "path": str(path)}
