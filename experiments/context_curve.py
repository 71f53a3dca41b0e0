r"""Perplexity against context length: every preset, one baseline pass.

  python -m experiments.context_curve --config=int4_g32_asym \
      --contexts=512,1024,2048,4096,8192 --points=int8,int4_g32_asym \
      --eval_data=../shared/data/wikitext-2-raw/wiki.test.raw \
      --workdir=runs/context_curve [--num_windows=4 | 16,16,8,4,4] [--scoring=last_256] \
      [--model=NAME_OR_PATH] [--allow_beyond_trained] \
      [--config.eval.prefill_chunk=512]

For each context L: the first --num_windows non-overlapping windows of L
tokens (fewer if the text holds fewer; BOS first where the model wants one),
each prefilled in chunks of config.eval.prefill_chunk tokens into an empty
cache of capacity L and scored on its last 256 predictions (--scoring:
last_N, second_half or all). The baseline (full-precision cache) runs once
per window and every point is compared with it. --points takes presets and
short specs as `experiments.sweep` does (kvq_jax/sweep/points.py); without
it, the --config preset's own cache is the one point. The preset's
eval.window_len, eval.num_windows and eval.scoring are not used here.
Contexts above the model's max_position_embeddings are refused unless
--allow_beyond_trained.
Outputs: WORKDIR/context_curve.{csv,json,png}, WORKDIR/summary.md.
"""

from absl import app
from absl import flags

from kvq_jax.cli import log_setup
from kvq_jax.cli.config_flag import DEFINE_preset_config, preset_name
from kvq_jax.cli.data_flags import DEFINE_data_flags, int_list
from kvq_jax.cli.entry import run_main
from kvq_jax.longctx.curve import (DEFAULT_CONTEXTS, CurveRequest,
                                   run_context_curve)

_CONFIG = DEFINE_preset_config("config", default="int4_g32")
_WORKDIR = flags.DEFINE_string("workdir", "runs/context_curve",
                               "output directory")
_EVAL_DATA, _MODEL = DEFINE_data_flags()
_CONTEXTS = flags.DEFINE_list("contexts", [str(c) for c in DEFAULT_CONTEXTS],
                              "window lengths L (tokens, BOS included)")
_POINTS = flags.DEFINE_list(
    "points", [], "presets / short specs (as experiments.sweep); default: "
    "the --config preset's cache")
_NUM_WINDOWS = flags.DEFINE_list(
    "num_windows", ["4"], "windows per context, capped by what the text "
    "holds: one count, or one per --contexts item (e.g. 16,16,8,4,4)")
_SCORING = flags.DEFINE_string(
    "scoring", "last_256", "last_N (the last N predictions of every window), "
    "second_half or all")
_ALLOW_BEYOND = flags.DEFINE_bool(
    "allow_beyond_trained", False,
    "evaluate contexts above the model's max_position_embeddings")


def _num_windows():
  counts = int_list(_NUM_WINDOWS)
  return counts[0] if len(counts) == 1 else counts


def main(argv):
  log_setup.configure_from_flags()
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  name = preset_name()
  request = CurveRequest(contexts=int_list(_CONTEXTS),
                         points=tuple(_POINTS.value),
                         num_windows=_num_windows(),
                         scoring=_SCORING.value,
                         allow_beyond_trained=_ALLOW_BEYOND.value)
  run_context_curve(_CONFIG.value, _WORKDIR.value, request,
                    eval_data=_EVAL_DATA.value, model=_MODEL.value, name=name)


if __name__ == "__main__":
  run_main(main)
