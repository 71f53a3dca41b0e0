r"""Sweep KV-cache formats: CSV of quality/size per point + a Pareto PNG.

  python -m experiments.sweep --config=int4_g32 --workdir=runs/sweep \
      --eval_data=../shared/data/wikitext-2-raw/wiki.test.raw \
      --formats=int8,int4,int2 --group_sizes=32,128 --schemes=sym,asym \
      --residuals=0 --points=k8v4,kivi2,int4_pc32_asym/int4_g32_asym:pre:hadv \
      --config.eval.num_windows=4 --config.eval.window_len=512

The base preset (--config, with the usual --config.FIELD overrides) supplies
the model, evaluation windows and the non-format cache settings (key_rope,
Hadamard, sink); every grid point sets K and V to FORMAT x GROUP x SCHEME
(group 0 = per_token) with residual R. Invalid combinations are logged and
listed in the CSV as skipped. --points adds named points (presets or
KSPEC[/VSPEC][:pre|post|hadk|hadv|had|rN|sN], see kvq_jax/sweep/points.py).
--pairs=A:B,... compares two points window by window (paired, same
windows): WORKDIR/pairs.csv. Outputs: WORKDIR/sweep.csv, WORKDIR/pareto.png,
WORKDIR/config.json, WORKDIR/per_window.npz.
"""

from absl import app
from absl import flags

from kvq_jax.calibration import auto_key_stats
from kvq_jax.cli import log_setup
from kvq_jax.cli.config_flag import DEFINE_preset_config
from kvq_jax.cli.data_flags import DEFINE_data_flags, int_list
from kvq_jax.cli.entry import run_main
from kvq_jax.sweep.runner import SweepRequest, run_sweep

_CONFIG = DEFINE_preset_config("config", default="int4_g32")
_WORKDIR = flags.DEFINE_string("workdir", "runs/sweep", "output directory")
_EVAL_DATA, _MODEL = DEFINE_data_flags()
_FORMATS = flags.DEFINE_list("formats", ["int8", "int4", "int2"],
                             "int8, int5, int4, int3, int2, fp8_e4m3, fp8_e5m2")
_GROUP_SIZES = flags.DEFINE_list(
    "group_sizes", ["32"], "elements per group along head_dim; 0 = per_token")
_SCHEMES = flags.DEFINE_list("schemes", ["sym", "asym"],
                             "sym (all 2^bits levels), narrow (2^bits - 1), "
                             "asym")
_RESIDUALS = flags.DEFINE_list("residuals", ["0"],
                               "full-precision residual windows (tokens)")
_POINTS = flags.DEFINE_list("points", [], "named points (module docstring)")
_PAIRS = flags.DEFINE_list("pairs", [], "A:B point names compared window by "
                           "window (paired ΔNLL difference)")


def main(argv):
  log_setup.configure_from_flags()
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  request = SweepRequest(
      formats=tuple(_FORMATS.value),
      group_sizes=int_list(_GROUP_SIZES),
      schemes=tuple(_SCHEMES.value),
      residuals=int_list(_RESIDUALS),
      points=tuple(_POINTS.value),
      pairs=tuple(_PAIRS.value))
  # Key-stats recipes of the preset and the points resolve for the run's
  # model and text (calibration.auto_key_stats).
  auto_key_stats.resolves_for_run(run_sweep)(
      _CONFIG.value, _WORKDIR.value, request, eval_data=_EVAL_DATA.value,
      model=_MODEL.value)


if __name__ == "__main__":
  run_main(main)
