"""A tiny Hugging Face checkpoint directory with a real tokenizer.json.

`write_tiny_model(directory)` writes config.json, model.safetensors (random
llama weights: V=64, D=64, F=128, N=2 query heads, K=1 KV head, H=32, L=2),
tokenizer.json (a BPE trained with the `tokenizers` library on `SENTENCES`,
at most V tokens) and tokenizer_config.json. `write_eval_text(path)` writes
a text that tokenizes to a few hundred tokens. `calibration_preset` points
a preset at both, for the calibration tools' end-to-end tests.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import safetensors.numpy
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from kvq_jax.sweep.points import load_preset

V, D, F, N, K, H, L = 64, 64, 128, 2, 1, 32, 2

SENTENCES = (
    "the cat sat on the mat and the dog sat on the log.",
    "a quick brown fox jumps over the lazy dog.",
    "we measure the perplexity of a tiny model on a tiny text.",
    "keys and values are stored in a cache, one row per token.",
)
SPECIALS = ["<unk>", "<s>", "</s>"]


def train_tokenizer() -> Tokenizer:
  tok = Tokenizer(models.BPE(unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  tok.decoder = decoders.BPEDecoder()
  trainer = trainers.BpeTrainer(vocab_size=V, special_tokens=SPECIALS,
                                show_progress=False)
  tok.train_from_iterator(list(SENTENCES), trainer)
  if tok.get_vocab_size() > V:
    raise AssertionError(f"tiny tokenizer has {tok.get_vocab_size()} > {V}")
  return tok


def random_weights(seed: int = 0, scale: float = 0.1) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(seed)
  r = lambda *shape: (scale * rng.standard_normal(shape)).astype(np.float32)  # noqa: E731
  w = {"model.embed_tokens.weight": r(V, D),
       "model.norm.weight": 1.0 + r(D)}
  for i in range(L):
    p = f"model.layers.{i}"
    w[f"{p}.input_layernorm.weight"] = 1.0 + r(D)
    w[f"{p}.post_attention_layernorm.weight"] = 1.0 + r(D)
    w[f"{p}.self_attn.q_proj.weight"] = r(N * H, D)
    w[f"{p}.self_attn.k_proj.weight"] = r(K * H, D)
    w[f"{p}.self_attn.v_proj.weight"] = r(K * H, D)
    w[f"{p}.self_attn.o_proj.weight"] = r(D, N * H)
    w[f"{p}.mlp.gate_proj.weight"] = r(F, D)
    w[f"{p}.mlp.up_proj.weight"] = r(F, D)
    w[f"{p}.mlp.down_proj.weight"] = r(D, F)
  return {k: v.astype(np.float32) for k, v in w.items()}


def write_tiny_model(directory: pathlib.Path, seed: int = 0) -> pathlib.Path:
  directory.mkdir(parents=True, exist_ok=True)
  config = {
      "model_type": "llama", "vocab_size": V, "hidden_size": D,
      "intermediate_size": F, "num_hidden_layers": L,
      "num_attention_heads": N, "num_key_value_heads": K,
      "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
      "tie_word_embeddings": True, "max_position_embeddings": 512,
      "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
  }
  (directory / "config.json").write_text(json.dumps(config))
  safetensors.numpy.save_file(random_weights(seed),
                              str(directory / "model.safetensors"))
  train_tokenizer().save(str(directory / "tokenizer.json"))
  (directory / "tokenizer_config.json").write_text(json.dumps(
      {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": False}))
  return directory


def write_eval_text(path: pathlib.Path, repeats: int = 6) -> pathlib.Path:
  path.write_text("\n".join(SENTENCES * repeats) + "\n", encoding="utf-8")
  return path


def calibration_preset(tmp_path: pathlib.Path, preset: str):
  """(preset `preset` on a tiny model in tmp_path: 2 evaluation windows of
  32 tokens, no key statistics; the path of its eval text)."""
  config = load_preset(preset)
  config.model = str(write_tiny_model(tmp_path / "model"))
  config.eval.window_len = 32
  config.eval.num_windows = 2
  config.cache.key_stats = ""
  return config, str(write_eval_text(tmp_path / "eval.txt"))
