r"""Learn per-layer K/V clip ratios and write a preset that uses them.

  python -m experiments.calibrate --config=int2_g32_asym --workdir=runs/calib \
      --eval_data=../shared/data/wikitext-2-raw/wiki.test.raw \
      --num_calib_windows=2 --steps=100 --config.eval.num_windows=4

Calibration windows are the last --num_calib_windows windows of the text,
evaluation windows its first eval.num_windows (disjoint; asserted). Writes
WORKDIR/clip_ratios/ (orbax + clip_ratios.json), WORKDIR/calibrated.py (a
preset: run it with `python -m experiments.run
--config=WORKDIR/calibrated.py`) and WORKDIR/calibration.json (ratios,
losses and, unless --noevaluate, delta PPL before/after on the eval windows).
"""

import json

from absl import app
from absl import flags

from kvq_jax.calibration.optimize import CalibrationOptions
from kvq_jax.calibration.runner import calibrate
from kvq_jax.cli import log_setup
from kvq_jax.cli.config_flag import DEFINE_preset_config
from kvq_jax.cli.data_flags import DEFINE_data_flags
from kvq_jax.cli.entry import run_main

_CONFIG = DEFINE_preset_config("config", default="int2_g32_asym")
_WORKDIR = flags.DEFINE_string("workdir", "runs/calibrate", "output directory")
_EVAL_DATA, _MODEL = DEFINE_data_flags()
_NUM_CALIB = flags.DEFINE_integer("num_calib_windows", 2,
                                  "calibration windows (end of the text)")
_STEPS = flags.DEFINE_integer("steps", 100, "Adam steps per layer")
_LR = flags.DEFINE_float("learning_rate", 0.05, "Adam learning rate (theta)")
_QUERIES = flags.DEFINE_integer(
    "num_queries", 128, "last query positions per window in the loss")
_EVALUATE = flags.DEFINE_boolean(
    "evaluate", True, "evaluate base vs calibrated preset on the eval windows")


def main(argv):
  log_setup.configure_from_flags()
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  summary = calibrate(
      _CONFIG.value, _WORKDIR.value, eval_data=_EVAL_DATA.value,
      model=_MODEL.value, num_calib_windows=_NUM_CALIB.value,
      options=CalibrationOptions(steps=_STEPS.value,
                                 learning_rate=_LR.value,
                                 num_queries=_QUERIES.value),
      evaluate=_EVALUATE.value)
  keys = [k for k in summary if k.startswith(("delta_ppl", "ppl_", "kl_",
                                              "mean_loss"))]
  print(json.dumps({k: summary[k] for k in keys + ["preset",
                                                   "layer_overrides"]},
                   indent=1))


if __name__ == "__main__":
  run_main(main)
