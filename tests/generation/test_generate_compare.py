"""experiments.generate's library: continuations, divergence, report, run."""

from __future__ import annotations

import numpy as np
import pytest

import kvq_jax
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.cli.config_flag import _PresetParser  # pylint: disable=protected-access
from kvq_jax.generation import runner
from kvq_jax.generation.compare import (
    Continuation, PromptComparison, cache_kinds, first_divergence)
from kvq_jax.generation.report import MARK, format_comparison
from kvq_jax.loaders.tokenizer import TextTokenizer
from kvq_jax.quant import QuantSpec
from kvq_jax.settings.experiment_settings import settings_from_config
from kvq_jax.settings.kinds import Kind
from tests.fixtures import tiny_hf_model

INT2_G8 = QuantSpec("int2", "asymmetric", "per_group", 8)
INT2_SPEC = CacheSpec(k=INT2_G8, v=INT2_G8, block_size=16)


def test_first_divergence_on_hand_made_sequences():
  assert first_divergence([1, 2, 3], [1, 2, 3]) is None
  assert first_divergence([], []) is None
  assert first_divergence([1, 2, 3], [1, 2, 4]) == 2
  assert first_divergence([7, 2, 3], [1, 2, 3]) == 0
  assert first_divergence([1, 5, 3, 9], [1, 2, 3, 9]) == 1
  assert first_divergence([1, 2], [1, 2, 3]) == 2  # Ended first.
  assert first_divergence([1, 2, 3], [1]) == 1
  assert first_divergence([], [4]) == 0


class _WordTokenizer:
  """decode(ids) joins a fixed word list; enough for the report."""

  WORDS = ["<end>", "the", " cat", " sat", " on", " mat", " dog", " ran"]

  def decode(self, ids):
    return "".join(self.WORDS[i] for i in ids)


def _continuation(name, spec, ids, cache_bytes, seconds=0.5):
  return Continuation(kind=Kind(name, spec, "float32"),
                      new_ids=tuple(ids), seconds=seconds,
                      cache_bytes=cache_bytes, bits_per_element=32.0)


def test_report_has_every_continuation_divergence_and_bytes():
  comparison = PromptComparison(
      prompt="Where did it sit?", prompt_ids=(1, 2, 3), chat_family="ChatML",
      stop_id=0, max_new_tokens=4, capacity=256, continuations=(
          _continuation("baseline", None, [1, 2, 3, 5], 11_796_600),
          _continuation("int2_g32_asym", INT2_SPEC, [1, 2, 6, 7], 1_106_040),
          _continuation("kvq4", INT2_SPEC, [1, 2, 3, 5], 2_200_440, 0.25)))
  text = format_comparison(comparison, _WordTokenizer(), header="Prompt 1/1")
  assert "=== Prompt 1/1 ===" in text and "'Where did it sit?'" in text
  assert "ChatML chat template applied" in text
  assert "stop after '<end>' (id 0)" in text
  assert "--- baseline: dense float32 cache ---" in text
  assert "--- int2_g32_asym: quantized cache" in text
  assert "\nthe cat sat mat\n" in text  # The baseline, unmarked.
  assert f"\nthe cat{MARK} dog ran\n" in text  # Marked where it leaves it.
  assert ("first divergence at token 2 (marked ‖ below): baseline ' sat' "
          "(id 3), int2_g32_asym ' dog' (id 6)") in text
  assert "kvq4: quantized" in text and "identical to the baseline" in text
  assert "cache 11,796,600 bytes" in text
  assert "cache 1,106,040 bytes = 0.094 x baseline" in text
  assert "4 new tokens, 8.0 tokens/s" in text  # 4 tokens in 0.5 s.
  assert ("| int2_g32_asym | 4 | 2 | 8.0 | 1,106,040 | 0.094 | 32.00 |"
          in text)
  assert "| kvq4 | 4 | none | 16.0 | 2,200,440 | 0.187 | 32.00 |" in text
  # Without a tokenizer the ids are shown.
  assert f"\n1 2 {MARK} 6 7\n" in format_comparison(comparison)


def test_read_prompts(tmp_path):
  assert runner.read_prompts("hi", None) == ["hi"]
  path = tmp_path / "prompts.txt"
  path.write_text("first\n\n  \nline one\\nline two\n", encoding="utf-8")
  assert runner.read_prompts(None, str(path)) == [
      "first", "line one\nline two"]
  for args in [("hi", str(path)), (None, None)]:
    with pytest.raises(ValueError, match="exactly one of --prompt"):
      runner.read_prompts(*args)
  with pytest.raises(ValueError, match="--prompt is empty"):
    runner.read_prompts(" ", None)
  path.write_text("\n\n", encoding="utf-8")
  with pytest.raises(ValueError, match="holds no prompt"):
    runner.read_prompts(None, str(path))


