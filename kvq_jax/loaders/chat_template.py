"""Rendering a chat for an instruct model, from its `chat_template` string.

jinja2 is not a dependency, so a template is not executed: its family is
recognised from the markers it contains and the conversation is rendered in
that family's format.

* ChatML (SmolLM2, Qwen2.5; the template contains '<|im_start|>'): every
  message is `<|im_start|>ROLE\\nCONTENT<|im_end|>\\n`, the generation prompt
  `<|im_start|>assistant\\n`. A default system prompt hard-coded in the
  template as a plain literal (`<|im_start|>system\\n...<|im_end|>` with no
  braces or quotes between, as in SmolLM2's and Qwen2.5's) is inserted when
  the conversation does not start with a system message. Template code
  between the markers (Qwen2.5's tools branch, `' + messages[0]['content'] +
  '`) is not a default prompt.
* Gemma (the template contains '<start_of_turn>'): every message is
  `<start_of_turn>ROLE\\nCONTENT<end_of_turn>\\n` with 'assistant' written
  as 'model'; a leading system message has no turn of its own, its content
  and a blank line open the first user turn (Gemma 3's template); the
  generation prompt is `<start_of_turn>model\\n`. The template's leading
  `{{ bos_token }}` is not rendered: the tokenizer adds BOS itself
  (`TextTokenizer.add_bos`, true for Gemma).

Any other template is a ValueError naming the families understood.
"""

from __future__ import annotations

import re
from typing import Mapping, Sequence

CHATML = "ChatML"
GEMMA = "Gemma"
# Family -> (the marker that identifies it, the token that ends a turn: an
# instruct model's answer stops there).
FAMILIES = {CHATML: ("<|im_start|>", "<|im_end|>"),
            GEMMA: ("<start_of_turn>", "<end_of_turn>")}


def chat_family(template: str | None) -> str:
  """The family (`CHATML` or `GEMMA`) of a `tokenizer.chat_template`."""
  for family, (marker, _) in FAMILIES.items():
    if template and marker in template:
      return family
  allowed = "; ".join(f"{family} (containing {marker!r})"
                      for family, (marker, _) in FAMILIES.items())
  if not template:
    raise ValueError("chat_template is missing (the checkpoint has no "
                     "tokenizer.chat_template): this model has no chat "
                     f"format; allowed families: {allowed}.")
  raise ValueError(f"chat_template={template!r:.80}: template family not "
                   f"recognised (jinja2 is not used); allowed: {allowed}.")


def end_of_turn(template: str | None) -> str:
  """The token text that ends an assistant turn in `template`'s family."""
  return FAMILIES[chat_family(template)][1]


def _check_messages(messages: Sequence[Mapping[str, str]]) -> None:
  for i, message in enumerate(messages):
    if not isinstance(message.get("role"), str) or not isinstance(
        message.get("content"), str):
      raise ValueError(f"messages[{i}]={message!r}: needs string 'role' and "
                       "'content'.")


def _render_chatml(template: str, messages: Sequence[Mapping[str, str]],
                   add_generation_prompt: bool) -> str:
  default_system = re.search(
      r"<\|im_start\|>system(?:\n|\\n)([^{}'\"]*?)<\|im_end\|>", template)
  parts = []
  if default_system and (not messages or messages[0]["role"] != "system"):
    parts.append(f"<|im_start|>system\n{default_system.group(1)}<|im_end|>\n")
  for message in messages:
    parts.append(f"<|im_start|>{message['role']}\n{message['content']}"
                 "<|im_end|>\n")
  if add_generation_prompt:
    parts.append("<|im_start|>assistant\n")
  return "".join(parts)


_GEMMA_ROLES = {"user": "user", "assistant": "model", "model": "model"}


def _render_gemma(messages: Sequence[Mapping[str, str]],
                  add_generation_prompt: bool) -> str:
  prefix, first = "", 0
  if messages and messages[0]["role"] == "system":
    prefix, first = messages[0]["content"] + "\n\n", 1
  parts = []
  for i, message in enumerate(messages[first:], start=first):
    role = _GEMMA_ROLES.get(message["role"])
    if role is None:
      raise ValueError(
          f"messages[{i}].role={message['role']!r}: the Gemma chat format "
          "allows 'user', 'assistant' (or 'model') and a leading 'system'.")
    content = (prefix if i == first else "") + message["content"]
    parts.append(f"<start_of_turn>{role}\n{content}<end_of_turn>\n")
  if add_generation_prompt:
    parts.append("<start_of_turn>model\n")
  return "".join(parts)


def render_chat(template: str | None, messages: Sequence[Mapping[str, str]],
                add_generation_prompt: bool = True) -> str:
  """`messages` ([{'role', 'content'}]) as the prompt text `template`'s
  family expects (module docstring); ValueError for an unknown family."""
  family = chat_family(template)
  _check_messages(messages)
  if family == CHATML:
    return _render_chatml(template, messages, add_generation_prompt)
  return _render_gemma(messages, add_generation_prompt)
