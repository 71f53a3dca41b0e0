"""`experiments.generate`'s one library call: prompts -> printed reports.

Reads the prompts (`read_prompts`), loads the model of the preset (or
`--model`), encodes each prompt (optionally through the chat template,
`encode_prompt`; one longer than the model's positions is refused before
anything compiles), decodes it with every cache kind
(`compare.continue_prompt`) and prints the report
(`report.format_comparison`).
"""

from __future__ import annotations

import pathlib
from typing import Sequence

import ml_collections

from kvq_jax.facade import load_model
from kvq_jax.generation import report
from kvq_jax.generation.compare import (PromptComparison, cache_kinds,
                                        continue_prompt, positive)
from kvq_jax.loaders import chat_template
from kvq_jax.models.runtime import Runtime
from kvq_jax.settings.experiment_settings import settings_from_config


def read_prompts(prompt: str | None, prompts_file: str | None) -> list[str]:
  """The prompts: `prompt` alone, or `prompts_file`'s lines.

  File format (UTF-8): one prompt per line; blank lines are skipped and a
  literal backslash-n (two characters) inside a line becomes a newline, so a
  multi-line prompt fits on one line. Exactly one of the two is required.
  """
  if (prompt is None) == (prompts_file is None):
    raise ValueError("give exactly one of --prompt=TEXT and "
                     "--prompts_file=FILE (one prompt per line).")
  if prompt is not None:
    if not prompt.strip():
      raise ValueError("--prompt is empty; allowed: some text.")
    return [prompt]
  lines = pathlib.Path(prompts_file).read_text(encoding="utf-8").splitlines()
  prompts = [line.replace("\\n", "\n") for line in lines if line.strip()]
  if not prompts:
    raise ValueError(f"--prompts_file={prompts_file!r} holds no prompt; "
                     "allowed: one prompt per non-blank line.")
  return prompts


def encode_prompt(tokenizer, text: str, chat: bool
                  ) -> tuple[list[int], str | None, int | None]:
  """(ids, chat family or None, stop id or None for the model's eos).

  With `chat`, `text` is one user message rendered with the tokenizer's
  chat template (`loaders.chat_template`; ValueError naming the families
  understood otherwise) and decoding stops at the family's end-of-turn
  token. BOS is added where the tokenizer says so (`add_bos`).
  """
  if not chat:
    return tokenizer.encode(text), None, None
  template = tokenizer.chat_template
  family = chat_template.chat_family(template)
  rendered = tokenizer.apply_chat_template([{"role": "user",
                                             "content": text}])
  return (tokenizer.encode(rendered), family,
          tokenizer.token_to_id(chat_template.end_of_turn(template)))


def run(config: ml_collections.ConfigDict, prompts: Sequence[str], *,
        config_name: str, compare: Sequence[str] = (),
        max_new_tokens: int = 128, chat: bool = False,
        model: str | None = None) -> list[PromptComparison]:
  """Decodes every prompt with every kind (`cache_kinds`), printing each
  prompt's report (`report.format_comparison`) as it finishes.

  `model` overrides `config.model`; the compute dtype is `config.dtype`.
  Returns the comparisons.
  """
  positive(max_new_tokens, "--max_new_tokens")
  settings = settings_from_config(config)
  kinds = cache_kinds(settings, config_name, compare)  # Fail before loading.
  model_name = model or settings.model
  lm = load_model(model_name, settings.dtype)
  if lm.tokenizer is None:
    raise ValueError(f"model {model_name!r} has no tokenizer; allowed: a "
                     "checkpoint that carries one (GGUF metadata or "
                     "tokenizer.json).")
  encoded = [encode_prompt(lm.tokenizer, text, chat) for text in prompts]
  for i, (ids, _, _) in enumerate(encoded):  # Every prompt before compiling.
    # The cache ends up holding the prompt and all but the last new token.
    lm.config.check_context(
        len(ids) + max_new_tokens - 1,
        f"prompt {i + 1} ({len(ids)} tokens) with --max_new_tokens="
        f"{max_new_tokens}")
  runtime = Runtime(lm.decoder)
  out = []
  for i, (text, (ids, family, stop_id)) in enumerate(zip(prompts, encoded)):
    capacity, continuations = continue_prompt(runtime, ids, kinds,
                                              max_new_tokens, stop_id)
    comparison = PromptComparison(
        prompt=text, prompt_ids=tuple(ids), chat_family=family,
        stop_id=(runtime.config.eos_token_id if stop_id is None
                 else stop_id),
        max_new_tokens=max_new_tokens, capacity=capacity,
        continuations=continuations)
    print(report.format_comparison(
        comparison, lm.tokenizer, header=f"Prompt {i + 1}/{len(prompts)}, "
        f"model {model_name} ({settings.dtype})"), flush=True)
    out.append(comparison)
  return out