def test_cache_kinds_and_repeats():
  settings = settings_from_config(_PresetParser(name="config").parse(
      "int2_g32_asym"))
  kinds = cache_kinds(settings, "int2_g32_asym", ["kvq4", "bf16"])
  assert [k.name for k in kinds] == ["baseline", "int2_g32_asym", "kvq4",
                                     "bf16"]
  assert kinds[0].spec is None and kinds[0].dtype == "float32"
  assert kinds[2].spec.key_rope == "pre"
  assert kinds[3].spec is None and kinds[3].dtype == "bfloat16"
  with pytest.raises(ValueError, match="int2_g32_asym given twice"):
    cache_kinds(settings, "int2_g32_asym", ["int2_g32_asym"])
  with pytest.raises(ValueError, match="nope"):
    cache_kinds(settings, "int2_g32_asym", ["nope"])


def test_encode_prompt_applies_the_chat_template():
  tok = tiny_hf_model.train_tokenizer()
  chatml = TextTokenizer(tok, bos_id=1, eos_id=2,
                         chat_template="{{ '<|im_start|>' }}")
  ids, family, stop = runner.encode_prompt(chatml, "the cat", True)
  assert family == "ChatML" and stop is None  # No <|im_end|> in this vocab.
  assert ids == chatml.encode(
      "<|im_start|>user\nthe cat<|im_end|>\n<|im_start|>assistant\n")
  assert runner.encode_prompt(chatml, "the cat", False) == (
      chatml.encode("the cat"), None, None)
  with pytest.raises(ValueError, match="chat_template is missing"):
    runner.encode_prompt(TextTokenizer(tok, bos_id=1, eos_id=2), "hi", True)


def test_run_baseline_is_the_models_greedy_decode(tmp_path, monkeypatch,
                                                  capsys):
  monkeypatch.setenv("KVQ_JAX_CACHE", str(tmp_path / "cache"))
  config = _PresetParser(name="config").parse("int2_g32_asym")
  config.model = str(tiny_hf_model.write_tiny_model(tmp_path / "model"))
  [comparison] = runner.run(
      config, ["the cat sat on the"], config_name="int2_g32_asym",
      max_new_tokens=6)
  out = capsys.readouterr().out
  base, quant = comparison.continuations
  assert (base.kind.name, quant.kind.name) == ("baseline", "int2_g32_asym")
  for name in ("baseline", "int2_g32_asym"):
    assert f"--- {name}: " in out and f"| {name} | " in out
  assert comparison.chat_family is None and comparison.stop_id == 2
  # Greedy: every new token is the argmax of a full-precision forward pass
  # over the prompt and the tokens before it (one pass, no decode steps).
  model = kvq_jax.load_model(config.model)
  prompt = list(comparison.prompt_ids)
  assert prompt == model.tokenizer.encode("the cat sat on the")
  logits = kvq_jax.forward_logits(model, [prompt + list(base.new_ids)])
  argmax = logits[0].argmax(-1)
  np.testing.assert_array_equal(argmax[len(prompt) - 1:len(prompt) - 1
                                       + len(base.new_ids)], base.new_ids)
  # Bytes are the leaves of the caches decoded with: per layer K and V
  # [1, 256, K, H] float32 (256 slots: one int2 block) and an int32 length.
  assert comparison.capacity == 256
  m = tiny_hf_model
  assert base.cache_bytes == m.L * (2 * 256 * m.K * m.H * 4 + 4)
  assert 0 < quant.cache_bytes < base.cache_bytes / 8
  assert base.bits_per_element == 32.0 and quant.bits_per_element == 3.0


def test_prompt_longer_than_the_model_fails_before_compiling(tmp_path,
                                                            monkeypatch):
  def never(*args, **kwargs):
    raise AssertionError("decoded a prompt the model cannot position")
  monkeypatch.setattr(runner, "continue_prompt", never)
  monkeypatch.setenv("KVQ_JAX_CACHE", str(tmp_path / "cache"))
  config = _PresetParser(name="config").parse("int2_g32_asym")
  config.model = str(tiny_hf_model.write_tiny_model(tmp_path / "model"))
  long_prompt = "the cat sat on the mat " * 200  # > 512 tokens.
  with pytest.raises(ValueError, match=r"prompt 2 \(\d+ tokens\) with "
                     r"--max_new_tokens=8: \d+ tokens exceed the model's "
                     r"max_position_embeddings=512"):
    runner.run(config, ["a short one", long_prompt],
               config_name="int2_g32_asym", max_new_tokens=8)
