"""`experiments.calibrate`'s library call: learn, store, write a preset.

1. Tokenize the text; evaluation windows = the first `eval.num_windows`
   windows, calibration windows = the last `num_calib_windows` windows
   (disjoint, asserted).
2. Record every layer's q/k/v on the calibration windows (full precision).
3. Learn per-layer K and V clip ratios with Adam (`optimize.py`).
4. Save them (orbax + JSON) to WORKDIR/clip_ratios and write
   WORKDIR/calibrated.py, a preset that loads them.
5. Optionally evaluate the base preset and the calibrated one on the
   evaluation windows in one `evaluate_many` pass (shared baseline) and
   write WORKDIR/calibration.json.
"""

from __future__ import annotations

import json
import pathlib
import time

import jax.numpy as jnp
import ml_collections
from absl import logging

from kvq_jax.calibration import auto_key_stats
from kvq_jax.calibration.optimize import CalibrationOptions, learn_clip_ratios
from kvq_jax.calibration.preset import clip_layer_overrides, write_preset
from kvq_jax.calibration.recording import record_qkv
from kvq_jax.calibration.store import ClipRatios, save_clip_ratios
from kvq_jax.calibration.windows import split_windows
from kvq_jax.cli.progress import ProgressBar
from kvq_jax.eval.corpus import load_eval_text
from kvq_jax.eval.evaluate import evaluate_many
from kvq_jax.eval.windows import scored_mask, text_ids
from kvq_jax.facade import load_model, window_forward
from kvq_jax.models.decoder import layer_rope
from kvq_jax.settings.experiment_settings import settings_from_config
from kvq_jax.settings.presets import load_preset
from kvq_jax.settings.short_specs import parse_layer_overrides, short_name

RATIOS_DIR = "clip_ratios"
PRESET_FILE = "calibrated.py"


def _base_name(spec) -> str:
  if spec is None:
    return "fp"
  if spec.scale_dtype != "bfloat16":
    raise ValueError(
        f"calibrate: cache scale_dtype={spec.scale_dtype!r}; the written "
        "preset uses short spec names, which mean bfloat16 scales; allowed: "
        "bfloat16.")
  if spec.clip_ratio != 1.0:
    raise ValueError(
        f"calibrate: the base preset already clips (clip_ratio="
        f"{spec.clip_ratio}); allowed: 1.0 (calibration learns the ratio).")
  return short_name(spec)


