r"""Would per-layer, W_o-weighted or scale-free VQ tables code the values
better than the shipped Gaussian table, net of what they cost to hold
(issue 34, method 3)?

  python -m experiments.value_tables --config=int4_g32 \
      --model=smollm2-135m --workdir=runs/value_tables/smollm2-135m \
      --eval_data=../shared/data/wikitext-2-raw/wiki.test.raw \
      [--bits=2] [--num_calib_windows=8] [--layer_stride=1] \
      [--contexts=512,4096]

Calibration windows: the last --num_calib_windows windows of the text,
disjoint from the preset's evaluation windows. Writes value_tables.json,
value_tables.md and config.json. Details:
kvq_jax/research/value_tables_runner.py.
"""

import pathlib

from absl import app
from absl import flags

from kvq_jax.cli import log_setup
from kvq_jax.cli.config_flag import DEFINE_preset_config
from kvq_jax.cli.data_flags import DEFINE_data_flags
from kvq_jax.cli.entry import run_main
from kvq_jax.research.value_tables_runner import (ValueTableOptions,
                                                  run_value_tables)

_CONFIG = DEFINE_preset_config("config", default="int4_g32")
_WORKDIR = flags.DEFINE_string("workdir", "runs/value_tables",
                               "output directory")
_EVAL_DATA, _MODEL = DEFINE_data_flags()
_BITS = flags.DEFINE_integer("bits", 2, "bits per element of the vector "
                             "code (1, 2 or 4)")
_NUM_CALIB = flags.DEFINE_integer("num_calib_windows", 8,
                                  "calibration windows (end of the text)")
_STRIDE = flags.DEFINE_integer("layer_stride", 1, "layers 0, S, 2S, ...")
_SEED = flags.DEFINE_integer("rotation_seed", 0, "the values' Hadamard "
                             "signs, as the cache's rotation_seed")
_CONTEXTS = flags.DEFINE_list("contexts", ["512", "4096"], "contexts at "
                              "which the fitted tables are charged")


def main(argv):
  log_setup.configure_from_flags()
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  try:
    options = ValueTableOptions(bits=_BITS.value,
                                num_calib_windows=_NUM_CALIB.value,
                                layer_stride=_STRIDE.value,
                                rotation_seed=_SEED.value,
                                contexts=tuple(int(c) for c in _CONTEXTS.value))
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  out = run_value_tables(_CONFIG.value, _WORKDIR.value,
                         eval_data=_EVAL_DATA.value, model=_MODEL.value,
                         options=options)
  md = pathlib.Path(_WORKDIR.value) / "value_tables.md"
  print(md.read_text(encoding="utf-8"))
  print(f"wrote {md} ({out['seconds']} s)")


if __name__ == "__main__":
  run_main(main)
