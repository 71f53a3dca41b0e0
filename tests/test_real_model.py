"""The real SmolLM2-135M-Instruct (Q4_1 GGUF, fetched once, ~93 MB)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

import kvq_jax
from kvq_jax import assets
from kvq_jax.experiment.memory import num_params
from kvq_jax.models.generate import generate
from tests import real_wikitext

pytestmark = pytest.mark.slow



@pytest.fixture(scope="module")
def model():
  return kvq_jax.load_model("smollm2-135m")


def test_tokenizer(model):
  assert model.tokenizer.encode("Hello") == [19556]


def test_num_params_matches_gguf_tensors(model):
  reader = gguf.GGUFReader(str(assets.resolve_model("smollm2-135m")))
  total = sum(int(np.prod(t.shape)) for t in reader.tensors)
  assert total == num_params(model.config) == 134_515_008


def test_wikitext2_baseline_perplexity_is_pinned(model):
  """4 windows of 512, second-half scoring, float32: a golden value.

  Measured once with this code on a 2-core CPU (22.743698719625478, about
  2e-6 relative from either rounding boundary of the 4th decimal).
  """
  windows = real_wikitext.first_windows(model)
  # " \n", " =", " Robert", " B": the test file's first tokens.
  assert windows[0, :4].tolist() == [3717, 446, 6356, 389]
  ppl = real_wikitext.baseline_ppl(model, windows)
  assert round(ppl, 4) == 22.7437, ppl


def test_greedy_chat_answer_is_english(model):
  tok = model.tokenizer
  prompt = tok.apply_chat_template(
      [{"role": "user", "content": "What is the capital of France?"}])
  # generate() expects `tokenizer.encode(text).ids` (a tokenizers.Tokenizer);
  # TextTokenizer.encode returns a list, so the prompt goes in as ids.
  out = generate(model.decoder, tok, tok.encode(prompt), 24)
  text = out.text
  letters = [c for c in text if c.isalpha()]
  assert len(letters) >= 10, text
  assert sum(c.isascii() for c in letters) / len(letters) > 0.9, text
  assert "Paris" in text, text
