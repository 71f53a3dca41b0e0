r"""Fit a static-key preset's calibrated key ranges to the model's KL.

  python -m experiments.fit_keys --config=kq4 \
      --workdir=runs/key_stats/smollm2-135m-range-kl \
      --config.eval.num_windows=40 \
      --eval_data=../shared/data/wikitext-2-raw/wiki.test.raw

Starts from the preset's range-mode key stats (cache.key_stats, written by
`experiments.calibrate_keys --mode=range`), learns with Adam one log-ratio
per layer (--granularity=channel: per layer, kv head and key channel)
that stretches each range -- with --fit=codebook also each layer's 2^b
static-key levels, with --fit=rotation each layer's orthogonal key
rotation (stored and charged as float32 [K, H, H] per layer) --
minimising the next-token KL to the
full-precision cache on the last --num_calib_windows windows of the text
(disjoint from the evaluation windows; asserted), and writes the fitted
ranges as key stats to WORKDIR. Use them with
`--config.cache.key_stats=WORKDIR` (kvq_jax/calibration/kl_fit.py).
"""

import json

from absl import app
from absl import flags

from kvq_jax.calibration.kl_fit import GRANULARITIES, TARGETS, KLFitOptions
from kvq_jax.calibration.kl_fit_runner import fit_keys
from kvq_jax.cli import log_setup
from kvq_jax.cli.config_flag import DEFINE_preset_config
from kvq_jax.cli.data_flags import DEFINE_data_flags
from kvq_jax.cli.entry import run_main

_CONFIG = DEFINE_preset_config("config", default="kq4")
_WORKDIR = flags.DEFINE_string("workdir", "runs/key_stats/smollm2-135m-range-kl",
                               "output directory")
_EVAL_DATA, _MODEL = DEFINE_data_flags()
_NUM_CALIB = flags.DEFINE_integer("num_calib_windows", 16,
                                  "calibration windows (end of the text)")
_STEPS = flags.DEFINE_integer("steps", 32, "Adam steps (one window each)")
_LR = flags.DEFINE_float("learning_rate", 0.01, "Adam learning rate")
_GRANULARITY = flags.DEFINE_enum("granularity", "layer", list(GRANULARITIES),
                                 "one log-ratio per channel or per layer")
_FIT = flags.DEFINE_multi_enum(
    "fit", ["range"], list(TARGETS), "what is learned (repeat or comma "
    "list): range (log-ratios), codebook (per-layer static-key levels), "
    "rotation (per-layer, per-kv-head orthogonal R)")


def main(argv):
  log_setup.configure_from_flags()
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  summary = fit_keys(
      _CONFIG.value, _WORKDIR.value, eval_data=_EVAL_DATA.value,
      model=_MODEL.value, num_calib_windows=_NUM_CALIB.value,
      options=KLFitOptions(steps=_STEPS.value,
                           learning_rate=_LR.value,
                           granularity=_GRANULARITY.value,
                           fit=tuple(_FIT.value)))
  print(json.dumps({k: v for k, v in summary.items() if k != "losses"},
                   indent=1))


if __name__ == "__main__":
  run_main(main)
