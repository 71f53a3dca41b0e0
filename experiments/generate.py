r"""See what a preset does to text: greedy continuations, baseline vs caches.

  python -m experiments.generate --config=int2_g32_asym --compare=kvq4 --chat \
      --prompt="Explain what a KV cache is in two sentences." \
      [--max_new_tokens=128] [--model=NAME_OR_PATH] [--config.FIELD=...]
      [--log_level=info]
  python -m experiments.generate --config=kvq4 --prompts_file=prompts.txt

Greedy-decodes each prompt with the full-precision cache (the baseline), the
--config preset's cache and every --compare kind (preset names, short specs,
or bf16 / float32 dense caches: kvq_jax/settings/kinds.py) through the real
jitted prefill + decode path, and prints the continuations one after
another, each labelled, with the first token where it leaves the baseline's
(index and both tokens, marked in the text), tokens/s and the bytes of the
cache's leaves; then a table.
--chat applies the model's chat template (ChatML or Gemma, read from the
checkpoint's tokenizer.chat_template) to each prompt as one user message and
stops at the end-of-turn token. --prompts_file: one prompt per line, blank
lines skipped, a literal \n inside a line is a newline. Details:
kvq_jax/generation/compare.py.
"""

from absl import app
from absl import flags

from kvq_jax.calibration import auto_key_stats
from kvq_jax.cli import log_setup
from kvq_jax.cli.config_flag import DEFINE_preset_config, preset_name
from kvq_jax.cli.data_flags import DEFINE_model_flag
from kvq_jax.cli.entry import run_main
from kvq_jax.generation import runner

_CONFIG = DEFINE_preset_config("config", default="int4_g32")
_MODEL = DEFINE_model_flag()
_COMPARE = flags.DEFINE_list(
    "compare", [], "more cache kinds to show: preset names (or files), short "
    "specs, bf16, float32")
_PROMPT = flags.DEFINE_string("prompt", None, "the prompt text")
_PROMPTS_FILE = flags.DEFINE_string(
    "prompts_file", None, "UTF-8 file, one prompt per line (instead of "
    "--prompt)")
_MAX_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", 128,
                                       "greedy tokens per continuation")
_CHAT = flags.DEFINE_bool("chat", False,
                          "apply the model's chat template to each prompt")


def main(argv):
  log_setup.configure_from_flags()
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  try:
    prompts = runner.read_prompts(_PROMPT.value, _PROMPTS_FILE.value)
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  # Key-stats recipes (the preset's, the compared kinds') resolve for the
  # run's model on the default text (calibration.auto_key_stats).
  auto_key_stats.resolves_for_run(runner.run)(
      _CONFIG.value, prompts, config_name=preset_name(),
      compare=_COMPARE.value, max_new_tokens=_MAX_NEW_TOKENS.value,
      chat=_CHAT.value, model=_MODEL.value)


if __name__ == "__main__":
  run_main(main)
