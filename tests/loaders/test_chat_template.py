"""chat_template: family recognition, Gemma rendering, end-of-turn tokens."""

from __future__ import annotations

import pytest

from kvq_jax.loaders import chat_template

# Gemma 3's template, abridged (the rendering does not execute it).
GEMMA = ("{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}"
         "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
         "{%- endif -%}{{ '<start_of_turn>' + role + '\n' + "
         "(first_user_prefix if loop.first else '') }}"
         "{%- if add_generation_prompt -%}{{'<start_of_turn>model\n'}}"
         "{%- endif -%}")
CHATML = "{{'<|im_start|>' + message['role'] + '\n'}}"


def test_families_and_end_of_turn():
  assert chat_template.chat_family(CHATML) == chat_template.CHATML
  assert chat_template.chat_family(GEMMA) == chat_template.GEMMA
  assert chat_template.end_of_turn(CHATML) == "<|im_end|>"
  assert chat_template.end_of_turn(GEMMA) == "<end_of_turn>"
  with pytest.raises(ValueError, match=r"template family not recognised "
                     r".*allowed: ChatML .*'<\|im_start\|>'.*Gemma"):
    chat_template.chat_family("[INST] {{ message }} [/INST]")
  with pytest.raises(ValueError, match="chat_template is missing"):
    chat_template.chat_family(None)


def test_gemma_rendering():
  user = [{"role": "user", "content": "Hi"}]
  assert chat_template.render_chat(GEMMA, user) == (
      "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n")
  turns = [{"role": "system", "content": "Be brief."},
           {"role": "user", "content": "Hi"},
           {"role": "assistant", "content": "Hello."},
           {"role": "user", "content": "Bye"}]
  assert chat_template.render_chat(GEMMA, turns, False) == (
      "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
      "<start_of_turn>model\nHello.<end_of_turn>\n"
      "<start_of_turn>user\nBye<end_of_turn>\n")
  with pytest.raises(ValueError, match=r"messages\[0\].role='tool'"):
    chat_template.render_chat(GEMMA, [{"role": "tool", "content": "x"}])
  with pytest.raises(ValueError, match=r"messages\[0\]"):
    chat_template.render_chat(GEMMA, [{"role": "user"}])