@auto_key_stats.resolves_for_run
def calibrate(config: ml_collections.ConfigDict, workdir: str,
              eval_data: str | None = None, model: str | None = None,
              num_calib_windows: int = 2,
              options: CalibrationOptions = CalibrationOptions(),
              evaluate: bool = True) -> dict:
  """Runs steps 1-5 of the module docstring; returns the summary dict."""
  settings = settings_from_config(config)
  spec = settings.cache_spec
  if not settings.quantize or spec is None:
    raise ValueError("calibrate: the base preset has no quantized cache "
                     "(config.quantize / config.cache.k, .v); nothing to clip.")
  model_name = model or settings.model
  lm = load_model(model_name, settings.dtype)
  cfg = lm.config
  if lm.tokenizer is None:
    raise ValueError(f"calibrate: model {model_name!r} has no tokenizer.")
  cfg.check_context(settings.eval.window_len,
                    f"eval.window_len={settings.eval.window_len}")
  if cfg.local_layers and settings.eval.window_len > cfg.sliding_window:
    raise ValueError(
        f"calibrate: eval.window_len={settings.eval.window_len} exceeds the "
        f"model's sliding window ({cfg.sliding_window}); the calibration "
        "objective attends causally over whole windows, which is the local "
        "layers' attention only up to the window; allowed: window_len <= "
        f"{cfg.sliding_window}.")
  text, data_description = load_eval_text(eval_data)
  ids, bos_id = text_ids(lm.tokenizer, text)
  split = split_windows(ids, settings.eval.window_len,
                        settings.eval.num_windows, num_calib_windows, bos_id)
  logging.info("calibrate: eval tokens %s, calibration tokens %s",
               split.eval_range, split.calib_range)
  layers = [spec.layer(i) for i in range(cfg.num_layers)]
  started = time.perf_counter()
  records = record_qkv(lm, split.calib_WxT, settings.eval.batch_size)
  ropes = [layer_rope(cfg, i) for i in range(cfg.num_layers)]
  clips = learn_clip_ratios(records, layers, ropes, options,
                            progress=ProgressBar("calibrate"))
  seconds = time.perf_counter() - started
  config_overrides = dict((i, (k, v)) for i, k, v in
                          parse_layer_overrides(config.cache.layer_overrides))
  k_specs, v_specs = [], []
  for i in range(cfg.num_layers):
    k, v = config_overrides.get(i, (spec.k, spec.v))
    k_specs.append(_base_name(k))
    v_specs.append(_base_name(v))
  losses = [{"layer": i, "unclipped": c.loss_unclipped,
             "learned": c.loss_learned, "kept": c.loss}
            for i, c in enumerate(clips)]
  metadata = {
      "model": model_name, "eval_data": data_description,
      "window_len": settings.eval.window_len,
      "calibration_tokens": list(split.calib_range),
      "evaluation_tokens": list(split.eval_range),
      "num_calibration_windows": num_calib_windows,
      "options": {"steps": options.steps,
                  "learning_rate": options.learning_rate,
                  "num_queries": options.num_queries,
                  "init_ratio": options.init_ratio},
      "losses": losses, "seconds": seconds}
  ratios = ClipRatios(k_L=[c.k for c in clips], v_L=[c.v for c in clips],
                      k_specs=tuple(k_specs), v_specs=tuple(v_specs),
                      metadata=metadata)
  out = pathlib.Path(workdir)
  out.mkdir(parents=True, exist_ok=True)
  save_clip_ratios(out / RATIOS_DIR, ratios)
  preset_config = config.copy_and_resolve_references()
  preset_config.model = model_name
  preset_config.eval.num_windows = split.eval_WxT.shape[0]
  preset_path = write_preset(
      out / PRESET_FILE, preset_config, RATIOS_DIR,
      f"Learned per-layer K/V clip ratios (kvq_jax.calibration) on "
      f"{short_name(spec.k)}/{short_name(spec.v)}.\n\nCalibrated on tokens "
      f"{split.calib_range} of {data_description}; evaluate on tokens "
      f"{split.eval_range} (eval.num_windows={split.eval_WxT.shape[0]}).\n"
      f"Run: python -m experiments.run --config={out / PRESET_FILE}"
      + (f" --eval_data={eval_data}" if eval_data else "")
      + f" --model={model_name}\n")
  summary = {"preset": str(preset_path), "ratios": str(out / RATIOS_DIR),
             "k_ratios": [c.k for c in clips],
             "v_ratios": [c.v for c in clips],
             "layer_overrides": clip_layer_overrides(ratios),
             "mean_loss_unclipped": sum(c.loss_unclipped for c in clips)
                                    / len(clips),
             "mean_loss_kept": sum(c.loss for c in clips) / len(clips),
             "calibration_seconds": seconds, **metadata}
  if evaluate:
    summary.update(_evaluate(lm, settings, preset_path, split))
  (out / "calibration.json").write_text(json.dumps(summary, indent=1))
  return summary


def _evaluate(lm, settings, preset_path, split) -> dict:
  """Delta PPL of the base preset and of the written preset, one shared baseline."""
  calibrated = settings_from_config(load_preset(str(preset_path)))
  dtype = jnp.dtype(settings.cache_dtype).name
  quants = {"unclipped": window_forward(lm, settings.cache_spec, dtype),
            "learned_clip": window_forward(lm, calibrated.cache_spec, dtype)}
  mask = scored_mask(settings.eval.window_len, settings.eval.scoring)
  results = evaluate_many(split.eval_WxT, mask, window_forward(lm), quants,
                          batch_size=settings.eval.batch_size,
                          progress=ProgressBar("eval"))
  out = {"eval_num_windows": int(split.eval_WxT.shape[0]),
         "ppl_baseline": results["unclipped"].baseline.ppl}
  for name, r in results.items():
    out[f"ppl_{name}"] = r.quant.ppl
    out[f"delta_ppl_{name}"] = r.quant.ppl - r.baseline.ppl
    out[f"kl_{name}"] = r.kl_mean
    out[f"top1_{name}"] = r.top1_agreement
  logging.info("calibrate: delta PPL unclipped %+.4f -> learned clip %+.4f",
               out["delta_ppl_unclipped"], out["delta_ppl_learned_clip"])
  return out
