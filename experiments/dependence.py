r"""How much dependence the scalar formats leave: PCA transform-coding gain,
previous-layer ridge prediction (also as a chain through the quantizer,
net of its constants) and vector-quantization gain, per layer and
kv head (issue 34's diagnostics).

  python -m experiments.dependence --config=int4_g32 \
      --model=smollm2-135m --workdir=runs/dependence/smollm2-135m \
      --eval_data=../shared/data/wikitext-2-raw/wiki.test.raw \
      [--rate=2.5] [--num_calib_windows=8] [--vq_layer_stride=3] \
      [--ridge_input_bits=4,2] [--chain_contexts=512,4096]

Calibration windows: the last --num_calib_windows windows of the text,
disjoint from the preset's evaluation windows. Writes dependence.json,
dependence.md and config.json. Details: kvq_jax/research/dependence_runner.py.
"""

import pathlib

from absl import app
from absl import flags

from kvq_jax.cli import log_setup
from kvq_jax.cli.config_flag import DEFINE_preset_config
from kvq_jax.cli.data_flags import DEFINE_data_flags
from kvq_jax.cli.entry import run_main
from kvq_jax.research.dependence_runner import (DependenceOptions,
                                                run_dependence)

_CONFIG = DEFINE_preset_config("config", default="int4_g32")
_WORKDIR = flags.DEFINE_string("workdir", "runs/dependence",
                               "output directory")
_EVAL_DATA, _MODEL = DEFINE_data_flags()
_RATE = flags.DEFINE_float("rate", 2.5, "bits per coordinate of the "
                           "transform-coding comparison")
_NUM_CALIB = flags.DEFINE_integer("num_calib_windows", 8,
                                  "calibration windows (end of the text)")
_RIDGE_BITS = flags.DEFINE_list(
    "ridge_input_bits", ["4", "2"], "the ridge predictor again from the "
    "previous layer's int-B asymmetric g32 reconstruction, per B")
_CHAIN_CONTEXTS = flags.DEFINE_list(
    "chain_contexts", ["512", "4096"], "contexts at which the prediction "
    "chain's predictor constants are charged per cached element")
_STRIDE = flags.DEFINE_integer("vq_layer_stride", 3,
                               "k-means on layers 0, S, 2S, ...")


def main(argv):
  log_setup.configure_from_flags()
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  try:
    options = DependenceOptions(rate=_RATE.value,
                                num_calib_windows=_NUM_CALIB.value,
                                vq_layer_stride=_STRIDE.value,
                                ridge_input_bits=tuple(
                                    int(b) for b in _RIDGE_BITS.value),
                                chain_contexts=tuple(
                                    int(c) for c in _CHAIN_CONTEXTS.value))
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  out = run_dependence(_CONFIG.value, _WORKDIR.value,
                       eval_data=_EVAL_DATA.value, model=_MODEL.value,
                       options=options)
  md = pathlib.Path(_WORKDIR.value) / "dependence.md"
  print(md.read_text(encoding="utf-8"))
  print(f"wrote {md} ({out['seconds']} s)")


if __name__ == "__main__":
  run_main(main)
