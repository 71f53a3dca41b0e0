r"""Calibrate per-channel key shift and scale (pre-RoPE) for a model.

  python -m experiments.calibrate_keys --config=tq4 \
      --workdir=runs/key_stats/smollm2-135m \
      --eval_data=../shared/data/wikitext-2-raw/wiki.test.raw

Records the full-precision model's pre-RoPE keys and queries on the last
--num_calib_windows windows of the text (disjoint from the preset's
evaluation windows, its first eval.num_windows; asserted) and writes
WORKDIR/affine (orbax) + WORKDIR/key_stats.json. Presets load it with
`cache.key_stats = WORKDIR` (see configs/methods/tq4.py). --mode=range writes the
calibrated per-channel ranges static keys need (see configs/methods/kq4.py);
--rotation=pca adds a calibrated rotation per layer and kv head.
"""

import json

from absl import app
from absl import flags

from kvq_jax.calibration.key_runner import calibrate_keys
from kvq_jax.calibration.key_stats import KeyStatsOptions
from kvq_jax.cli import log_setup
from kvq_jax.cli.config_flag import DEFINE_preset_config
from kvq_jax.cli.data_flags import DEFINE_data_flags
from kvq_jax.cli.entry import run_main

_CONFIG = DEFINE_preset_config("config", default="tq4")
_WORKDIR = flags.DEFINE_string("workdir", "runs/key_stats/smollm2-135m",
                               "output directory")
_EVAL_DATA, _MODEL = DEFINE_data_flags()
_NUM_CALIB = flags.DEFINE_integer("num_calib_windows", 4,
                                  "calibration windows (end of the text)")
_ALPHA = flags.DEFINE_float("alpha", 0.5, "scale exponent of the key std")
_BETA = flags.DEFINE_float("beta", 0.0, "scale exponent of the query rms")
_SHIFT = flags.DEFINE_boolean("shift", True, "subtract the channel mean")
_MODE = flags.DEFINE_enum("mode", "std", ["std", "range", "transform"],
                          "std: spread normalisation (tq presets); range: "
                          "calibrated ranges for static keys (kq presets); "
                          "transform: per-component statistics, codebooks "
                          "and error tables for transform coding (tc "
                          "presets; with --rotation=pca)")
_QUANTILE = flags.DEFINE_float("range_quantile", 1.0,
                               "range mode: the quantile p of [Q(1-p), Q(p)]")
_CODEBOOK_BITS = flags.DEFINE_list(
    "codebook_bits", [], "range mode: fit per-layer level codebooks for "
    "static keys of these bit widths (e.g. 2,3,4); none: uniform levels")
_ROTATION = flags.DEFINE_enum(
    "rotation", "none", ["none", "pca"], "pca: a calibrated per-head "
    "rotation of the pre-RoPE keys (query-weighted principal axes), stored "
    "and charged per layer")
_OUTLIERS = flags.DEFINE_integer(
    "outliers", 0, "range mode: largest |z| per key vector left out of the "
    "codebook fit (the keys' QuantSpec.outliers)")


def main(argv):
  log_setup.configure_from_flags()
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  summary = calibrate_keys(
      _CONFIG.value, _WORKDIR.value, eval_data=_EVAL_DATA.value,
      model=_MODEL.value, num_calib_windows=_NUM_CALIB.value,
      options=KeyStatsOptions(alpha=_ALPHA.value, beta=_BETA.value,
                              shift=_SHIFT.value, mode=_MODE.value,
                              range_quantile=_QUANTILE.value,
                              codebook_bits=tuple(
                                  int(b) for b in _CODEBOOK_BITS.value),
                              outliers=_OUTLIERS.value,
                              rotation=_ROTATION.value))
  print(json.dumps(summary, indent=1))


if __name__ == "__main__":
  run_main(main)
