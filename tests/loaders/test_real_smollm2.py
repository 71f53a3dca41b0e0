"""The real SmolLM2-135M-Instruct Q4_1 GGUF (downloaded once, ~93 MB)."""

from __future__ import annotations

import pytest

from kvq_jax import assets
from kvq_jax import loaders

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", name="path")
def _path():
  return assets.resolve_model("smollm2-135m")


def test_tokenizer_ids(path):
  tok = loaders.load_gguf_tokenizer(path)
  # Ids cross-checked against an independent pure-Python byte-level BPE over
  # the file's merges with llama.cpp's smollm pre-tokenization.
  assert tok.encode("Hello") == [19556]
  assert tok.encode("Hello world 2024") == [19556, 905, 216, 34, 32, 34, 36]
  assert tok.encode("<|im_start|>user\nHi<|im_end|>\n") == [
      1, 4093, 198, 26843, 2, 198]
  assert (tok.bos_id, tok.eos_id, tok.add_bos) == (1, 2, False)
  prompt = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
  assert prompt.startswith("<|im_start|>system\nYou are a helpful AI "
                           "assistant named SmolLM")
  assert prompt.endswith("<|im_start|>user\nHi<|im_end|>\n"
                         "<|im_start|>assistant\n")
  for text in ["Hello world", " = Valkyria Chronicles III = \n",
               "Senjō no Valkyria 3 : 戦場のヴァルキュリア3 , lit ."]:
    assert tok.decode(tok.encode(text)) == text


def test_config_and_shapes(path):
  config, params, _ = loaders.load_checkpoint(path)
  assert (config.vocab_size, config.hidden_size, config.intermediate_size,
          config.num_layers, config.num_heads, config.num_kv_heads,
          config.head_dim) == (49152, 576, 1536, 30, 9, 3, 64)
  assert config.rope_theta == 100000.0 and config.rms_norm_eps == 1e-5
  assert config.tie_embeddings and "lm_head" not in params
  assert params["layers"][29]["k"]["kernel"].shape == (576, 192)
