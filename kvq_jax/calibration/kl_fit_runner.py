"""`experiments.fit_keys`' library call: static-key ranges, codebooks and
rotations fitted to the
model's KL (`kl_fit`), saved as key stats a preset loads.

1. The preset's cache (with its calibrated range-mode key stats loaded) and
   the calibration windows (the text's last `num_calib_windows`, disjoint
   from the evaluation windows; `key_runner.calibration_inputs`).
2. The full-precision cache's log-probabilities at the scored predictions
   of every calibration window.
3. `kl_fit.fit_params`: Adam on what `options.fit` names (the log-ratios
   of the key ranges, each layer's static-key codebook, each layer's
   rotation); the fit is kept only if it lowers the mean KL over the
   calibration windows.
4. Save the fitted affines to WORKDIR (`key_stats_store`; the sidecar
   records the starting stats, the options and the KL before and after).
"""

from __future__ import annotations

import time

import ml_collections
import numpy as np

from kvq_jax.calibration import auto_key_stats
from kvq_jax.calibration.key_runner import calibration_inputs
from kvq_jax.calibration.kl_fit import (KLFit, KLFitOptions, base_log_probs,
                                        fit_params, fitted_affines)
from kvq_jax.eval.windows import scored_mask
from kvq_jax.facade import window_forward
from kvq_jax.persist.key_stats_store import save_key_stats


@auto_key_stats.resolves_for_run
def fit_keys(config: ml_collections.ConfigDict, workdir: str,
             eval_data: str | None = None, model: str | None = None,
             num_calib_windows: int = 4,
             options: KLFitOptions = KLFitOptions(), log=print) -> dict:
  """Steps 1-4 of the module docstring; returns the sidecar's metadata."""
  inputs = calibration_inputs(config, eval_data, model, num_calib_windows,
                              load_key_stats=True)
  settings, lm, split = inputs.settings, inputs.model, inputs.split
  spec = settings.cache_spec
  if spec is None or not spec.key_affines:
    raise ValueError(
        "fit_keys: the preset has no calibrated key stats to start from; "
        "allowed: a static-key preset with cache.key_stats set (e.g. "
        "--config=kq4).")
  started = time.perf_counter()
  first = int(np.argmax(scored_mask(settings.eval.window_len,
                                    settings.eval.scoring)))
  tokens = np.asarray(split.calib_WxT, np.int32)
  base = window_forward(lm, None, settings.cache_dtype)
  base_logp = np.concatenate([base_log_probs(base(tokens[w:w + 1]), first)
                              for w in range(len(tokens))])
  layers = [spec.layer(i) for i in range(lm.config.num_layers)]
  fit = KLFit(lm.decoder, layers, first, settings.cache_dtype)
  result = fit_params(fit, tokens, base_logp, options, progress=lambda s, v:
                      log(f"fit_keys: step {s + 1}/{options.steps} KL {v:.5f}"))
  affines = fitted_affines(spec.key_affines, result.theta_LxKxH, layers,
                           result.levels, result.rotation_LxKxHxH)
  theta = result.theta_LxKxH
  metadata = {
      "model": inputs.model_name, "data": inputs.source,
      "mode": "range", "fitted_from": str(config.cache.key_stats),
      "calibration_tokens": list(split.calib_range),
      "evaluation_tokens": list(split.eval_range),
      "window_len": settings.eval.window_len,
      "num_calib_windows": num_calib_windows,
      "scoring": settings.eval.scoring,
      "steps": options.steps, "learning_rate": options.learning_rate,
      "granularity": options.granularity, "fit": list(options.fit),
      "kl_before": result.kl_before, "kl_after": result.kl_after,
      "kept": result.kept, "losses": [round(v, 6) for v in result.losses],
      "ratio_min": float(np.exp(theta.min())),
      "ratio_max": float(np.exp(theta.max())),
      "seconds": round(time.perf_counter() - started, 2)}
  path = save_key_stats(workdir, affines, metadata)
  return {**metadata, "path": str(path)}
