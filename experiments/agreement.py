r"""Decode-heavy agreement of quantized KV caches with the baseline.

  python -m experiments.agreement --config=int4_g32_asym [--points=int8,k8v4]
      [--model=NAME_OR_PATH] [--num_prompts=16] [--prefix_lens=256,1024,4096]
      [--new_tokens=128] [--batch_size=16] [--eval_data=FILE] [--workdir=DIR]
      [--config.FIELD=...]

Prompts are consecutive slices of the evaluation text. The baseline
(full-precision cache) greedy-decodes --new_tokens tokens through the real
prefill (chunks of config.eval.prefill_chunk tokens, 512) and decode path;
every preset (--points, resolved as experiments.sweep does; default: the
--config preset) is teacher-forced along that continuation. Reports per
preset and prefix length: tokens until the first divergence, the fraction of
identical continuations, the per-step KL(baseline || preset) (mean and over
steps 1-16, 17-64, 65-128) and top-1 agreement, with stderr over prompts.
Prompts of one length run in batches of --batch_size, the same for every
cache. Writes agreement.{csv,json}, summary.md and config.json to --workdir (default runs/agreement). Details:
kvq_jax/longctx/agreement.py.
"""

from absl import app
from absl import flags

from kvq_jax.cli import log_setup
from kvq_jax.cli.config_flag import DEFINE_preset_config, preset_name
from kvq_jax.cli.data_flags import DEFINE_data_flags, int_list
from kvq_jax.cli.entry import run_main
from kvq_jax.longctx.agreement import AgreementRequest, run_agreement

_CONFIG = DEFINE_preset_config("config", default="int4_g32")
_WORKDIR = flags.DEFINE_string("workdir", "runs/agreement",
                               "output directory")
_EVAL_DATA, _MODEL = DEFINE_data_flags()
_POINTS = flags.DEFINE_list(
    "points", [], "presets / short specs to compare (kvq_jax/sweep/points.py); "
    "default: the --config preset")
_NUM_PROMPTS = flags.DEFINE_integer("num_prompts", 16,
                                    "prompts per prefix length")
_PREFIX_LENS = flags.DEFINE_list("prefix_lens", ["256", "1024", "4096"],
                                 "prompt lengths in tokens (BOS included)")
_NEW_TOKENS = flags.DEFINE_integer("new_tokens", 128,
                                   "greedy tokens decoded per prompt")
_BATCH_SIZE = flags.DEFINE_integer(
    "batch_size", 16, "prompts prefilled and decoded together (the same "
    "batches for the baseline and every preset)")


def main(argv):
  log_setup.configure_from_flags()
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  name = preset_name()
  request = AgreementRequest(num_prompts=_NUM_PROMPTS.value,
                             prefix_lens=int_list(_PREFIX_LENS),
                             new_tokens=_NEW_TOKENS.value,
                             batch_size=_BATCH_SIZE.value)
  run_agreement(_CONFIG.value, _WORKDIR.value, request, points=_POINTS.value,
                eval_data=_EVAL_DATA.value, model=_MODEL.value, name=name)


if __name__ == "__main__":
  run_main(main)
