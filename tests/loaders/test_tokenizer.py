"""Tokenizers built from a tiny synthetic GGUF vocab and a tokenizer.json."""

from __future__ import annotations

import json

import pytest

from kvq_jax.loaders import tokenizer as tokenizer_lib
from tests.loaders import tiny_checkpoints as tc


@pytest.fixture(name="tok")
def _tok(tmp_path):
  path = tmp_path / "tiny.gguf"
  tc.write_gguf(path, tc.random_hf_weights())
  return tokenizer_lib.load_gguf_tokenizer(path)


def _id(token: str) -> int:
  return tc.tiny_vocab()[0].index(token)


def test_merges_applied_in_rank_order(tok):
  assert tok.encode("hello world") == [_id("hello"), _id("Ġworld")]
  # "wor" only forms after "Ġw" + "or": without the leading space it cannot.
  assert tok.encode("world") == [_id("w"), _id("or"), _id("ld")]


def test_digits_split_individually_for_smollm(tok):
  # The merge "1 2" exists, but the smollm pre-tokenizer isolates digits.
  assert tok.encode("12") == [_id("1"), _id("2")]
  assert tok.encode(" 7") == [_id("Ġ"), _id("7")]


def test_gpt2_pre_tokenizer_keeps_digit_runs(tmp_path):
  path = tmp_path / "gpt2.gguf"
  tc.write_gguf(path, tc.random_hf_weights(), pre="gpt2")
  tok = tokenizer_lib.load_gguf_tokenizer(path)
  assert tok.encode("12") == [_id("12")]


def test_special_tokens_are_single_ids(tok):
  ids = tok.encode("<|im_start|>hello<|im_end|>")
  assert ids == [1, _id("hello"), 2]
  assert tok.decode(ids) == "<|im_start|>hello<|im_end|>"
  assert tok.decode(ids, skip_special_tokens=True) == "hello"


def test_metadata_and_round_trip(tok):
  assert (tok.bos_id, tok.eos_id, tok.add_bos) == (1, 2, False)
  assert tok.chat_template == tc.CHAT_TEMPLATE
  assert tok.encode("hi", add_bos=True)[0] == 1
  for text in ["hello world", "Ünïcödé ✓ 123\n\ttabs  ", "a's b'll"]:
    assert tok.decode(tok.encode(text)) == text


def test_chat_template_chatml(tok):
  text = tok.apply_chat_template([{"role": "user", "content": "hi"}])
  assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
  with pytest.raises(ValueError, match=r"messages\[0\]"):
    tok.apply_chat_template([{"role": "user"}])


def test_chat_template_default_system_prompt():
  template = ("{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
              "Be brief.<|im_end|>\n' }}{% endif %}<|im_start|>")
  tok = tokenizer_lib.TextTokenizer(None, bos_id=None, eos_id=None,
                                    chat_template=template)
  msgs = [{"role": "user", "content": "q"}]
  assert tok.apply_chat_template(msgs, add_generation_prompt=False) == (
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nq<|im_end|>\n")
  own = [{"role": "system", "content": "S"}] + msgs
  assert tok.apply_chat_template(own, False).startswith(
      "<|im_start|>system\nS<|im_end|>")
  with pytest.raises(ValueError, match="chat_template"):
    tokenizer_lib.TextTokenizer(None, bos_id=None, eos_id=None,
                                chat_template="{{ x }}").apply_chat_template(msgs)


def test_chat_template_default_system_skips_template_code():
  # Qwen2.5's shape: a tools branch and a `+ messages[0]['content'] +` branch
  # precede the literal default prompt.
  template = (
      "{%- if tools %}{{- '<|im_start|>system\\n' }}{{- 'T' }}"
      "{{- '\\n</tools><|im_end|>\\n' }}{%- else %}"
      "{%- if messages[0]['role'] == 'system' %}"
      "{{- '<|im_start|>system\\n' + messages[0]['content'] + "
      "'<|im_end|>\\n' }}{%- else %}"
      "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You "
      "are a helpful assistant.<|im_end|>\\n' }}{%- endif %}{%- endif %}")
  tok = tokenizer_lib.TextTokenizer(None, bos_id=None, eos_id=None,
                                    chat_template=template)
  text = tok.apply_chat_template([{"role": "user", "content": "q"}])
  assert text == ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. "
                  "You are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
                  "q<|im_end|>\n<|im_start|>assistant\n")


def test_save_load_and_hf_dir(tok, tmp_path):
  tok.save(tmp_path / "saved")
  again = tokenizer_lib.TextTokenizer.load(tmp_path / "saved")
  assert again.encode("hello 12 <|im_end|>") == tok.encode("hello 12 <|im_end|>")
  assert (again.bos_id, again.eos_id, again.chat_template) == (
      1, 2, tc.CHAT_TEMPLATE)
  # The same tokenizer.json as a Hugging Face directory.
  (tmp_path / "saved" / "tokenizer_config.json").write_text(json.dumps({
      "bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"},
      "chat_template": "<|im_start|>"}))
  hf = tokenizer_lib.load_hf_tokenizer(tmp_path / "saved")
  assert (hf.bos_id, hf.eos_id, hf.add_bos) == (1, 2, False)
  assert hf.encode("hello world") == [_id("hello"), _id("Ġworld")]
  with pytest.raises(ValueError, match="tokenizer.json"):
    tokenizer_lib.load_hf_tokenizer(tmp_path)


def test_bad_vocab_inputs():
  tokens, merges, types = tc.tiny_vocab()
  with pytest.raises(ValueError, match="tokenizer.ggml.pre='nope'"):
    tokenizer_lib.build_bpe_tokenizer(tokens, merges, types, "nope")
  with pytest.raises(ValueError, match="merges entry 'ab'"):
    tokenizer_lib.build_bpe_tokenizer(tokens, ["ab"], types, "gpt2")
  with pytest.raises(ValueError, match="duplicate"):
    tokenizer_lib.build_bpe_tokenizer(tokens + ["a"], merges, None, "gpt2")
