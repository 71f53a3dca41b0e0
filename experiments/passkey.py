r"""Passkey retrieval through a quantized KV cache, against the baseline.

  python -m experiments.passkey --config=int4_g32_asym [--points=int8,k8v4]
      [--model=NAME_OR_PATH] [--contexts=1024,2048,4096,8192]
      [--depths=0,25,50,75,100] [--keys_per_cell=5] [--filler=sentences|text]
      [--eval_data=FILE] [--answer_tokens=8] [--seed=0] [--workdir=DIR]
      [--presets_on=all|baseline_correct]
      [--config.FIELD=...]

A 5-digit key stated once inside filler text at each depth (percent of the
filler), the question at the end, the prompt exactly --contexts tokens;
greedy answer through the cache with the real prefill (chunks of
config.eval.prefill_chunk tokens, 512) and decode path; exact match of the
key. The full-precision baseline runs first
and is shared by every preset (--points, resolved as experiments.sweep
does; default: the --config preset). Contexts above the model's
max_position_embeddings are refused. With the sentence filler the filler
before the key is prefilled once per context and chunk and shared by the
prompts (bit-identical to prefilling each from scratch). Writes passkey.{csv,json}, a heatmap
PNG per preset beside the baseline's, summary.md and config.json to
--workdir (default runs/passkey). Details: kvq_jax/longctx/passkey.py.
"""

from absl import app
from absl import flags

from kvq_jax.cli import log_setup
from kvq_jax.cli.config_flag import DEFINE_preset_config, preset_name
from kvq_jax.cli.data_flags import DEFINE_data_flags, int_list
from kvq_jax.cli.entry import run_main
from kvq_jax.longctx.passkey import (FILLERS, PRESETS_ON, PasskeyRequest,
                                     run_passkey)

_CONFIG = DEFINE_preset_config("config", default="int4_g32")
_WORKDIR = flags.DEFINE_string("workdir", "runs/passkey", "output directory")
_EVAL_DATA, _MODEL = DEFINE_data_flags()
_POINTS = flags.DEFINE_list(
    "points", [], "presets / short specs to compare (kvq_jax/sweep/points.py); "
    "default: the --config preset")
_CONTEXTS = flags.DEFINE_list("contexts", ["1024", "2048", "4096", "8192"],
                              "prompt lengths in tokens (BOS included)")
_DEPTHS = flags.DEFINE_list("depths", ["0", "25", "50", "75", "100"],
                            "depth of the key, percent of the filler")
_KEYS = flags.DEFINE_integer("keys_per_cell", 5,
                             "keys (prompts) per context x depth")
_FILLER = flags.DEFINE_enum("filler", "sentences", list(FILLERS),
                            "repeated classic sentences, or --eval_data text")
_ANSWER_TOKENS = flags.DEFINE_integer("answer_tokens", 8,
                                      "greedy tokens decoded for the answer")
_SEED = flags.DEFINE_integer("seed", 0, "seed of the keys")
_PRESETS_ON = flags.DEFINE_enum(
    "presets_on", "all", list(PRESETS_ON), "presets answer every prompt, or "
    "only those the baseline answers correctly (saves their prefill)")


def main(argv):
  log_setup.configure_from_flags()
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  name = preset_name()
  request = PasskeyRequest(
      contexts=int_list(_CONTEXTS),
      depths=int_list(_DEPTHS), keys_per_cell=_KEYS.value,
      filler=_FILLER.value, answer_tokens=_ANSWER_TOKENS.value,
      seed=_SEED.value, presets_on=_PRESETS_ON.value)
  run_passkey(_CONFIG.value, _WORKDIR.value, request, points=_POINTS.value,
              eval_data=_EVAL_DATA.value, model=_MODEL.value, name=name)


if __name__ == "__main__":
  run_main(main)
