r"""One KV-cache preset against another, paired on the same windows.

  python -m experiments.compare --config=cvmix250 --against=kqmix250 \
      [--config.cache.k.bits=4 ...] [--eval_data=FILE] [--model=NAME] \
      [--config.eval.num_windows=40] [--workdir=runs/compare/A_vs_B]

Both caches are evaluated against the full-precision baseline in one pass
over the same windows; prints each one's effective bits, ΔPPL with its CI
and KL, the paired ΔNLL and KL differences (clustered by window) with the
verdict, and the `experiments.run` command for each side. --against takes
a preset name, a preset file or a short spec (as `experiments.sweep
--points`). Writes compare.json beside the sweep's files. Details:
kvq_jax/sweep/compare.py.
"""

import sys

from absl import app
from absl import flags

from kvq_jax.calibration import auto_key_stats
from kvq_jax.cli import log_setup
from kvq_jax.cli.config_flag import DEFINE_preset_config, preset_name
from kvq_jax.cli.data_flags import DEFINE_data_flags
from kvq_jax.cli.entry import run_main
from kvq_jax.sweep.compare import run_compare

_CONFIG = DEFINE_preset_config("config", default=None)
_AGAINST = flags.DEFINE_string("against", None, "the other cache: a preset, "
                               "a preset file or a short spec")
_WORKDIR = flags.DEFINE_string("workdir", None, "output directory (default "
                               "runs/compare/<config>_vs_<against>)")
_EVAL_DATA, _MODEL = DEFINE_data_flags()
flags.mark_flags_as_required(["config", "against"])


def main(argv):
  log_setup.configure_from_flags()
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  name = preset_name()
  against = _AGAINST.value
  overrides = [a for a in sys.argv[1:] if a.startswith("--config.")]
  workdir = _WORKDIR.value or (
      f"runs/compare/{name}_vs_"
      f"{against.rsplit('/', 1)[-1].removesuffix('.py').replace(':', '_')}")
  auto_key_stats.resolves_for_run(run_compare)(
      _CONFIG.value, name, against, workdir, overrides=overrides,
      eval_data=_EVAL_DATA.value, model=_MODEL.value)


if __name__ == "__main__":
  run_main(main)
